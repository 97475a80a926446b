// Tests for core/sleep_watch.hpp: what a look at /props's is_sleeping changes, and the sleep
// period it teaches (docs/design.md §4), fed as proxy/control/sleep_tracker.cpp feeds it.
#include "core/sleep_watch.hpp"

#include <catch2/catch.hpp>

namespace sleep_watch_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;
using namespace std::chrono_literals;

const sleep_watch::time_point t0 = sleep_watch::time_point{} + 1000s;

}  // namespace

TEST_CASE("sleep: a change is reported once; awake looks bound the learned period",
          "[core][sleep_watch]") {
  using s = sleep_change::action;
  sleep_watch w;
  const auto used = t0;
  CHECK(w.note_sleeping(false, used + 2s, used).what == s::none);
  CHECK(w.note_sleeping(false, used + 5s, used).what == s::none);  // awake 5 s after use
  auto c = w.note_sleeping(true, used + 9s, used);
  CHECK(c.what == s::fell_asleep);
  CHECK(c.learn == 5s);  // the longest awake idle, a lower bound
  w.learn_sleep_period(c.learn);
  CHECK(w.sleep_period() == 5s);
  CHECK(w.note_sleeping(true, used + 10s, used).what == s::none);
  CHECK(w.note_sleeping(false, used + 11s, used).what == s::woke);
  // Asleep again with the same lower bound: nothing shorter to learn.
  c = w.note_sleeping(true, used + 12s, used);
  CHECK(c.what == s::fell_asleep);
  CHECK(c.learn == 0s);
}

TEST_CASE("sleep: without an awake look the idle time bounds it; configured wins",
          "[core][sleep_watch]") {
  using s = sleep_change::action;
  sleep_watch learned;
  auto c = learned.note_sleeping(true, t0 + 7s, t0);
  CHECK(c.what == s::fell_asleep);
  CHECK(c.learn == 7s);  // asleep after 7 s idle: at most 7 s
  sleep_watch unused;
  CHECK(unused.note_sleeping(true, t0, std::nullopt).learn == 0s);  // nothing to measure from
  sleep_watch configured(20s);
  c = configured.note_sleeping(true, t0 + 7s, t0);
  CHECK(c.what == s::fell_asleep);
  CHECK(c.learn == 0s);
  CHECK(configured.sleep_period() == 20s);
  CHECK(learned.sleep_period() == 0s);  // until the coordinator adopts what it learned
}

}  // namespace sleep_watch_test
