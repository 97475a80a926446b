// Retention (docs/design.md §12): which sessions to forget when a budget is exceeded. Pure: the
// caller gathers the facts (sizes on disk, which sessions are in use) and carries out the
// decisions (remove manifests, and files where kvpersist owns them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::core {

struct retention_limits {
  std::uint64_t max_total_bytes = 0;  // 0: no limit (unknown sizes count as 0)
  std::size_t max_sessions = 0;       // 0: no limit
  int max_age_days = 0;               // 0: no limit
};

// One session with a snapshot.
struct retention_entry {
  std::string hash;
  bool invalid = false;
  std::int64_t updated_s = 0;  // last save or invalidation, seconds since the epoch
  std::uint64_t bytes = 0;     // its files on disk (0 when kvpersist cannot see them)
  bool in_use = false;         // owns a slot or is being prepared on one: never forgotten
};

struct retention_eviction {
  std::string hash;
  std::uint64_t bytes = 0;
  std::string_view why;  // "age", "sessions" or "bytes"
};

struct retention_plan {
  std::vector<retention_eviction> evict;  // in the order to carry out
  std::size_t remaining_sessions = 0;
  std::uint64_t remaining_bytes = 0;
};

// Invalid snapshots go first, then the least recently updated (ties: by hash). Each entry
// not in use is forgotten while any limit is exceeded or it is older than max_age_days.
retention_plan plan_retention(std::vector<retention_entry> entries, const retention_limits& limits,
                              std::int64_t now_s);

// Seconds since the epoch of an RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SSZ"; 0 if malformed.
std::int64_t parse_utc(std::string_view s);

}  // namespace kvp::core
