// Tests for seeding in core/slot_pool.hpp (docs/design.md §3): a session without a usable
// snapshot of its own starts from the snapshot, or the slot content, that shares the most
// prefix links with its request, within the sharing scope.
#include "core/slot_pool.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "core/prefix_snapshot.hpp"
#include "tests/support/chains.hpp"
#include "tests/support/plan_calls.hpp"

#include "tests/support/runtime.hpp"

namespace slot_pool_seeding_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

// Single-slot pools (slot_pool_options::slot_id left at its default): their one slot.
constexpr int only_slot = 0;

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(24);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

using kvp::testing::chain;

request_identity who(std::string id, std::vector<chain_link> c, std::string credential = "k1") {
  return request_identity{std::move(id), "", std::move(c), std::move(credential)};
}

slot_pool make_pool(bool across = true, bool within_credential = false) {
  slot_pool_options o;
  o.instance_key = "test-instance";
  o.idle_checkpoint = 0ms;
  o.seed_across_sessions = across;
  o.seed_within_credential = within_credential;
  slot_pool p(o);
  p.set_runtime(kvp::testing::qwen7b_runtime());
  return p;
}

// Runs `plan`'s calls as if each succeeded (a restore reports the expected tokens), then the
// inference; returns what the request started as.
prepare_kind run(slot_pool& p, const request_identity& w, const prepare_plan& plan) {
  return kvp::testing::run_plan(p, w, plan, t0, wall);
}

prepare_kind request(slot_pool& p, const request_identity& w) {
  return run(p, w, p.plans().prepare(w, only_slot, t0, wall));
}

// A's turn, then a checkpoint: A has a ready snapshot of `c` and still owns the slot.
void saved(slot_pool& p, const request_identity& a) {
  request(p, a);
  auto s = p.plans().checkpoint_slot(only_slot, t0);
  REQUIRE(s);
  auto d = p.outcomes().on_save(*s, slot_saved{100, 4096, 1.0}, t0, wall);
  REQUIRE(d.ok());
  p.outcomes().store_manifest(d.value());
}

// `a`'s turn saved as a snapshot of `bytes` bytes.
void saved_of_size(slot_pool& p, const request_identity& a, std::uint64_t bytes) {
  request(p, a);
  auto s = p.plans().checkpoint_slot(only_slot, t0);
  REQUIRE(s);
  auto d = p.outcomes().on_save(*s, slot_saved{bytes / 1000, bytes, 1.0}, t0, wall);
  REQUIRE(d.ok());
  p.outcomes().store_manifest(d.value());
}

// Another session with an unrelated prompt takes the slot (A is saved first if dirty).
void evict(slot_pool& p) { request(p, who("other", chain({99, 98}))); }

}  // namespace

TEST_CASE("a new session is seeded from the snapshot sharing most links", "[core][seeding]") {
  auto p = make_pool();
  const auto A = who("A", chain({1, 2, 3})), C = who("C", chain({1, 5}));
  saved(p, A);
  evict(p);
  saved(p, C);
  evict(p);
  const auto B = who("B", chain({1, 2, 7}));
  const auto plan = p.plans().prepare(B, only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for("A"));
  CHECK(plan.restore->filename == p.records().find_manifest(p.hash_for("A"))->snapshot_file());
  CHECK(plan.restore->seed_for == p.hash_for("B"));
  CHECK(plan.restore->common_links == 2);
  CHECK_FALSE(plan.erase);
  CHECK(run(p, B, plan) == prepare_kind::restored);
  CHECK(p.table().owner(only_slot) == p.hash_for("B"));
  // B's first save is its own file, with its own chain.
  auto s = p.plans().checkpoint_slot(only_slot, t0);
  REQUIRE(s);
  CHECK(s->hash == p.hash_for("B"));
  auto d = p.outcomes().on_save(*s, slot_saved{120, 4096, 1.0}, t0, wall);
  REQUIRE(d.ok());
  CHECK(d->chain == B.chain);
  CHECK(d->credential == "k1");
}

TEST_CASE("among snapshots sharing most links the seed reads the fewest bytes",
          "[core][seeding][prefix_snapshot]") {
  auto p = make_pool();
  // A donor four times the preamble, then the preamble alone (a prefix snapshot), then
  // another donor indexed last: the prefix snapshot seeds, though not indexed last.
  const auto donor = who("donor", chain({1, 2, 3, 4}));
  const auto prefix = who(prefix_session_id(chain({1})[0]), chain({1}));
  const auto later = who("later", chain({1, 6, 7}));
  saved_of_size(p, donor, 4'000'000);
  evict(p);
  saved_of_size(p, prefix, 1'000'000);
  evict(p);
  saved_of_size(p, later, 3'000'000);
  evict(p);
  const auto B = who("B", chain({1, 9}));
  auto plan = p.plans().prepare(B, only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for(prefix));
  CHECK(plan.restore->expected_bytes == 1'000'000);
  CHECK(plan.restore->common_links == 1);
  run(p, B, plan);
  // A request sharing two links with the donor still starts from the donor: more reused.
  const auto C = who("C", chain({1, 2, 8}));
  plan = p.plans().prepare(C, only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for(donor));
  CHECK(plan.restore->common_links == 2);
}

TEST_CASE("no seed without the first link in common", "[core][seeding]") {
  auto p = make_pool();
  saved(p, who("A", chain({1, 2, 3})));
  evict(p);
  const auto plan = p.plans().prepare(who("B", chain({4, 2, 3})), only_slot, t0, wall);
  CHECK_FALSE(plan.restore);
  // The slot's content is kept all the same (docs/design.md §20): nothing the chain can see
  // is shared, and llama-server reuses whatever tokens are.
  CHECK_FALSE(plan.erase);
  CHECK(plan.kept);
  CHECK(plan.kept_links == 0);
}

TEST_CASE("an empty preamble needs a message in common too", "[core][seeding]") {
  auto p = make_pool();
  auto bare = [](std::string id, std::vector<chain_link> c) {
    auto w = who(std::move(id), std::move(c));
    w.min_shared_links = 2;
    return w;
  };
  request(p, bare("A", chain({0, 1})));
  auto plan = p.plans().prepare(bare("B", chain({0, 2})), only_slot, t0, wall);
  CHECK(plan.kept);  // the slot shares only the empty link 0, which counts as nothing
  CHECK(plan.kept_links == 0);
  run(p, bare("B", chain({0, 2})), plan);  // A was saved first
  evict(p);                                // and B now
  CHECK_FALSE(p.plans().prepare(bare("E", chain({0, 9})), only_slot, t0, wall).restore);
  plan = p.plans().prepare(bare("D", chain({0, 2, 5})), only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for("B"));
}

TEST_CASE("a session's own snapshot wins unless another shares more", "[core][seeding]") {
  auto p = make_pool();
  saved(p, who("A", chain({1, 2, 3, 4})));
  evict(p);
  saved(p, who("B", chain({1, 2})));
  evict(p);
  SECTION("own shares as much: own") {
    const auto plan = p.plans().prepare(who("B", chain({1, 2, 8})), only_slot, t0, wall);
    REQUIRE(plan.restore);
    CHECK(plan.restore->hash == p.hash_for("B"));
    CHECK(plan.restore->seed_for.empty());
  }
  SECTION("another shares more (B was compacted into A's prefix): the other") {
    const auto plan = p.plans().prepare(who("B", chain({1, 2, 3, 9})), only_slot, t0, wall);
    REQUIRE(plan.restore);
    CHECK(plan.restore->hash == p.hash_for("A"));
    CHECK(plan.restore->common_links == 3);
  }
  SECTION("a request without a chain: own, as before seeding") {
    const auto plan = p.plans().prepare(who("B", {}), only_slot, t0, wall);
    REQUIRE(plan.restore);
    CHECK(plan.restore->hash == p.hash_for("B"));
  }
}

TEST_CASE("the slot's content is kept when it shares the most", "[core][seeding]") {
  auto p = make_pool();
  request(p, who("A", chain({1, 2, 3})));  // A owns the slot, dirty, no snapshot yet
  const auto B = who("B", chain({1, 2, 9}));
  const auto plan = p.plans().prepare(B, only_slot, t0, wall);
  REQUIRE(plan.save);  // A is saved first, as on any switch
  CHECK(plan.save->hash == p.hash_for("A"));
  CHECK_FALSE(plan.restore);  // A's new snapshot would share as much: no reload needed
  CHECK_FALSE(plan.erase);
  CHECK(plan.kept_links == 2);
  CHECK(run(p, B, plan) == prepare_kind::cold);
  CHECK(p.table().owner(only_slot) == p.hash_for("B"));
}

TEST_CASE("sharing: session never seeds nor keeps", "[core][seeding]") {
  auto p = make_pool(false);
  request(p, who("A", chain({1, 2, 3})));
  auto plan = p.plans().prepare(who("B", chain({1, 2, 9})), only_slot, t0, wall);
  CHECK(plan.erase);
  CHECK(plan.kept_links == 0);
  run(p, who("B", chain({1, 2, 9})), plan);
  evict(p);
  plan = p.plans().prepare(who("C", chain({1, 2, 3})), only_slot, t0, wall);
  CHECK_FALSE(plan.restore);
  CHECK(plan.erase);
}

TEST_CASE("sharing: credential seeds only within one credential", "[core][seeding]") {
  auto p = make_pool(true, true);
  saved(p, who("A", chain({1, 2, 3}), "k1"));
  SECTION("another key: the slot is not kept either") {
    const auto plan = p.plans().prepare(who("B", chain({1, 2, 3, 4}), "k2"), only_slot, t0, wall);
    CHECK_FALSE(plan.restore);
    CHECK(plan.erase);
    CHECK(plan.erase_required);  // docs/design.md §20: a failed erase fails the request
  }
  SECTION("the same key") {
    request(p, who("other", chain({99, 98}), "k1"));
    const auto plan = p.plans().prepare(who("B", chain({1, 2, 3, 4}), "k1"), only_slot, t0, wall);
    REQUIRE(plan.restore);
    CHECK(plan.restore->hash == p.hash_for(who("A", {}, "k1")));
  }
}

TEST_CASE("no seeding where a restored prefix is not reused", "[core][seeding]") {
  // doctor --verify judged the model kind experimental (sliding window, recurrent): only a
  // session's own snapshot, an exact continuation, is worth restoring.
  auto p = make_pool();
  p.set_compatibility("experimental");
  saved(p, who("A", chain({1, 2, 3})));
  evict(p);
  const auto plan = p.plans().prepare(who("B", chain({1, 2, 3, 4})), only_slot, t0, wall);
  CHECK_FALSE(plan.restore);
  CHECK(plan.erase);
}

TEST_CASE("seeds are ready snapshots of this runtime that are still known", "[core][seeding]") {
  auto p = make_pool();
  saved(p, who("A", chain({1, 2, 3})));
  evict(p);
  const auto B = who("B", chain({1, 2, 3, 4}));
  SECTION("invalidated") {
    REQUIRE(p.plans().invalidate(p.hash_for("A"), errc::snapshot_corrupt, wall));
    CHECK_FALSE(p.plans().prepare(B, only_slot, t0, wall).restore);
  }
  SECTION("forgotten (purge, retention)") {
    REQUIRE(p.plans().forget(p.hash_for("A")));
    CHECK_FALSE(p.plans().prepare(B, only_slot, t0, wall).restore);
  }
  SECTION("another runtime") {
    auto rt = kvp::testing::qwen7b_runtime();
    rt.build_info = "b7000-other";
    p.set_runtime(rt);
    CHECK_FALSE(p.plans().prepare(B, only_slot, t0, wall).restore);
  }
}

TEST_CASE("a seed that fails verification is invalidated, the requester runs cold",
          "[core][seeding]") {
  auto p = make_pool();
  saved(p, who("A", chain({1, 2, 3})));
  evict(p);
  const auto B = who("B", chain({1, 2, 9}));
  const auto plan = p.plans().prepare(B, only_slot, t0, wall);
  REQUIRE(plan.restore);
  const auto d = p.outcomes().on_restore(*plan.restore, slot_restored{3, 10, 1.0}, t0, wall);
  CHECK_FALSE(d.restored);
  CHECK(d.need_erase);
  REQUIRE(d.write);
  CHECK(d.write->session_hash == p.hash_for("A"));  // the donor's snapshot, not B's
  REQUIRE(p.outcomes().on_erase(only_slot, slot_erased{0}, t0));
  CHECK(p.outcomes().start_inference(B, only_slot) == prepare_kind::cold_fallback);
  CHECK(p.table().owner(only_slot) == p.hash_for("B"));
}

// How the proxy makes a prefix snapshot (docs/design.md §3, "Prefix snapshots"): a request of
// the session prefix:<last shared link>, whose chain is the shared links, planned like any
// other. It is seeded from the donor, runs the cut request, and its save is a snapshot whose
// manifest names only the shared links, under the donor's credential; the next new session
// sharing them starts from it, not from the donor.
TEST_CASE("a prefix snapshot is made as a session of its own and then seeds",
          "[core][seeding][prefix_snapshot]") {
  auto p = make_pool(true, true);  // sharing: credential
  const auto donor = who("donor", chain({1, 2, 3, 4}));
  saved_of_size(p, donor, 4'000'000);
  evict(p);
  const auto shared = std::vector<chain_link>{chain({1})[0]};
  const auto maker = who(prefix_session_id(shared.back()), shared);
  auto plan = p.plans().prepare(maker, only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for(donor));
  CHECK(plan.restore->seed_for == p.hash_for(maker));
  CHECK(run(p, maker, plan) == prepare_kind::restored);
  auto s = p.plans().checkpoint_slot(only_slot, t0);
  REQUIRE(s);
  CHECK(s->hash == p.hash_for(maker));
  auto m = p.outcomes().on_save(*s, slot_saved{1000, 1'000'000, 1.0}, t0, wall);
  REQUIRE(m.ok());
  CHECK(m->chain == shared);
  CHECK(m->credential == "k1");
  CHECK(is_prefix_session(m->session_id));
  p.outcomes().store_manifest(m.value());
  evict(p);
  const auto B = who("B", chain({1, 9}));
  plan = p.plans().prepare(B, only_slot, t0, wall);
  REQUIRE(plan.restore);
  CHECK(plan.restore->hash == p.hash_for(maker));
  CHECK(plan.restore->expected_bytes == 1'000'000);
  run(p, B, plan);
  // Another credential's request sharing the preamble: neither the donor nor its prefix.
  evict(p);
  const auto other = who("other-key", chain({1, 9}), "k2");
  plan = p.plans().prepare(other, only_slot, t0, wall);
  CHECK_FALSE(plan.restore);
}

}  // namespace slot_pool_seeding_test
