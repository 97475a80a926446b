#include "core/prefix_snapshot.hpp"

#include <algorithm>

#include "core/identity.hpp"

namespace kvp::core {

std::string prefix_key(std::string_view credential, const chain_link& last) {
  return std::string(credential) + ';' + to_hex(last);
}

std::optional<seed_candidate> fewest_bytes_seed(const std::vector<seed_candidate>& candidates) {
  const seed_candidate* best = nullptr;
  for (const auto& c : candidates) {
    if (!best || c.common > best->common || (c.common == best->common && c.bytes < best->bytes))
      best = &c;
  }
  if (!best) return std::nullopt;
  return *best;
}

bool worth_prefix_snapshot(std::uint64_t restored_tokens, std::uint64_t reused_tokens) {
  if (restored_tokens == 0) return false;
  return static_cast<double>(reused_tokens) <
         prefix_worth_below * static_cast<double>(restored_tokens);
}

std::string prefix_session_id(const chain_link& last) {
  return std::string(own_session_id_head) + to_hex(last);
}

bool is_prefix_session(std::string_view session_id) {
  return session_id.starts_with(own_session_id_head);
}

prefix_wishes::prefix_wishes(std::size_t max_pending, std::size_t max_known)
    : max_pending_(std::max<std::size_t>(max_pending, 1)),
      max_known_(std::max<std::size_t>(max_known, 1)) {}

bool prefix_wishes::note_seed(const std::string& credential, const std::string& donor,
                              std::size_t donor_links, std::uint64_t restored,
                              std::uint64_t reused, const std::vector<chain_link>& request_chain,
                              std::size_t common) {
  if (common == 0 || common > request_chain.size() || common >= donor_links) return false;
  if (!worth_prefix_snapshot(restored, reused) || pending_.size() >= max_pending_) return false;
  const chain_link& last = request_chain[common - 1];
  auto key = prefix_key(credential, last);
  if (known(key)) return false;
  remember(std::move(key));
  pending_.push_back(prefix_wish{credential, donor, restored,
                                 {request_chain.begin(),
                                  request_chain.begin() + static_cast<std::ptrdiff_t>(common)}});
  return true;
}

void prefix_wishes::note_made(const std::string& credential, const chain_link& last) {
  auto key = prefix_key(credential, last);
  if (!known(key)) remember(std::move(key));
}

std::optional<prefix_wish> prefix_wishes::take() {
  if (pending_.empty()) return std::nullopt;
  prefix_wish w = std::move(pending_.front());
  pending_.erase(pending_.begin());
  return w;
}

void prefix_wishes::drop_donor(const std::string& donor) {
  std::erase_if(pending_, [&](const prefix_wish& w) {
    if (w.donor != donor) return false;
    forget(prefix_key(w.credential, w.links.back()));  // nothing was tried: another seed may ask
    return true;
  });
}

bool prefix_wishes::known(const std::string& key) const { return known_.contains(key); }

void prefix_wishes::forget(const std::string& key) {
  if (known_.erase(key) == 0) return;
  std::erase(known_order_, key);
}

void prefix_wishes::remember(std::string key) {
  if (known_order_.size() >= max_known_) {
    known_.erase(known_order_.front());
    known_order_.pop_front();
  }
  known_.insert(key);
  known_order_.push_back(std::move(key));
}

}  // namespace kvp::core
