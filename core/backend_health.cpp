#include "core/backend_health.hpp"

#include <utility>

namespace kvp::core {

backend_health::backend_health(int max_consecutive_failures, std::chrono::milliseconds cooldown)
    : breaker_(max_consecutive_failures, cooldown) {}

void backend_health::on_failure(const error& e, steady_time now) {
  if (e.code == errc::backend_unavailable || e.code == errc::backend_disconnected ||
      e.code == errc::operation_timeout || e.code == errc::file_io_timeout ||
      e.http_status >= 500) {
    if (breaker_.on_failure(now)) changes_.push_back({true, e.code});
  }
}

void backend_health::on_success() {
  if (breaker_.on_success()) changes_.push_back({false, errc::invariant});
}

bool backend_health::allow(steady_time now) { return breaker_.allow(now); }

std::vector<circuit_change> backend_health::take_changes() { return std::exchange(changes_, {}); }

}  // namespace kvp::core
