// Tests for core/breaker.hpp (docs/design.md §13): consecutive failures open the circuit for a
// cooldown, one half-open trial decides, failed trials back off up to 16x.
#include "core/breaker.hpp"

#include <algorithm>
#include <catch2/catch.hpp>

#include <chrono>

#include "tests/support/core_strings.hpp"

namespace breaker_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::breaker;
using state = breaker::state;

const breaker::clock::time_point t0 = breaker::clock::time_point{} + std::chrono::hours(1);

// Three failures at t0: open until t0 + 60s.
breaker opened() {
  breaker b(3, 60s);
  CHECK_FALSE(b.on_failure(t0));
  CHECK_FALSE(b.on_failure(t0));
  CHECK(b.on_failure(t0));  // this one changed the state
  REQUIRE(b.current() == state::open);
  return b;
}

}  // namespace

TEST_CASE("a closed breaker allows everything and counts consecutive failures only",
          "[core][breaker]") {
  breaker b(3, 60s);
  CHECK(b.current() == state::closed);
  CHECK(b.allow(t0));
  CHECK(b.allow(t0));
  CHECK_FALSE(b.on_failure(t0));
  CHECK_FALSE(b.on_failure(t0));
  CHECK(b.consecutive_failures() == 2);
  CHECK_FALSE(b.on_success());  // already closed: no state change to report
  CHECK(b.consecutive_failures() == 0);
  CHECK_FALSE(b.on_failure(t0));
  CHECK_FALSE(b.on_failure(t0));
  CHECK(b.current() == state::closed);
  CHECK(b.allow(t0));
}

TEST_CASE("the third consecutive failure opens the circuit for the cooldown", "[core][breaker]") {
  auto b = opened();
  CHECK(b.consecutive_failures() == 3);
  CHECK_FALSE(b.allow(t0));
  CHECK_FALSE(b.allow(t0 + 59'999ms));
  CHECK(b.current() == state::open);
}

TEST_CASE("after the cooldown exactly one half-open trial runs", "[core][breaker]") {
  auto b = opened();
  CHECK(b.allow(t0 + 60s));
  CHECK(b.current() == state::half_open);
  CHECK_FALSE(b.allow(t0 + 60s));  // the trial is in flight
  CHECK_FALSE(b.allow(t0 + 1h));

  SECTION("a successful trial closes it") {
    CHECK(b.on_success());
    CHECK(b.current() == state::closed);
    CHECK(b.consecutive_failures() == 0);
    CHECK(b.allow(t0 + 61s));
    // and the count starts from zero again
    CHECK_FALSE(b.on_failure(t0 + 62s));
    CHECK_FALSE(b.on_failure(t0 + 62s));
    CHECK(b.current() == state::closed);
  }

  SECTION("a failed trial reopens with a doubled cooldown") {
    CHECK_FALSE(b.on_failure(t0 + 60s));  // not a new outage
    CHECK(b.current() == state::open);
    CHECK_FALSE(b.allow(t0 + 60s + 119s));
    CHECK(b.allow(t0 + 60s + 120s));
    CHECK(b.current() == state::half_open);
  }
}

TEST_CASE("failed trials back off up to 16x the cooldown, success resets it", "[core][breaker]") {
  auto b = opened();
  auto now = t0;
  auto cooldown = std::chrono::milliseconds(60s);
  for (int i = 0; i < 6; ++i) {
    now += cooldown;
    REQUIRE_FALSE(b.allow(now - 1ms));
    REQUIRE(b.allow(now));
    b.on_failure(now);
    cooldown = std::min(cooldown * 2, std::chrono::milliseconds(16 * 60s));
  }
  // 60 -> 120 -> 240 -> 480 -> 960 -> 960 (capped) -> 960
  CHECK(cooldown == 960s);
  CHECK_FALSE(b.allow(now + 959s));
  CHECK(b.allow(now + 960s));
  CHECK(b.on_success());

  // The next outage starts from the configured cooldown again.
  b.on_failure(now + 1000s);
  b.on_failure(now + 1000s);
  CHECK(b.on_failure(now + 1000s));
  CHECK_FALSE(b.allow(now + 1059s));
  CHECK(b.allow(now + 1060s));
}

TEST_CASE("breaker states have stable names", "[core][breaker]") {
  CHECK(kvp::core::to_string(state::closed) == "closed");
  CHECK(kvp::core::to_string(state::open) == "open");
  CHECK(kvp::core::to_string(state::half_open) == "half_open");
}

}  // namespace breaker_test
