// Circuit breaker for persistence (docs/design.md §13): consecutive management-call failures open it
// for a cooldown; then one half-open trial decides. Inference is never gated by it.
#pragma once

#include <chrono>
#include <string_view>

namespace kvp::core {

class breaker {
 public:
  using clock = std::chrono::steady_clock;
  enum class state { closed, open, half_open };

  breaker(int max_failures, std::chrono::milliseconds cooldown)
      : max_failures_(max_failures), base_cooldown_(cooldown), cooldown_(cooldown) {}

  // Whether a management call may be attempted now. An open breaker whose cooldown has
  // elapsed turns half-open and allows exactly one trial until its outcome is reported.
  bool allow(clock::time_point now);
  // Outcome of an attempted call. Success closes; failure counts, and a failed half-open
  // trial reopens with the cooldown doubled (at most 16x the configured one).
  // Return true when this report changed the state (for the circuit_open/recovered logs).
  bool on_success();
  bool on_failure(clock::time_point now);

  state current() const { return state_; }
  int consecutive_failures() const { return failures_; }

 private:
  int max_failures_;
  std::chrono::milliseconds base_cooldown_;
  std::chrono::milliseconds cooldown_;
  state state_ = state::closed;
  int failures_ = 0;
  clock::time_point open_until_{};
  bool trial_in_flight_ = false;
};

std::string_view to_string(breaker::state s);

}  // namespace kvp::core
