#include "core/breaker.hpp"

#include <algorithm>

namespace kvp::core {

bool breaker::allow(clock::time_point now) {
  switch (state_) {
    case state::closed: return true;
    case state::open:
      if (now < open_until_) return false;
      state_ = state::half_open;
      trial_in_flight_ = true;
      return true;
    case state::half_open:
      if (trial_in_flight_) return false;
      trial_in_flight_ = true;
      return true;
  }
  return false;
}

bool breaker::on_success() {
  const bool changed = state_ != state::closed;
  state_ = state::closed;
  failures_ = 0;
  cooldown_ = base_cooldown_;
  trial_in_flight_ = false;
  return changed;
}

bool breaker::on_failure(clock::time_point now) {
  ++failures_;
  trial_in_flight_ = false;
  if (state_ == state::half_open) {
    cooldown_ = std::min(cooldown_ * 2, base_cooldown_ * 16);
    state_ = state::open;
    open_until_ = now + cooldown_;
    return false;  // was already "not closed"; the reopen is not a new outage
  }
  if (state_ == state::closed && failures_ >= max_failures_) {
    state_ = state::open;
    open_until_ = now + cooldown_;
    return true;
  }
  return false;
}

std::string_view to_string(breaker::state s) {
  switch (s) {
    case breaker::state::closed: return "closed";
    case breaker::state::open: return "open";
    case breaker::state::half_open: return "half_open";
  }
  return "closed";
}

}  // namespace kvp::core
