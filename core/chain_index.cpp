#include "core/chain_index.hpp"

#include <algorithm>
#include <cstring>

namespace kvp::core {

std::size_t chain_index::link_hash::operator()(const chain_link& l) const noexcept {
  std::size_t h;  // the link is already a hash: its first bytes are as good as any
  std::memcpy(&h, l.data(), sizeof h);
  return h;
}

void chain_index::put(const std::string& hash, const std::vector<chain_link>& chain) {
  erase(hash);
  if (chain.empty()) return;
  auto& mine = chains_[hash];
  mine.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(
                                                  std::min(chain.size(), max_chain_links)));
  for (const auto& l : mine) holders_[l].push_back(hash);
  enders_[mine.back()].push_back(hash);
}

void chain_index::remove_from(
    std::unordered_map<chain_link, std::vector<std::string>, link_hash>& m, const chain_link& l,
    const std::string& hash) {
  const auto h = m.find(l);
  if (h == m.end()) return;
  std::erase(h->second, hash);
  if (h->second.empty()) m.erase(h);
}

void chain_index::erase(const std::string& hash) {
  const auto it = chains_.find(hash);
  if (it == chains_.end()) return;
  for (const auto& l : it->second) remove_from(holders_, l, hash);
  remove_from(enders_, it->second.back(), hash);
  chains_.erase(it);
}

std::optional<chain_index::match> chain_index::longest(
    const std::vector<chain_link>& chain, std::size_t min_common,
    const std::function<bool(const std::string&)>& accept) const {
  const std::size_t n = std::min(chain.size(), max_chain_links);
  for (std::size_t i = n; i > 0 && i >= min_common; --i) {
    const auto it = holders_.find(chain[i - 1]);
    if (it == holders_.end()) continue;
    for (auto h = it->second.rbegin(); h != it->second.rend(); ++h)
      if (accept(*h)) return match{*h, i};
  }
  return std::nullopt;
}

std::vector<chain_index::match> chain_index::all_longest(
    const std::vector<chain_link>& chain, std::size_t min_common,
    const std::function<bool(const std::string&)>& accept, std::size_t max_others) const {
  std::vector<match> out;
  const std::size_t n = std::min(chain.size(), max_chain_links);
  for (std::size_t i = n; i > 0 && i >= min_common && out.empty(); --i) {
    const auto it = holders_.find(chain[i - 1]);
    if (it == holders_.end()) continue;
    const auto ends = enders_.find(chain[i - 1]);
    if (ends != enders_.end())
      for (auto h = ends->second.rbegin(); h != ends->second.rend(); ++h)
        if (accept(*h)) out.push_back(match{*h, i});
    std::size_t others = 0;
    for (auto h = it->second.rbegin(); h != it->second.rend() && others < max_others; ++h) {
      if (chains_.at(*h).size() == i || !accept(*h)) continue;
      out.push_back(match{*h, i});
      ++others;
    }
  }
  return out;
}

}  // namespace kvp::core
