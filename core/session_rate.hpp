// New sessions per credential (README "Security", docs/design.md §12): limits.newSessionsPerMinute
// as a token bucket per credential that holds a minute's tokens (the burst) and refills one
// every minute / rate. Pure: the caller passes `now`. Thread safety: none (one per
// coordinator, used on its strand).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_map>

namespace kvp::core {

class session_rate_limiter {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // `per_minute` 0: no limit.
  explicit session_rate_limiter(std::size_t per_minute);

  struct verdict {
    bool allowed = true;
    std::chrono::seconds retry_after{0};  // refused: until the bucket holds a token (>= 1 s)
    bool first_refusal = false;           // refused, after its last attempt was allowed
  };
  // A new session of `credential` at `now`: takes a token if the bucket holds one.
  verdict take(const std::string& credential, time_point now);

  // Credentials whose bucket is not full. Full buckets are forgotten as more credentials
  // arrive, so memory follows the credentials active in the last minute.
  std::size_t tracked() const { return buckets_.size(); }

 private:
  struct bucket {
    time_point full_at;  // when the bucket is full again
    bool refusing = false;
  };
  void forget_full(time_point now);

  std::chrono::nanoseconds refill_{0};  // one token
  std::chrono::nanoseconds burst_{0};   // every token: a minute
  std::unordered_map<std::string, bucket> buckets_;
  std::size_t forget_at_ = 64;
};

}  // namespace kvp::core
