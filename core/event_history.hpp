// The last few hundred structured log events, in memory, for the admin dashboard's live feed
// (GET /kv/events). core::log records every event at info level or above here, whatever the
// configured log level and sink. Entries hold the JSON rendering, so they carry exactly what
// the log carries: abbreviated session hashes, never session ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace kvp::core {

class event_history {
 public:
  static constexpr std::size_t capacity = 200;

  struct entry {
    std::uint64_t seq = 0;  // 1, 2, ... in recording order
    std::string event;      // "kv.session.save.success"
    std::string json;       // one object: {"ts","level","event",fields...}
  };

  // Thread-safe: coordinators on several threads record while the admin server reads.
  void record(std::string event, std::string json);
  // The kept entries with seq > `after`, oldest first.
  std::vector<entry> since(std::uint64_t after) const;
  // The seq of the newest entry ever recorded (0: none yet).
  std::uint64_t last_seq() const;

 private:
  mutable std::mutex mu_;
  std::deque<entry> ring_;
  std::uint64_t last_seq_ = 0;
};

// The process's history, fed by core::log.
event_history& recent_events();

}  // namespace kvp::core
