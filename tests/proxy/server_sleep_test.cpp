// Tests for the pure helper of proxy/control/runtime_monitor.hpp: the idle checkpoint for a server that sleeps.
#include "proxy/control/runtime_monitor.hpp"

#include <catch2/catch.hpp>

namespace server_sleep_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::proxy::checkpoint_before_sleep;

TEST_CASE("the idle checkpoint comes before llama-server sleeps", "[proxy][server]") {
  CHECK(checkpoint_before_sleep(30'000ms, 0s) == 30'000ms);   // a server that never sleeps
  CHECK(checkpoint_before_sleep(0ms, 0s) == 0ms);             // idle checkpoints off
  CHECK(checkpoint_before_sleep(30'000ms, 300s) == 30'000ms);  // already earlier
  CHECK(checkpoint_before_sleep(30'000ms, 20s) == 19'000ms);   // a second before
  CHECK(checkpoint_before_sleep(30'000ms, 1s) == 500ms);       // half of a short period
  CHECK(checkpoint_before_sleep(0ms, 3s) == 2'000ms);          // sleep needs it even when off
}

}  // namespace

}  // namespace server_sleep_test
