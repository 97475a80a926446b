#include "core/session_records.hpp"

#include <algorithm>
#include <utility>

namespace kvp::core {

namespace {

// Revisions compare as serial numbers (RFC 1982): `a` is after `b` when it is less than 2^63
// steps ahead, so a counter that wraps past 2^64-1 still reads as newer than the saved one.
bool rev_after(std::uint64_t a, std::uint64_t b) { return static_cast<std::int64_t>(a - b) > 0; }
std::uint64_t rev_latest(std::uint64_t a, std::uint64_t b) { return rev_after(a, b) ? a : b; }

}  // namespace

bool session_record::dirty() const { return rev_after(dirty_rev, saved_rev); }

session_records::session_records(std::size_t max_without_snapshot)
    : max_without_snapshot_(max_without_snapshot) {}

session_record* session_records::find(const std::string& hash) {
  auto it = records_.find(hash);
  return it == records_.end() ? nullptr : &it->second;
}

const session_record* session_records::find(const std::string& hash) const {
  auto it = records_.find(hash);
  return it == records_.end() ? nullptr : &it->second;
}

bool session_records::dirty(const std::string& hash) const {
  const auto* r = hash.empty() ? nullptr : find(hash);
  return r && r->dirty();
}

session_record& session_records::touch(const std::string& hash, std::string_view session_id,
                                       const std::function<bool(const std::string&)>& in_use) {
  auto [it, fresh] = records_.try_emplace(hash);
  auto& r = it->second;
  if (r.session_id.empty()) r.session_id = std::string(session_id);
  r.last_used = ++clock_;
  if (fresh) forget_least_recent(hash, in_use);
  return r;
}

// docs/design.md §12: records without a snapshot beyond the bound go, the least recently used
// first. One that a slot holds or is being prepared for stays (so does `keep`, the record just
// made): nothing a resident or leased session needs is dropped.
void session_records::forget_least_recent(const std::string& keep,
                                          const std::function<bool(const std::string&)>& in_use) {
  if (records_.size() <= max_without_snapshot_) return;
  std::vector<std::pair<std::uint64_t, const std::string*>> idle;
  std::size_t without = 0;
  for (const auto& [h, r] : records_) {
    if (r.snapshot) continue;
    ++without;
    if (h != keep && !in_use(h)) idle.emplace_back(r.last_used, &h);
  }
  if (without <= max_without_snapshot_) return;
  const auto n =
      static_cast<std::ptrdiff_t>(std::min(without - max_without_snapshot_, idle.size()));
  std::partial_sort(idle.begin(), idle.begin() + n, idle.end());
  std::vector<std::string> victims;
  for (auto it = idle.begin(); it != idle.begin() + n; ++it) victims.push_back(*it->second);
  for (auto& h : victims) {
    forget(h);
    forgotten_.push_back(std::move(h));
  }
}

void session_records::add_manifest(manifest m) {
  auto [it, fresh] = records_.try_emplace(m.session_hash);
  auto& r = it->second;
  r.session_id = m.session_id;
  if (r.credential.empty()) r.credential = m.credential;
  if (m.state == snapshot_state::ready)
    r.saved_rev = r.dirty_rev = fresh ? m.revision : rev_latest(r.dirty_rev, m.revision);
  set_snapshot(it->first, r, std::move(m));
}

session_record& session_records::store_manifest(const manifest& m) {
  auto& r = records_[m.session_hash];
  if (r.session_id.empty()) r.session_id = m.session_id;
  // A commit may land after its session's record was forgotten (it owned no slot any more).
  if (r.credential.empty()) r.credential = m.credential;
  if (m.state == snapshot_state::ready) r.saved_rev = rev_latest(r.saved_rev, m.revision);
  set_snapshot(m.session_hash, r, m);
  return r;
}

// Every change of a session's snapshot goes through here, so the chain index stays current.
void session_records::set_snapshot(const std::string& hash, session_record& r, manifest m) {
  if (m.state == snapshot_state::ready)
    index_.put(hash, m.chain);
  else
    index_.erase(hash);
  r.snapshot = std::move(m);
}

std::optional<manifest> session_records::invalidate(const std::string& hash, errc reason,
                                                    std::string_view wall_now,
                                                    std::string_view note) {
  auto* r = find(hash);
  if (!r || !r->snapshot) return std::nullopt;
  auto& m = *r->snapshot;
  m.state = snapshot_state::invalid;
  m.invalid_reason = std::string(to_string(reason));
  m.invalid_note = std::string(note.substr(0, manifest::max_note_bytes));
  m.updated_at = std::string(wall_now);
  return m;
}

bool session_records::forget(const std::string& hash) {
  index_.erase(hash);
  return records_.erase(hash) > 0;
}

std::vector<std::string> session_records::take_forgotten() { return std::exchange(forgotten_, {}); }

const manifest* session_records::find_manifest(const std::string& hash) const {
  const auto* r = find(hash);
  return r && r->snapshot ? &*r->snapshot : nullptr;
}

std::vector<manifest> session_records::manifests() const {
  std::vector<manifest> out;
  for (const auto& [h, r] : records_)
    if (r.snapshot) out.push_back(*r.snapshot);
  return out;
}

std::vector<std::string> session_records::hashes_after(std::string_view after,
                                                       std::size_t n) const {
  std::vector<const std::string*> keys;
  for (const auto& [h, r] : records_)
    if (h > after) keys.push_back(&h);
  auto by_hash = [](const std::string* a, const std::string* b) { return *a < *b; };
  if (keys.size() > n) {
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end(), by_hash);
    keys.resize(n);
  }
  std::sort(keys.begin(), keys.end(), by_hash);
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto* k : keys) out.push_back(*k);
  return out;
}

}  // namespace kvp::core
