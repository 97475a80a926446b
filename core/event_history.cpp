#include "core/event_history.hpp"

#include <algorithm>

namespace kvp::core {

void event_history::record(std::string event, std::string json) {
  std::lock_guard lock(mu_);
  if (ring_.size() == capacity) ring_.pop_front();
  ring_.push_back(entry{++last_seq_, std::move(event), std::move(json)});
}

std::vector<event_history::entry> event_history::since(std::uint64_t after) const {
  std::lock_guard lock(mu_);
  auto first = std::find_if(ring_.begin(), ring_.end(), [&](const entry& e) { return e.seq > after; });
  return {first, ring_.end()};
}

std::uint64_t event_history::last_seq() const {
  std::lock_guard lock(mu_);
  return last_seq_;
}

event_history& recent_events() {
  static event_history history;
  return history;
}

}  // namespace kvp::core
