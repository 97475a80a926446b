// The sessions as the admin API, the dashboard and retention see them (README "Admin API",
// docs/design.md §12): each session's record with where it is resident, read from the session
// records and the slot table together. Read-only.
//
// A view over both (core/pool_state.hpp): cheap to make, it holds references and lives no
// longer than the pool. Thread safety: none; calls are made on the server's strand.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/manifest.hpp"
#include "core/retention.hpp"
#include "core/session_records.hpp"
#include "core/slot_table.hpp"

namespace kvp::core {

struct session_view {
  std::string hash;
  std::string session_id;
  bool resident = false;
  bool dirty = false;
  int slot = -1;
  const manifest* snapshot = nullptr;
  session_reuse reuse;
  std::string credential;  // credential_key() of its requests (of its manifest before any)
};

class session_listing {
 public:
  session_listing(const session_records& records, const slot_table& table)
      : records_(records), table_(table) {}

  std::optional<session_view> session(const std::string& hash) const;
  std::vector<session_view> sessions() const;
  // The first `n` sessions whose hash is greater than `after`, in hash order (a listing page).
  std::vector<session_view> sessions_after(std::string_view after, std::size_t n) const;
  // Every session with a snapshot, for retention, its bytes both generations as its manifest
  // records them (shared-filesystem mode replaces them with the sizes on disk), with the
  // credential of its requests (of its manifest when it has made none here).
  std::vector<retention_entry> retention_entries() const;

 private:
  const session_records& records_;
  const slot_table& table_;
};

}  // namespace kvp::core
