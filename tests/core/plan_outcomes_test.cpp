// Tests for core/plan_outcomes.hpp (docs/design.md §7-§9, §20), on a pool_state without a
// slot_pool: what each outcome leaves in the slot table, the session's record and the
// statistics. The full call sequences through the pool are tests/core/slot_pool_plans_test.cpp's.
#include "core/plan_outcomes.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tests/support/core_strings.hpp"
#include "tests/support/pool_state.hpp"

namespace plan_outcomes_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;
using kvp::testing::enabled_pool_state;

const steady_time t0 = steady_time{} + std::chrono::hours(1);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

const request_identity alice{"A", "", {}, "key-A"};

chain_link link(std::uint8_t b) {
  chain_link l{};
  l[0] = b;
  return l;
}

// A request of `who` prepared on slot 0 and started, as plan_builder and start_inference
// leave it; returns its kind.
prepare_kind started(pool_state& st, const request_identity& who, prepare_kind kind) {
  auto& s = *st.table.find(0);
  s.pending_hash = st.keys.key(who);
  st.records.touch(s.pending_hash, who.session_id, [](const std::string&) { return true; });
  s.pending_kind = kind;
  return plan_outcomes(st).start_inference(who, 0);
}

}  // namespace

TEST_CASE("a started request owns the slot, and its content and chain are the slot's",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  auto who = alice;
  who.chain = {link(1), link(2)};
  CHECK(started(st, who, prepare_kind::cold) == prepare_kind::cold);
  const auto a = st.keys.key(alice);
  const auto& s = *st.table.find(0);
  CHECK(s.owner == a);
  CHECK(s.state == slot_state::inference);
  CHECK(s.content.whose == content_whose::known);
  CHECK(s.content.credential == "key-A");
  CHECK(s.content.session == a);
  CHECK(st.records.find(a)->chain == who.chain);
  CHECK(st.records.find(a)->credential == "key-A");
  CHECK(st.stats.cold_starts == 1);
  CHECK(st.stats.restore_misses == 0);  // a first visit
}

TEST_CASE("an auxiliary request owns nothing; without persistence nothing starts",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  auto& s = *st.table.find(0);
  s.pending_aux = true;
  s.pending_kind = prepare_kind::auxiliary;
  CHECK(plan_outcomes(st).start_inference({"", "session-title", {}, "key-A"}, 0) ==
        prepare_kind::auxiliary);
  CHECK(s.owner.empty());
  CHECK(s.content.session.empty());
  CHECK_FALSE(plan_outcomes(st).end_inference(0, true, t0));
  CHECK(s.state == slot_state::unknown);
  pool_state off(slot_pool_options{});
  CHECK(plan_outcomes(off).start_inference(alice, 0) == prepare_kind::none);
}

TEST_CASE("a request that reached the slot makes its owner dirty, and arms the idle checkpoint",
          "[core][plan_outcomes]") {
  slot_pool_options o;
  auto st = enabled_pool_state(1, o);
  st.checkpoints.set_idle_checkpoint(30s);
  started(st, alice, prepare_kind::cold);
  CHECK_FALSE(plan_outcomes(st).end_inference(0, true, t0));
  const auto& s = *st.table.find(0);
  CHECK(s.state == slot_state::dirty);
  CHECK(s.idle_deadline == t0 + 30s);
  CHECK(s.idle_rev == 1);
  CHECK(st.records.dirty(s.owner));
  // One that never reached it leaves the session as it was.
  started(st, alice, prepare_kind::resident);
  CHECK_FALSE(plan_outcomes(st).end_inference(0, false, t0));
  CHECK(st.records.find(s.owner)->dirty_rev == 1);
}

TEST_CASE("a save at the end comes with checkpoint.onTurnEnd at a turn end", "[core][plan_outcomes]") {
  slot_pool_options o;
  o.save_on_turn_end = true;
  auto st = enabled_pool_state(1, o);
  started(st, alice, prepare_kind::cold);
  CHECK_FALSE(plan_outcomes(st).end_inference(0, true, t0, false));
  started(st, alice, prepare_kind::resident);
  auto save = plan_outcomes(st).end_inference(0, true, t0, true);
  REQUIRE(save);
  CHECK(save->revision == 2);
  CHECK(st.table.find(0)->state == slot_state::saving);
}

TEST_CASE("a save's manifest records the runtime, the revision, the chain and the credential",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  auto who = alice;
  who.chain = {link(7)};
  started(st, who, prepare_kind::cold);
  (void)plan_outcomes(st).end_inference(0, true, t0);
  auto step = st.save_of(*st.table.find(0));
  auto m = plan_outcomes(st).on_save(step, slot_saved{100, 4096, 12.5}, t0, wall);
  REQUIRE(m.ok());
  CHECK(m->session_hash == st.keys.key(alice));
  CHECK(m->session_id == "A");
  CHECK(m->runtime_fingerprint == st.fingerprint);
  CHECK(m->model_id == st.runtime.model_path);
  CHECK(m->revision == 1);
  CHECK(m->tokens == 100);
  CHECK(m->bytes == 4096);
  CHECK(m->save_ms == 12.5);
  CHECK(m->chain == who.chain);
  CHECK(m->credential == "key-A");
  CHECK(m->created_at == wall);
  CHECK(st.table.find(0)->state == slot_state::dirty);  // clean once stored
  plan_outcomes(st).store_manifest(m.value());
  CHECK(st.table.find(0)->state == slot_state::ready);
  CHECK(st.stats.saves == 1);
  plan_outcomes(st).on_commit_failed(error{errc::metadata_io, 0, "disk"}, t0);
  CHECK(st.stats.saves == 0);
  CHECK(st.stats.save_failures == 1);
}

TEST_CASE("an empty save drops the ownership; a save of no bytes is a failure",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  started(st, alice, prepare_kind::cold);
  (void)plan_outcomes(st).end_inference(0, true, t0);
  auto empty = plan_outcomes(st).on_save(st.save_of(*st.table.find(0)), slot_saved{0, 0, 1}, t0, wall);
  CHECK(empty.err().code == errc::save_empty);
  CHECK(st.table.owner(0).empty());
  CHECK(st.stats.empty_saves == 1);
  started(st, alice, prepare_kind::cold);
  (void)plan_outcomes(st).end_inference(0, true, t0);
  auto none = plan_outcomes(st).on_save(st.save_of(*st.table.find(0)), slot_saved{5, 0, 1}, t0, wall);
  CHECK(none.err().code == errc::save_failed);
  CHECK(st.table.find(0)->state == slot_state::dirty);
}

TEST_CASE("a restore is verified: the right count loads the snapshot's content, another is corrupt",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  manifest m;
  m.session_hash = "A";
  m.credential = "key-A";
  st.records.add_manifest(m);
  const restore_step step{0, "A", "A.a.bin", 100, 4096, {}, 0};
  auto ok = plan_outcomes(st).on_restore(step, slot_restored{100, 4096, 2}, t0, wall);
  CHECK(ok.restored);
  CHECK(st.table.find(0)->pending_kind == prepare_kind::restored);
  CHECK(st.table.content(0).whose == content_whose::known);
  CHECK(st.table.content(0).credential == "key-A");
  CHECK(st.table.content(0).session == "A");
  auto short_count = plan_outcomes(st).on_restore(step, slot_restored{60, 4096, 2}, t0, wall);
  CHECK_FALSE(short_count.restored);
  CHECK(short_count.need_erase);
  REQUIRE(short_count.write);
  CHECK(short_count.write->state == snapshot_state::invalid);
  CHECK(short_count.err.code == errc::snapshot_corrupt);
  CHECK(st.table.find(0)->pending_kind == prepare_kind::cold_fallback);
  CHECK(st.stats.restores == 2);
  CHECK(st.stats.restore_hits == 1);
  CHECK(st.stats.restore_failures == 1);
  CHECK(st.stats.invalidations == 1);
}

TEST_CASE("a rejected restore leaves the slot empty; a failed erase leaves it unknown",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  manifest m;
  m.session_hash = "A";
  st.records.add_manifest(m);
  const restore_step step{0, "A", "A.a.bin", 100, 4096, {}, 0};
  auto rejected = plan_outcomes(st).on_restore(step, error{errc::restore_failed, 400, "bad file"},
                                               t0, wall);
  CHECK_FALSE(rejected.restored);
  CHECK(rejected.write);
  CHECK(st.table.content(0).whose == content_whose::empty);
  CHECK(st.table.state(0) == slot_state::idle);
  CHECK(st.health.circuit().consecutive_failures() == 0);  // the file's fault, not the server's
  CHECK_FALSE(plan_outcomes(st).on_erase(0, error{errc::erase_failed, 500, "no"}, t0));
  CHECK(st.table.content(0).whose == content_whose::unknown);
  CHECK(st.health.circuit().consecutive_failures() == 1);
  CHECK(plan_outcomes(st).on_erase(0, slot_erased{0}, t0));
  CHECK(st.table.content(0).whose == content_whose::empty);
  CHECK(st.table.state(0) == slot_state::idle);
}

TEST_CASE("a lease released without end_inference: a new revision if the request may have run",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  started(st, alice, prepare_kind::cold);
  plan_outcomes(st).abort_prepare(0);
  const auto& s = *st.table.find(0);
  CHECK(s.state == slot_state::dirty);
  CHECK(st.records.find(s.owner)->dirty_rev == 1);
  CHECK(s.pending_hash.empty());
  CHECK(s.pending_kind == prepare_kind::none);
  auto before = enabled_pool_state();
  auto& prepared = *before.table.find(0);
  prepared.state = slot_state::restoring;
  prepared.owner = "A";
  plan_outcomes(before).abort_prepare(0);
  CHECK(prepared.state == slot_state::unknown);
  CHECK(prepared.owner.empty());
}

TEST_CASE("reuse counts for known sessions; after a restore also as reuse after it",
          "[core][plan_outcomes]") {
  auto st = enabled_pool_state();
  started(st, alice, prepare_kind::restored);
  const auto a = st.keys.key(alice);
  plan_outcomes(st).note_reuse(a, prepare_kind::restored, 80, 40.0);
  plan_outcomes(st).note_reuse(a, prepare_kind::resident, 20, 40.0);
  plan_outcomes(st).note_reuse(a, prepare_kind::auxiliary, 5, 40.0);
  plan_outcomes(st).note_reuse("unknown", prepare_kind::resident, 5, 40.0);
  const auto& r = st.records.find(a)->reuse;
  CHECK(r.restores == 1);
  CHECK(r.reused_tokens == 100);
  CHECK(r.reused_after_restore == 80);
  CHECK(r.prefill_seconds_saved == Approx(2.0));
}

}  // namespace plan_outcomes_test
