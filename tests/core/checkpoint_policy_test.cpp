// Tests for core/checkpoint_policy.hpp (docs/design.md §10): which ends save at once, when
// sessions contend for the slots, and how long a dirty slot waits before its idle or early
// checkpoint.
#include "core/checkpoint_policy.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

namespace checkpoint_policy_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(1);

slot_pool_options early(std::chrono::milliseconds idle = 30s) {
  slot_pool_options o;
  o.idle_checkpoint = idle;
  o.early_checkpoint = 2s;
  o.contention_window = 60s;
  return o;
}

}  // namespace

TEST_CASE("a save at the end: after every step, or only at a turn end", "[core][checkpoint_policy]") {
  slot_pool_options o;
  CHECK(checkpoint_policy(o).saves_on_switch());
  CHECK_FALSE(checkpoint_policy(o).saves_at_end(true));
  o.save_on_turn_end = true;
  CHECK(checkpoint_policy(o).saves_at_end(true));
  CHECK_FALSE(checkpoint_policy(o).saves_at_end(false));
  o.save_on_step_end = true;
  CHECK(checkpoint_policy(o).saves_at_end(false));
  o.save_on_switch = false;
  CHECK_FALSE(checkpoint_policy(o).saves_on_switch());
}

TEST_CASE("contention: more sessions took turns within the window than there are slots",
          "[core][checkpoint_policy]") {
  checkpoint_policy p(early());
  p.note_turn("A", t0);
  p.note_turn("A", t0 + 1s);  // one session, however many turns
  CHECK_FALSE(p.contended(t0 + 1s, 1));
  p.note_turn("B", t0 + 2s);
  CHECK(p.contended(t0 + 2s, 1));
  CHECK_FALSE(p.contended(t0 + 2s, 2));
  // A's turn leaves the window: B alone is no contention.
  CHECK_FALSE(p.contended(t0 + 62s, 1));
}

TEST_CASE("at most 64 sessions are remembered: the one whose turn is oldest goes",
          "[core][checkpoint_policy]") {
  checkpoint_policy p(early());
  for (int i = 0; i < 64; ++i) p.note_turn("s" + std::to_string(i), t0 + std::chrono::milliseconds(i));
  CHECK(p.contended(t0 + 1s, 63));
  CHECK_FALSE(p.contended(t0 + 1s, 64));
  p.note_turn("newcomer", t0 + 1s);  // s0 goes, the count stays 64
  CHECK_FALSE(p.contended(t0 + 1s, 64));
  CHECK(p.contended(t0 + 1s, 63));
}

TEST_CASE("the wait before a checkpoint: idleMs, or the early checkpoint after a contended turn end",
          "[core][checkpoint_policy]") {
  checkpoint_policy p(early());
  p.note_turn("A", t0);
  // One session: idleMs, turn end or not.
  CHECK(p.idle_before_checkpoint(0, true, t0, 1) == 30s);
  p.note_turn("B", t0);
  CHECK(p.idle_before_checkpoint(0, false, t0, 1) == 30s);  // a tool step: no early save
  CHECK(p.idle_before_checkpoint(0, true, t0, 1) == 2s);
  // At least twice the last save, and never later than idleMs.
  CHECK(p.idle_before_checkpoint(1500, true, t0, 1) == 3s);
  CHECK(p.idle_before_checkpoint(20'000, true, t0, 1) == 30s);
  // Without an idle checkpoint the early one still waits twice the last save.
  checkpoint_policy no_idle(early(0ms));
  no_idle.note_turn("A", t0);
  no_idle.note_turn("B", t0);
  CHECK(no_idle.idle_before_checkpoint(20'000, true, t0, 1) == 40s);
  CHECK(no_idle.idle_before_checkpoint(0, false, t0, 1) == 0ms);
}

TEST_CASE("a learned sleep period replaces idleMs", "[core][checkpoint_policy]") {
  checkpoint_policy p(slot_pool_options{});
  CHECK(p.idle_checkpoint() == 30s);
  p.set_idle_checkpoint(5s);
  CHECK(p.idle_checkpoint() == 5s);
  CHECK(p.idle_before_checkpoint(0, true, t0, 1) == 5s);
}

}  // namespace checkpoint_policy_test
