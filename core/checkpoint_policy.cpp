#include "core/checkpoint_policy.hpp"

#include <algorithm>

namespace kvp::core {

checkpoint_policy::checkpoint_policy(const slot_pool_options& opts) : opts_(opts) {}

bool checkpoint_policy::saves_at_end(bool turn_end) const {
  return opts_.save_on_step_end || (opts_.save_on_turn_end && turn_end);
}

void checkpoint_policy::note_turn(const std::string& hash, steady_time now) {
  std::erase_if(recent_turns_,
                [&](const auto& kv) { return now - kv.second > opts_.contention_window; });
  if (recent_turns_.size() >= max_recent_turns && !recent_turns_.contains(hash)) {
    auto oldest = std::min_element(recent_turns_.begin(), recent_turns_.end(),
                                   [](const auto& a, const auto& b) { return a.second < b.second; });
    recent_turns_.erase(oldest);
  }
  recent_turns_[hash] = now;
}

bool checkpoint_policy::contended(steady_time now, std::size_t session_slots) const {
  const auto recent = std::count_if(recent_turns_.begin(), recent_turns_.end(), [&](const auto& kv) {
    return now - kv.second <= opts_.contention_window;
  });
  return static_cast<std::size_t>(recent) > session_slots;
}

std::chrono::milliseconds checkpoint_policy::idle_before_checkpoint(
    double last_save_ms, bool turn_end, steady_time now, std::size_t session_slots) const {
  using std::chrono::milliseconds;
  if (!turn_end || opts_.early_checkpoint.count() == 0 || !contended(now, session_slots))
    return opts_.idle_checkpoint;
  const auto last_save = milliseconds(static_cast<std::int64_t>(last_save_ms));
  auto wait = std::max(opts_.early_checkpoint, 2 * last_save);
  if (opts_.idle_checkpoint.count() > 0) wait = std::min(wait, opts_.idle_checkpoint);
  return wait;
}

}  // namespace kvp::core
