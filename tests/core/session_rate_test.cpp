// Tests for core/session_rate.hpp: limits.newSessionsPerMinute as a token bucket per
// credential, driven with injected times (no sleeps).
#include "core/session_rate.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

namespace session_rate_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::session_rate_limiter;

const session_rate_limiter::time_point t0{1000s};

// How many of `n` new sessions at `at` are allowed.
int allowed(session_rate_limiter& r, const std::string& credential, int n,
            session_rate_limiter::time_point at) {
  int out = 0;
  for (int i = 0; i < n; ++i) out += r.take(credential, at).allowed ? 1 : 0;
  return out;
}

}  // namespace

TEST_CASE("a burst of the per-minute rate, then one token every minute / rate", "[session_rate]") {
  session_rate_limiter r(6);  // a token every 10 s
  CHECK(allowed(r, "A", 10, t0) == 6);
  const auto refused = r.take("A", t0);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.retry_after == 10s);
  CHECK_FALSE(r.take("A", t0 + 9s).allowed);
  CHECK(r.take("A", t0 + 10s).allowed);
  CHECK_FALSE(r.take("A", t0 + 10s).allowed);
  CHECK(allowed(r, "A", 10, t0 + 80s) == 6);  // full again after a minute, never more
}

TEST_CASE("Retry-After counts whole seconds up, at least one", "[session_rate]") {
  session_rate_limiter fast(120);  // a token every 500 ms
  CHECK(allowed(fast, "A", 120, t0) == 120);
  CHECK(fast.take("A", t0).retry_after == 1s);
  session_rate_limiter slow(1);
  CHECK(slow.take("A", t0).allowed);
  CHECK(slow.take("A", t0 + 15500ms).retry_after == 45s);
}

TEST_CASE("each credential has its own bucket, and no credential is one too", "[session_rate]") {
  session_rate_limiter r(2);
  CHECK(allowed(r, "B", 5, t0) == 2);
  CHECK(allowed(r, "A", 1, t0) == 1);
  CHECK(allowed(r, "", 5, t0) == 2);
}

TEST_CASE("the first refusal after an allowed session is flagged once", "[session_rate]") {
  session_rate_limiter r(1);
  CHECK(r.take("A", t0).allowed);
  CHECK(r.take("A", t0).first_refusal);
  CHECK_FALSE(r.take("A", t0 + 1s).first_refusal);
  CHECK(r.take("A", t0 + 60s).allowed);
  CHECK(r.take("A", t0 + 60s).first_refusal);
}

TEST_CASE("0 is no limit", "[session_rate]") {
  session_rate_limiter r(0);
  CHECK(allowed(r, "A", 1000, t0) == 1000);
  CHECK(r.tracked() == 0);
}

TEST_CASE("full buckets are forgotten as new credentials arrive", "[session_rate]") {
  session_rate_limiter r(60);
  for (int i = 0; i < 1000; ++i) r.take("key-" + std::to_string(i), t0);
  CHECK(r.tracked() == 1000);  // each owes a second's refill
  for (int i = 0; i < 1000; ++i) r.take("later-" + std::to_string(i), t0 + 2s);
  CHECK(r.tracked() < 1100);
}

}  // namespace session_rate_test
