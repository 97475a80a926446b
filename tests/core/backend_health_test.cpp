// Tests for core/backend_health.hpp (docs/design.md §13): which failures count toward the
// breaker, and that each transition is reported once, in order.
#include "core/backend_health.hpp"

#include <catch2/catch.hpp>

#include <chrono>

#include "tests/support/core_strings.hpp"

namespace backend_health_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(1);

error failure(errc code, int http_status = 0) { return error{code, http_status, "test"}; }

}  // namespace

TEST_CASE("the server's and the wire's failures count toward the breaker, the snapshot's do not",
          "[core][backend_health]") {
  for (const auto& counted :
       {failure(errc::backend_unavailable), failure(errc::backend_disconnected),
        failure(errc::operation_timeout), failure(errc::file_io_timeout),
        failure(errc::restore_failed, 500), failure(errc::save_failed, 503)}) {
    backend_health h(3, 60s);
    h.on_failure(counted, t0);
    CHECK(h.circuit().consecutive_failures() == 1);
  }
  for (const auto& ignored :
       {failure(errc::restore_failed, 400), failure(errc::snapshot_not_found),
        failure(errc::metadata_io), failure(errc::slot_not_found, 404)}) {
    backend_health h(3, 60s);
    h.on_failure(ignored, t0);
    CHECK(h.circuit().consecutive_failures() == 0);
  }
}

TEST_CASE("each transition is reported once, oldest first, with the failure that opened it",
          "[core][backend_health]") {
  backend_health h(2, 60s);
  h.on_failure(failure(errc::backend_unavailable), t0);
  CHECK(h.take_changes().empty());  // below the threshold: no transition yet
  h.on_failure(failure(errc::operation_timeout), t0);
  CHECK(h.circuit().current() == breaker::state::open);
  CHECK_FALSE(h.allow(t0 + 1s));
  CHECK(h.allow(t0 + 61s));  // the half-open trial
  h.on_success();
  const auto changes = h.take_changes();
  REQUIRE(changes.size() == 2);
  CHECK(changes[0].opened);
  CHECK(changes[0].cause == errc::operation_timeout);
  CHECK_FALSE(changes[1].opened);
  CHECK(h.take_changes().empty());
  h.on_success();  // already closed: no transition
  CHECK(h.take_changes().empty());
}

}  // namespace backend_health_test
