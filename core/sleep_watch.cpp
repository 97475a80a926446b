#include "core/sleep_watch.hpp"

#include <algorithm>

namespace kvp::core {

sleep_change sleep_watch::note_sleeping(bool sleeping, time_point now,
                                        std::optional<time_point> last_use) {
  if (!sleeping && last_use && now > *last_use)
    longest_awake_idle_ = std::max(longest_awake_idle_, now - *last_use);
  sleep_change c;
  if (sleeping == server_sleeping_) return c;
  server_sleeping_ = sleeping;
  if (!sleeping) {
    c.what = sleep_change::action::woke;
    return c;
  }
  c.what = sleep_change::action::fell_asleep;
  if (sleep_configured()) return c;
  const auto period = measure_sleep_period(now, last_use);
  if (period.count() > 0 && (learned_.count() == 0 || period < learned_))
    c.learn = period;
  return c;
}

// docs/design.md §4 "Learning the sleep period": every look that found llama-server awake
// proves its period longer than the idle time then, and a look that finds it asleep bounds
// the period by the idle time now. The largest lower bound is adopted when it is at least a
// second (a checkpoint too early costs a save, one too late loses the session); else only
// the upper bound is known. 0: nothing to measure from.
std::chrono::seconds sleep_watch::measure_sleep_period(time_point now,
                                                       std::optional<time_point> last_use) const {
  using std::chrono::duration_cast;
  using std::chrono::seconds;
  const auto lower = duration_cast<seconds>(longest_awake_idle_);
  if (lower.count() >= 1) return lower;
  return last_use ? duration_cast<seconds>(now - *last_use) : seconds(0);
}

}  // namespace kvp::core
