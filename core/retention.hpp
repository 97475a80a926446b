// Retention (docs/design.md §12): which sessions to forget when a budget is exceeded. Pure: the
// caller gathers the facts (sizes on disk, which sessions are in use) and carries out the
// decisions (remove manifests, and files where kvpersist owns them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::core {

// How many sessions without a snapshot a server remembers (slot_pool_options): as many as
// retention.maxSessions, or this many when that is 0 (no limit on snapshots).
inline constexpr std::size_t default_record_limit = 1000;
inline std::size_t record_limit(std::size_t max_sessions) {
  return max_sessions > 0 ? max_sessions : default_record_limit;
}

struct retention_limits {
  std::uint64_t max_total_bytes = 0;  // 0: no limit (unknown sizes count as 0)
  std::size_t max_sessions = 0;       // 0: no limit
  int max_age_days = 0;               // 0: no limit
  std::size_t max_sessions_per_credential = 0;  // 0: no separate cap
  std::uint64_t max_bytes_per_credential = 0;    // 0: no separate cap
};

// One session with a snapshot.
struct retention_entry {
  std::string hash;
  bool invalid = false;
  std::int64_t updated_s = 0;  // last save, restore or invalidation, seconds since the epoch
  std::uint64_t bytes = 0;     // its files on disk (0 when kvpersist cannot see them)
  bool in_use = false;         // owns a slot or is being prepared on one: never forgotten
  std::string credential;      // credential_key() of its requests ("" without one)
  std::uint64_t last_file_bytes = 0;  // its last snapshot's file (the manifest's `bytes`)
};

// The room a disk budget keeps for a snapshot llama-server has yet to write, whose size
// kvpersist learns only after it is written (docs/design.md §12, "Disk budget"): as large as
// the largest last_file_bytes of the credential that will write it, among the entries kept.
struct retention_room {
  bool per_credential = false;  // each credential's share less its own room
  // Whose save the whole budget keeps room for; none: no room in the whole budget.
  std::optional<std::string> saver;
};

struct retention_eviction {
  std::string hash;
  std::uint64_t bytes = 0;
  std::string_view why;  // "age", "credential", "sessions" or "bytes"
};

struct retention_plan {
  std::vector<retention_eviction> evict;  // in the order to carry out
  std::size_t remaining_sessions = 0;
  std::uint64_t remaining_bytes = 0;
};

// Which entries not in use to forget, in this order:
// - every one older than max_age_days ("age");
// - a credential holding more than max_sessions_per_credential sessions, or more than
//   max_bytes_per_credential bytes, loses its own, invalid first, then the least recently
//   updated ("credential"); what is in use counts and stays;
// - while max_sessions or max_total_bytes is exceeded: an invalid snapshot first (the least
//   recently updated), else the least recently updated session of the credential that holds
//   the most sessions, or bytes for the byte budget (ties: the one whose candidate is older,
//   then by hash), so that a tenant that churns sessions evicts its own ("sessions", "bytes").
// With one credential this is the least recently updated first, invalid before valid.
// `room`: the byte budgets are checked less the room it names.
retention_plan plan_retention(std::vector<retention_entry> entries, const retention_limits& limits,
                              std::int64_t now_s, const retention_room& room = {});

// Seconds since the epoch of an RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SSZ"; 0 if malformed.
std::int64_t parse_utc(std::string_view s);

}  // namespace kvp::core
