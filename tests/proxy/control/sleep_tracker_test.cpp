// Tests for proxy/control/sleep_tracker.hpp (docs/design.md §4): the idle checkpoint for a server
// that sleeps, the period an earlier process learned, a sleep seen on /props (residency ended,
// the period learned from the last use and recorded in sleep.json, waking logged), and whether
// a slot's owner may have slept since its last request.
#include "proxy/control/sleep_tracker.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "core/identity.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"

namespace sleep_tracker_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::proxy::checkpoint_before_sleep;
using kvp::proxy::sleep_tracker_options;
using steady_clock = std::chrono::steady_clock;

sleep_tracker_options configured(std::chrono::seconds sleep_idle) {
  sleep_tracker_options o;
  o.sleep_idle = sleep_idle;
  return o;
}

// The tracker over a pool whose slot 0 session A owns, dirty.
struct harness : kvp::testing::control_parts {
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::sleep_tracker sleep;

  explicit harness(sleep_tracker_options o = {})
      : sleep(ioc.get_executor(), {pool, store, actions}, std::move(o)) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
  }
  void take_slot(const std::string& id) {
    kvp::core::request_identity who;
    who.session_id = id;
    const auto now = steady_clock::now();
    const auto plan = pool.plans().prepare(who, 0, now, "2026-06-01T00:00:00Z");
    REQUIRE(kvp::testing::run_on(ioc, ioc.get_executor(), actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, 0);
    fake.run_inference(100);
    (void)pool.outcomes().end_inference(0, true, now);
  }
};

}  // namespace

TEST_CASE("the idle checkpoint comes before llama-server sleeps", "[proxy][sleep_tracker]") {
  CHECK(checkpoint_before_sleep(30'000ms, 0s) == 30'000ms);   // a server that never sleeps
  CHECK(checkpoint_before_sleep(0ms, 0s) == 0ms);             // idle checkpoints off
  CHECK(checkpoint_before_sleep(30'000ms, 300s) == 30'000ms);  // already earlier
  CHECK(checkpoint_before_sleep(30'000ms, 20s) == 19'000ms);   // a second before
  CHECK(checkpoint_before_sleep(30'000ms, 1s) == 500ms);       // half of a short period
  CHECK(checkpoint_before_sleep(0ms, 3s) == 2'000ms);          // sleep needs it even when off
}

TEST_CASE("a start adopts the sleep period an earlier process learned, unless configured",
          "[proxy][sleep_tracker]") {
  harness first;
  REQUIRE(first.store.write_learned_sleep(20s).ok());
  kvp::testing::run_on(first.ioc, first.ioc.get_executor(), first.sleep.start());
  CHECK(first.sleep.period() == 20s);
  CHECK(first.pool.checkpoints().idle_checkpoint() == 19'000ms);

  harness set(configured(60s));  // upstream.sleepIdleSeconds wins over sleep.json
  REQUIRE(set.store.write_learned_sleep(20s).ok());
  kvp::testing::run_on(set.ioc, set.ioc.get_executor(), set.sleep.start());
  CHECK(set.sleep.period() == 60s);
  CHECK(set.pool.checkpoints().idle_checkpoint() == 0ms);
}

TEST_CASE("a sleep seen ends residency, learns the period from the last use, records it",
          "[proxy][sleep_tracker]") {
  harness h;
  h.take_slot("A");
  const auto ended = steady_clock::now() - 3s;
  h.sleep.note_request_finished(0, ended);
  h.sleep.note_slots_read(ended - 10s);  // older than the request's end: the end counts
  kvp::testing::log_capture log;
  h.sleep.note_sleeping(false);  // awake, as it was: nothing
  CHECK(log.of("kv.backend.awake").empty());
  h.sleep.note_sleeping(true);
  CHECK(h.pool.table().owner(0).empty());
  REQUIRE(log.of("kv.backend.sleeping").size() == 1);
  CHECK(log.of("kv.backend.sleeping")[0].find("unsaved_sessions=1") != std::string::npos);
  CHECK(h.sleep.period() == 3s);
  CHECK(h.pool.checkpoints().idle_checkpoint() == 2000ms);
  CHECK(log.of("kv.backend.sleep_learned").size() == 1);
  kvp::testing::run_for(h.ioc, 100ms);  // sleep.json is written on the file pool
  CHECK(h.store.read_learned_sleep() == 3s);
  h.sleep.note_sleeping(true);  // still asleep: said once
  CHECK(log.of("kv.backend.sleeping").size() == 1);
  h.sleep.note_sleeping(false);
  CHECK(log.of("kv.backend.awake").size() == 1);
}

TEST_CASE("may_have_slept measures the owner's idle time against the period",
          "[proxy][sleep_tracker]") {
  harness h(configured(20s));
  const auto t0 = steady_clock::now();
  CHECK_FALSE(h.sleep.may_have_slept(0, t0 + 30s));  // nobody owns the slot
  h.take_slot("A");
  CHECK_FALSE(h.sleep.may_have_slept(0, t0 + 30s));  // no request ended yet
  h.sleep.note_request_finished(0, t0);
  CHECK_FALSE(h.sleep.may_have_slept(0, t0 + 19s));
  CHECK(h.sleep.may_have_slept(0, t0 + 20s));
}

}  // namespace sleep_tracker_test
