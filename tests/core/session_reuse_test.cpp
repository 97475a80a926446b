// Per-session reuse counters of core/slot_pool.hpp (README "Dashboard"): restores into a slot
// for the session (own snapshot or a seed), prompt tokens reused on every one of its requests,
// and the part of them, with the prefill seconds saved, that the aggregate metrics count (the
// first request after a restore). Single slot, fake clock, no I/O.
#include "core/slot_pool.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "tests/support/chains.hpp"
#include "tests/support/plan_calls.hpp"
#include "tests/support/core_strings.hpp"
#include "tests/support/runtime.hpp"

namespace session_reuse_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

// Single-slot pools (slot_pool_options::slot_id left at its default): their one slot.
constexpr int only_slot = 0;

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(24);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

using kvp::testing::chain;

request_identity who(std::string id, std::vector<chain_link> c) {
  return request_identity{std::move(id), "", std::move(c), "k1"};
}

slot_pool make_pool() {
  slot_pool_options o;
  o.instance_key = "test-instance";
  o.idle_checkpoint = 0ms;
  slot_pool p(o);
  p.set_runtime(kvp::testing::qwen7b_runtime());
  return p;
}

// One request of `w`, every planned call succeeding; returns how it was prepared.
prepare_kind request(slot_pool& p, const request_identity& w) {
  return kvp::testing::run_plan(p, w, p.plans().prepare(w, only_slot, t0, wall), t0, wall);
}

session_reuse reuse_of(const slot_pool& p, const std::string& id) {
  const auto v = p.listing().session(p.hash_for(id));
  REQUIRE(v);
  return v->reuse;
}

}  // namespace

TEST_CASE("a session counts its restores and every request's reuse", "[core][reuse]") {
  auto p = make_pool();
  const auto A = who("A", chain({1, 2})), B = who("B", chain({7, 8}));
  const auto a = p.hash_for("A");
  REQUIRE(request(p, A) == prepare_kind::cold);
  p.outcomes().note_reuse(a, prepare_kind::cold, 0, 1000.0);
  REQUIRE(request(p, A) == prepare_kind::resident);
  p.outcomes().note_reuse(a, prepare_kind::resident, 40, 1000.0);
  CHECK(reuse_of(p, "A").restores == 0);
  CHECK(reuse_of(p, "A").reused_tokens == 40);
  CHECK(reuse_of(p, "A").reused_after_restore == 0);
  CHECK(reuse_of(p, "A").prefill_seconds_saved == 0.0);

  REQUIRE(request(p, B) == prepare_kind::cold);  // A is saved on the switch
  REQUIRE(request(p, A) == prepare_kind::restored);
  p.outcomes().note_reuse(a, prepare_kind::restored, 90, 1000.0);
  REQUIRE(request(p, A) == prepare_kind::resident);
  p.outcomes().note_reuse(a, prepare_kind::resident, 120, 1000.0);
  const auto r = reuse_of(p, "A");
  CHECK(r.restores == 1);
  CHECK(r.reused_tokens == 40 + 90 + 120);
  CHECK(r.reused_after_restore == 90);
  CHECK(r.prefill_seconds_saved == Approx(0.09));
  CHECK(reuse_of(p, "B").restores == 0);
  CHECK(reuse_of(p, "B").reused_tokens == 0);
}

TEST_CASE("a seed restore counts for the session it was restored for", "[core][reuse]") {
  auto p = make_pool();
  const auto A = who("A", chain({1, 2, 3})), B = who("B", chain({1, 2, 9}));
  REQUIRE(request(p, A) == prepare_kind::cold);
  REQUIRE(request(p, who("other", chain({99}))) == prepare_kind::cold);
  REQUIRE(request(p, B) == prepare_kind::restored);  // seeded from A's snapshot
  p.outcomes().note_reuse(p.hash_for("B"), prepare_kind::restored, 50, 0.0);
  CHECK(reuse_of(p, "B").restores == 1);
  CHECK(reuse_of(p, "B").reused_after_restore == 50);
  CHECK(reuse_of(p, "B").prefill_seconds_saved == 0.0);  // the prompt speed is not known yet
  CHECK(reuse_of(p, "A").restores == 0);
  CHECK(reuse_of(p, "A").reused_tokens == 0);
}

TEST_CASE("reuse of an unknown or forgotten session is not recorded", "[core][reuse]") {
  auto p = make_pool();
  const auto A = who("A", chain({1}));
  REQUIRE(request(p, A) == prepare_kind::cold);
  p.outcomes().note_reuse(p.hash_for("nobody"), prepare_kind::resident, 10, 1.0);
  CHECK_FALSE(p.listing().session(p.hash_for("nobody")));
  p.outcomes().note_reuse(p.hash_for("A"), prepare_kind::resident, 10, 1.0);
  REQUIRE(p.plans().forget(p.hash_for("A")));
  REQUIRE(request(p, A) == prepare_kind::cold);
  CHECK(reuse_of(p, "A").reused_tokens == 0);
}

}  // namespace session_reuse_test
