#include "core/session_listing.hpp"

#include <utility>

namespace kvp::core {

std::optional<session_view> session_listing::session(const std::string& hash) const {
  const session_record* r = records_.find(hash);
  if (!r) return std::nullopt;
  session_view v;
  v.hash = hash;
  v.session_id = r->session_id;
  v.slot = table_.slot_of(hash);
  v.resident = v.slot >= 0 && table_.state(v.slot) != slot_state::unknown;
  v.dirty = r->dirty() && v.resident;
  v.snapshot = r->snapshot ? &*r->snapshot : nullptr;
  v.reuse = r->reuse;
  v.credential = r->credential;
  return v;
}

std::vector<session_view> session_listing::sessions() const {
  std::vector<session_view> out;
  for (const auto& [h, r] : records_.all()) {
    auto v = session(h);
    if (v) out.push_back(std::move(*v));
  }
  return out;
}

std::vector<session_view> session_listing::sessions_after(std::string_view after,
                                                          std::size_t n) const {
  std::vector<session_view> out;
  for (const auto& h : records_.hashes_after(after, n)) out.push_back(*session(h));
  return out;
}

std::vector<retention_entry> session_listing::retention_entries() const {
  std::vector<retention_entry> out;
  for (const auto& [h, r] : records_.all()) {
    if (!r.snapshot) continue;
    out.push_back({h, r.snapshot->state == snapshot_state::invalid,
                   parse_utc(r.snapshot->updated_at), r.snapshot->disk_bytes(),
                   table_.in_use(h), r.credential, r.snapshot->bytes});
  }
  return out;
}

}  // namespace kvp::core
