// Tests for core/plan_builder.hpp (docs/design.md §6, §10, §13, §20), on a pool_state without a
// slot_pool: what a plan asks for in each case, and the saves and admin operations outside a
// request. The full call sequences through the pool are tests/core/slot_pool_plans_test.cpp's.
#include "core/plan_builder.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tests/support/core_strings.hpp"
#include "tests/support/pool_state.hpp"

namespace plan_builder_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;
using kvp::testing::enabled_pool_state;

const steady_time t0 = steady_time{} + std::chrono::hours(1);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

request_identity session(std::string id, std::string credential = "key-A") {
  return request_identity{std::move(id), "", {}, std::move(credential)};
}

// Slot 0 as a finished request of `who` leaves it: owned, its content `who`'s, dirty at
// revision 1 (saved at 0) when `dirty`.
void own(pool_state& st, const request_identity& who, bool dirty = true) {
  const auto hash = st.keys.key(who);
  auto& s = *st.table.find(0);
  s.owner = hash;
  s.state = dirty ? slot_state::dirty : slot_state::ready;
  s.content = {content_whose::known, who.credential, hash};
  st.records.get(hash).dirty_rev = dirty ? 1 : 0;
  st.tenants.note_credential(who.credential);
}

// A ready snapshot of `who` under the running runtime.
void saved(pool_state& st, const request_identity& who) { (void)kvp::testing::add_ready_snapshot(st, who); }

}  // namespace

TEST_CASE("without persistence a plan is empty, and fails a session in strict mode",
          "[core][plan_builder]") {
  pool_state st(slot_pool_options{});
  auto plan = plan_builder(st).prepare(session("A"), 0, t0, wall);
  CHECK_FALSE(plan.fail);
  CHECK_FALSE(plan.erase);
  CHECK(st.table.find(0)->pending_kind == prepare_kind::none);
  st.opts.strict = true;
  plan = plan_builder(st).prepare(session("A"), 0, t0, wall);
  CHECK(plan.fail);
  CHECK(plan.fail_code == errc::backend_unavailable);
  CHECK_FALSE(plan_builder(st).prepare({"", "session-title", {}, ""}, 0, t0, wall).fail);
}

TEST_CASE("the owner's next request is resident: no calls", "[core][plan_builder]") {
  auto st = enabled_pool_state();
  own(st, session("A"));
  auto plan = plan_builder(st).prepare(session("A"), 0, t0, wall);
  CHECK(plan.resident);
  CHECK_FALSE(plan.save);
  CHECK_FALSE(plan.restore);
  CHECK_FALSE(plan.erase);
  CHECK(st.table.find(0)->pending_kind == prepare_kind::resident);
}

TEST_CASE("a switch saves the dirty owner, then restores the newcomer's own snapshot",
          "[core][plan_builder]") {
  auto st = enabled_pool_state();
  own(st, session("A"));
  saved(st, session("B"));
  auto plan = plan_builder(st).prepare(session("B"), 0, t0, wall);
  REQUIRE(plan.save);
  CHECK(plan.save->hash == st.keys.key(session("A")));
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == st.keys.key(session("B")));
  CHECK(plan.restore->seed_for.empty());
  CHECK(plan.restore->expected_tokens == 100);
  CHECK(st.stats.switches == 1);
  CHECK(st.table.find(0)->state == slot_state::saving);  // the save runs first
}

TEST_CASE("a cold session keeps content within the scope and erases outside it",
          "[core][plan_builder]") {
  slot_pool_options credential_scope;
  credential_scope.seed_within_credential = true;
  auto st = enabled_pool_state(1, credential_scope);
  own(st, session("A"), false);
  auto kept = plan_builder(st).prepare(session("B"), 0, t0, wall);  // same credential
  CHECK(kept.kept);
  CHECK_FALSE(kept.erase);
  CHECK(st.table.find(0)->pending_kind == prepare_kind::cold);
  auto foreign = plan_builder(st).prepare(session("C", "key-B"), 0, t0, wall);
  CHECK_FALSE(foreign.kept);
  CHECK(foreign.erase);
  CHECK(foreign.erase_required);  // another credential's KV: a failed erase fails the request
  // A model kind that reprocesses a kept state gets an erase instead, not a required one.
  auto verdict = enabled_pool_state(1, credential_scope);
  verdict.compatibility = "broken";
  own(verdict, session("A"), false);
  auto erased = plan_builder(verdict).prepare(session("B"), 0, t0, wall);
  CHECK(erased.erase);
  CHECK_FALSE(erased.erase_required);
}

TEST_CASE("an open breaker: the request runs as it is, with only the erase isolation requires",
          "[core][plan_builder]") {
  slot_pool_options o;
  o.seed_within_credential = true;
  o.max_consecutive_failures = 1;
  auto st = enabled_pool_state(1, o);
  own(st, session("A"));
  st.health.on_failure(error{errc::backend_unavailable, 0, "down"}, t0);
  auto same = plan_builder(st).prepare(session("B"), 0, t0, wall);
  CHECK_FALSE(same.save);
  CHECK_FALSE(same.erase);
  CHECK(st.table.find(0)->owner.empty());
  CHECK(st.table.find(0)->pending_kind == prepare_kind::cold);
  own(st, session("A"));
  auto other = plan_builder(st).prepare(session("C", "key-B"), 0, t0, wall);
  CHECK(other.erase);
  CHECK(other.erase_required);
  st.opts.strict = true;
  CHECK(plan_builder(st).prepare(session("D"), 0, t0, wall).fail);
}

TEST_CASE("the idle checkpoint saves only the owner still dirty at the revision it was armed for",
          "[core][plan_builder]") {
  auto st = enabled_pool_state();
  own(st, session("A"));
  auto& slot = *st.table.find(0);
  slot.idle_deadline = t0 + 30s;
  slot.idle_rev = 1;
  CHECK_FALSE(plan_builder(st).idle_checkpoint(0, t0 + 29s));  // not yet
  CHECK(slot.idle_deadline);
  st.records.get(slot.owner).dirty_rev = 2;  // another turn since
  CHECK_FALSE(plan_builder(st).idle_checkpoint(0, t0 + 30s));
  CHECK_FALSE(slot.idle_deadline);  // fired once
  slot.idle_deadline = t0 + 60s;
  slot.idle_rev = 2;
  auto save = plan_builder(st).idle_checkpoint(0, t0 + 60s);
  REQUIRE(save);
  CHECK(save->revision == 2);
}

TEST_CASE("a flush saves a dirty owner only; a dispose lets go of a clean one only",
          "[core][plan_builder]") {
  auto st = enabled_pool_state();
  own(st, session("A"));
  const auto a = st.keys.key(session("A"));
  CHECK_FALSE(plan_builder(st).release_session(a));
  CHECK(st.table.owner(0) == a);
  CHECK(plan_builder(st).checkpoint_session(a, t0));
  CHECK_FALSE(plan_builder(st).checkpoint_session("nobody", t0));
  own(st, session("A"), false);
  CHECK_FALSE(plan_builder(st).checkpoint_slot(0, t0));  // clean: coalesced
  CHECK(plan_builder(st).release_session(a));
  CHECK(st.table.owner(0).empty());
  CHECK(plan_builder(st).release_session(a));  // owns nothing: nothing to keep
}

TEST_CASE("invalidate counts what it marks; forget drops the record and the ownership",
          "[core][plan_builder]") {
  auto st = enabled_pool_state();
  const auto a = st.keys.key(session("A"));
  CHECK_FALSE(plan_builder(st).invalidate(a, errc::operator_invalidated, wall));
  CHECK(st.stats.invalidations == 0);
  saved(st, session("A"));
  auto m = plan_builder(st).invalidate(a, errc::operator_invalidated, wall, "stale");
  REQUIRE(m);
  CHECK(m->invalid_note == "stale");
  CHECK(st.stats.invalidations == 1);
  own(st, session("A"));
  CHECK(plan_builder(st).forget(a));
  CHECK(st.table.owner(0).empty());
  CHECK(st.records.find(a) == nullptr);
  CHECK_FALSE(plan_builder(st).forget(a));
}

TEST_CASE("the door for a slot: the request's session and credential against its content",
          "[core][plan_builder]") {
  slot_pool_options o;
  o.seed_within_credential = true;
  auto st = enabled_pool_state(1, o);
  own(st, session("A"));
  st.tenants.note_credential("key-B");
  CHECK(plan_builder(st).door_for(0, session("A")) == door_answer::run);
  CHECK(plan_builder(st).door_for(0, session("X", "key-B")) == door_answer::erase_or_refuse);
  CHECK(plan_builder(st).door_for(7, session("A")) == door_answer::erase_or_refuse);  // no such slot
}

}  // namespace plan_builder_test
