#include "core/session_rate.hpp"

#include <algorithm>
#include <cstdint>

namespace kvp::core {

namespace {

std::chrono::seconds whole_seconds_up(std::chrono::nanoseconds d) {
  const auto s = std::chrono::ceil<std::chrono::seconds>(d);
  return std::max(s, std::chrono::seconds(1));
}

}  // namespace

session_rate_limiter::session_rate_limiter(std::size_t per_minute) {
  if (per_minute == 0) return;
  const auto n = static_cast<std::int64_t>(per_minute);
  refill_ = std::chrono::nanoseconds(std::chrono::minutes(1)) / n;
  burst_ = refill_ * n;
}

// The bucket is kept as the time it is full again: it owes `full_at - now` of refill, and a
// token may be taken while that debt plus one token stays within the burst.
session_rate_limiter::verdict session_rate_limiter::take(const std::string& credential,
                                                         time_point now) {
  if (burst_.count() == 0) return {};
  forget_full(now);
  auto& b = buckets_.try_emplace(credential, bucket{now, false}).first->second;
  const std::chrono::nanoseconds owed = b.full_at - now;
  const auto debt = std::max(owed, std::chrono::nanoseconds(0)) + refill_;
  if (debt <= burst_) {
    b.full_at = now + debt;
    b.refusing = false;
    return {};
  }
  const bool first = !b.refusing;
  b.refusing = true;
  return {false, whole_seconds_up(debt - burst_), first};
}

// Amortized: only when the map has doubled since the last pass.
void session_rate_limiter::forget_full(time_point now) {
  if (buckets_.size() < forget_at_) return;
  std::erase_if(buckets_, [&](const auto& kv) { return kv.second.full_at <= now; });
  forget_at_ = std::max<std::size_t>(64, 2 * buckets_.size());
}

}  // namespace kvp::core
