// llama-server's sleep mode as /props shows it (docs/design.md §4 "Learning the sleep period",
// docs/llama-server.md §11): whether a look at is_sleeping changed anything, and what a sleep
// seen teaches about the server's sleep period when upstream.sleepIdleSeconds is not set. Pure:
// proxy/control/sleep_tracker.cpp reads /props, feeds the answers here with the time, and
// applies and logs what comes back. Thread safety: none (one per coordinator, on its strand).
#pragma once

#include <chrono>
#include <optional>

namespace kvp::core {

// What a /props answer's is_sleeping changed.
struct sleep_change {
  enum class action { none, woke, fell_asleep };
  action what = action::none;
  // fell_asleep without a configured period: a shorter period than the one learned, to
  // adopt (0: nothing new).
  std::chrono::seconds learn{0};
};

class sleep_watch {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // `configured`: upstream.sleepIdleSeconds (0: not set, the period is learned).
  explicit sleep_watch(std::chrono::seconds configured = std::chrono::seconds(0))
      : configured_(configured) {}

  // /props said `sleeping` at `now`; `last_use`: when kvpersist last used the server (the
  // end of a request or a slot list read), nullopt before any.
  sleep_change note_sleeping(bool sleeping, time_point now, std::optional<time_point> last_use);
  void learn_sleep_period(std::chrono::seconds period) { learned_ = period; }
  // upstream.sleepIdleSeconds, else the learned period (0: the server is not known to sleep).
  std::chrono::seconds sleep_period() const {
    return configured_.count() > 0 ? configured_ : learned_;
  }
  bool sleep_configured() const { return configured_.count() > 0; }

 private:
  // The period a sleep seen at `now` implies, at the least (0 when it cannot tell).
  std::chrono::seconds measure_sleep_period(time_point now,
                                            std::optional<time_point> last_use) const;

  std::chrono::seconds configured_{0};
  bool server_sleeping_ = false;  // /props said is_sleeping
  // The longest idle time (since the last use) at which /props said llama-server was awake.
  std::chrono::steady_clock::duration longest_awake_idle_{};
  std::chrono::seconds learned_{0};  // the sleep period seen (no configured period)
};

}  // namespace kvp::core
