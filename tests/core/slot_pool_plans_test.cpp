// Tests for core/slot_pool.hpp (docs/design.md §3-§13 and §19; the invariants of §2).
// The core is driven the way proxy/control/coordinator drives it: plans in, hand-made backend
// results back, with a fake monotonic clock built from steady_time values. No I/O.
#include "core/slot_pool.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tests/support/core_strings.hpp"
#include "tests/support/runtime.hpp"

namespace slot_pool_plans_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

// Single-slot pools (slot_pool_options::slot_id left at its default): their one slot.
constexpr int only_slot = 0;

using namespace std::chrono_literals;
using namespace kvp::core;

// The fake clock: any fixed point will do, the core only compares and adds.
const steady_time t0 = steady_time{} + std::chrono::hours(24);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

runtime_info test_runtime() { return kvp::testing::qwen7b_runtime(); }

slot_pool_options test_options() {
  slot_pool_options o;
  o.instance_key = "test-instance";
  o.runtime_key = "qwen7b-f16kv";
  o.idle_checkpoint = 30s;
  return o;
}

// What the core must compute as the fingerprint: the runtime plus the configured runtimeKey.
std::string expected_fingerprint(const slot_pool_options& o = test_options(),
                                 runtime_info rt = test_runtime()) {
  rt.runtime_key = o.runtime_key;
  return rt.fingerprint();
}

slot_pool make_core(slot_pool_options o = test_options()) {
  slot_pool c(std::move(o));
  c.set_runtime(test_runtime());
  return c;
}

request_identity session(std::string id) { return request_identity{std::move(id), "", {}, ""}; }
request_identity auxiliary(std::string id, std::string purpose) {
  return request_identity{std::move(id), std::move(purpose), {}, ""};
}

result<slot_saved> saved(std::uint64_t tokens) {
  return slot_saved{tokens, 24 + tokens * 1024, 2.5};
}
result<slot_restored> restored(std::uint64_t tokens) {
  return slot_restored{tokens, 24 + tokens * 1024, 1.5};
}
result<slot_erased> erased(std::uint64_t n = 0) { return slot_erased{n}; }
error transport() { return error{errc::backend_unavailable, 0, "connect: Connection refused"}; }

// Requires a planned save and checks it: the session's hash, the generation, that generation's
// file and the dirty revision it captures.
void check_save(const prepare_plan& p, const std::string& hash, char generation,
                std::uint64_t revision) {
  REQUIRE(p.save);
  CHECK(p.save->hash == hash);
  CHECK(p.save->generation == generation);
  CHECK(p.save->filename == hash + "." + generation + ".bin");
  CHECK(p.save->revision == revision);
}

// A manifest as an earlier process would have written it for `id` under the test runtime.
manifest ready_manifest(const slot_pool& c, const std::string& id, char gen,
                        std::uint64_t tokens, std::uint64_t revision = 3,
                        std::string fingerprint = expected_fingerprint()) {
  manifest m;
  m.session_id = id;
  m.session_hash = c.hash_for(id);
  m.instance_key = "test-instance";
  m.model_id = test_runtime().model_path;
  m.runtime_fingerprint = std::move(fingerprint);
  m.generation = gen;
  m.tokens = tokens;
  m.bytes = 24 + tokens * 1024;
  m.revision = revision;
  m.created_at = m.updated_at = std::string(wall);
  return m;
}

// Carries out a request whose every management call succeeds, as proxy/control/coordinator would:
// save (and store the manifest), restore (reporting the expected tokens) or erase, then the
// inference, which reaches the slot. Saves report `saved_tokens`.
prepare_kind run_request(slot_pool& c, const request_identity& who, steady_time now,
                         std::uint64_t saved_tokens = 100) {
  auto plan = c.plans().prepare(who, only_slot, now, wall);
  REQUIRE_FALSE(plan.fail);
  for (const auto& m : plan.manifest_writes) c.outcomes().store_manifest(m);
  if (plan.save) {
    auto d = c.outcomes().on_save(*plan.save, saved(saved_tokens), now, wall);
    REQUIRE(d.ok());
    c.outcomes().store_manifest(d.value());
  }
  bool erase = plan.erase;
  if (plan.restore) {
    auto d =
        c.outcomes().on_restore(*plan.restore, restored(plan.restore->expected_tokens), now, wall);
    REQUIRE(d.restored);
    erase = erase || d.need_erase;
  }
  if (erase) REQUIRE(c.outcomes().on_erase(only_slot, erased(), now));
  const auto kind = c.outcomes().start_inference(who, only_slot);
  if (auto s = c.outcomes().end_inference(only_slot, true, now)) {
    auto d = c.outcomes().on_save(*s, saved(saved_tokens), now, wall);
    REQUIRE(d.ok());
    c.outcomes().store_manifest(d.value());
  }
  return kind;
}

// Saves the dirty owner through checkpoint_owner and stores its manifest.
void checkpoint(slot_pool& c, steady_time now, std::uint64_t tokens) {
  auto s = c.plans().checkpoint_slot(only_slot, now);
  REQUIRE(s);
  auto d = c.outcomes().on_save(*s, saved(tokens), now, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
}

}  // namespace

TEST_CASE("a session goes cold, dirty, saving and clean (docs/design.md §7)", "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  CHECK(c.table().state(only_slot) == slot_state::unknown);
  CHECK(c.table().owner(only_slot).empty());

  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  CHECK(p.erase);
  CHECK_FALSE(p.save);
  CHECK_FALSE(p.restore);
  CHECK_FALSE(p.resident);
  CHECK(p.manifest_writes.empty());
  CHECK(c.outcomes().on_erase(only_slot, erased(), t0));
  CHECK(c.table().state(only_slot) == slot_state::idle);

  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold);
  CHECK(c.table().owner(only_slot) == a);
  CHECK(c.table().state(only_slot) == slot_state::inference);

  CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 1s));
  CHECK(c.table().state(only_slot) == slot_state::dirty);
  CHECK(c.records().dirty(c.table().owner(only_slot)));

  auto s = c.plans().checkpoint_slot(only_slot, t0 + 2s);
  REQUIRE(s);
  CHECK(c.table().state(only_slot) == slot_state::saving);
  CHECK(s->hash == a);
  CHECK(s->slot == 0);
  CHECK(s->revision == 1);

  auto d = c.outcomes().on_save(*s, saved(2124), t0 + 3s, wall);
  REQUIRE(d.ok());
  // Not clean until the manifest is durable.
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  c.outcomes().store_manifest(d.value());
  CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::ready);
  CHECK(c.table().owner(only_slot) == a);

  CHECK(c.stats().cold_starts == 1);
  CHECK(c.stats().saves == 1);
  CHECK(c.stats().save_bytes == 24 + 2124 * 1024);
}

TEST_CASE("request A, A, B, A plans exactly the milestone's calls (docs/design.md §6)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  const auto b = c.hash_for("B");
  REQUIRE(a != b);

  // A #1: erase only.
  auto p1 = c.plans().prepare(session("A"), only_slot, t0, wall);
  CHECK(p1.erase);
  CHECK_FALSE(p1.save);
  CHECK_FALSE(p1.restore);
  CHECK_FALSE(p1.resident);
  REQUIRE(c.outcomes().on_erase(only_slot, erased(), t0));
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold);
  CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 1s));

  // A #2: resident, no calls at all.
  auto p2 = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  CHECK(p2.resident);
  CHECK_FALSE(p2.erase);
  CHECK_FALSE(p2.save);
  CHECK_FALSE(p2.restore);
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::resident);
  CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 3s));

  // B: save A into generation 'a'; B's cold start keeps A's content (docs/design.md §20:
  // llama-server reuses the common token prefix, which is never worse than an erase).
  auto p3 = c.plans().prepare(session("B"), only_slot, t0 + 4s, wall);
  CHECK_FALSE(p3.resident);
  check_save(p3, a, 'a', 2);
  CHECK_FALSE(p3.erase);
  CHECK(p3.kept);
  CHECK_FALSE(p3.restore);
  CHECK(c.table().state(only_slot) == slot_state::saving);

  auto d3 = c.outcomes().on_save(*p3.save, saved(1500), t0 + 5s, wall);
  REQUIRE(d3.ok());
  CHECK(d3->session_id == "A");
  CHECK(d3->session_hash == a);
  CHECK(d3->generation == 'a');
  CHECK(d3->snapshot_file() == a + ".a.bin");
  CHECK(d3->tokens == 1500);
  CHECK(d3->bytes == 24 + 1500 * 1024);
  CHECK(d3->revision == 2);
  CHECK(d3->state == snapshot_state::ready);
  CHECK(d3->instance_key == "test-instance");
  CHECK(d3->model_id == test_runtime().model_path);
  CHECK(d3->runtime_fingerprint == expected_fingerprint());
  CHECK(d3->created_at == wall);
  c.outcomes().store_manifest(d3.value());
  REQUIRE(c.outcomes().on_erase(only_slot, erased(1500), t0 + 5s));
  CHECK(c.outcomes().start_inference(session("B"), only_slot) == prepare_kind::cold);
  CHECK(c.table().owner(only_slot) == b);
  CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 6s));

  // A #3: save B, restore A with A's token count.
  auto p4 = c.plans().prepare(session("A"), only_slot, t0 + 7s, wall);
  CHECK_FALSE(p4.resident);
  check_save(p4, b, 'a', 1);
  REQUIRE(p4.restore);
  CHECK(p4.restore->hash == a);
  CHECK(p4.restore->filename == a + ".a.bin");
  CHECK(p4.restore->expected_tokens == 1500);
  CHECK_FALSE(p4.erase);

  auto d4 = c.outcomes().on_save(*p4.save, saved(900), t0 + 8s, wall);
  REQUIRE(d4.ok());
  c.outcomes().store_manifest(d4.value());
  auto r4 = c.outcomes().on_restore(*p4.restore, restored(1500), t0 + 8s, wall);
  CHECK(r4.restored);
  CHECK_FALSE(r4.need_erase);
  CHECK_FALSE(r4.write);
  CHECK(c.table().state(only_slot) == slot_state::ready);
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::restored);
  CHECK(c.table().owner(only_slot) == a);

  CHECK(c.stats().switches == 2);
  CHECK(c.stats().saves == 2);
  CHECK(c.stats().restores == 1);
  CHECK(c.stats().restore_hits == 1);
  CHECK(c.stats().cold_starts == 2);
}

TEST_CASE("saves rotate generations a, b, a and restores follow the manifest (docs/design.md §8)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");

  run_request(c, session("A"), t0);
  auto s1 = c.plans().checkpoint_slot(only_slot, t0 + 1s);
  REQUIRE(s1);
  CHECK(s1->generation == 'a');
  CHECK(s1->filename == a + ".a.bin");
  auto d1 = c.outcomes().on_save(*s1, saved(100), t0 + 1s, wall);
  REQUIRE(d1.ok());
  c.outcomes().store_manifest(d1.value());
  CHECK(c.records().find_manifest(a)->generation == 'a');

  run_request(c, session("A"), t0 + 2s);
  auto s2 = c.plans().checkpoint_slot(only_slot, t0 + 3s);
  REQUIRE(s2);
  CHECK(s2->generation == 'b');
  CHECK(s2->filename == a + ".b.bin");

  SECTION("a stored save switches the manifest to the new generation") {
    auto d2 = c.outcomes().on_save(*s2, saved(200), t0 + 3s, wall);
    REQUIRE(d2.ok());
    CHECK(d2->generation == 'b');
    CHECK(d2->created_at == wall);
    c.outcomes().store_manifest(d2.value());
    CHECK(c.records().find_manifest(a)->generation == 'b');
    CHECK(c.records().find_manifest(a)->tokens == 200);

    run_request(c, session("A"), t0 + 4s);
    auto s3 = c.plans().checkpoint_slot(only_slot, t0 + 5s);
    REQUIRE(s3);
    CHECK(s3->generation == 'a');
    CHECK(s3->filename == a + ".a.bin");
    auto d3 = c.outcomes().on_save(*s3, saved(300), t0 + 5s, wall);
    c.outcomes().store_manifest(d3.value());

    // A restore reads the generation the manifest points at.
    run_request(c, session("B"), t0 + 6s);
    auto p = c.plans().prepare(session("A"), only_slot, t0 + 7s, wall);
    REQUIRE(p.restore);
    CHECK(p.restore->filename == a + ".a.bin");
    CHECK(p.restore->expected_tokens == 300);
  }

  SECTION("a save whose manifest was never stored does not rotate") {
    // The server wrote b, but the manifest write failed: the manifest still points at a,
    // and the next save targets b again, never the last good file.
    auto d2 = c.outcomes().on_save(*s2, saved(200), t0 + 3s, wall);
    REQUIRE(d2.ok());
    CHECK(c.records().find_manifest(a)->generation == 'a');
    CHECK(c.records().dirty(c.table().owner(only_slot)));
    auto again = c.plans().checkpoint_slot(only_slot, t0 + 4s);
    REQUIRE(again);
    CHECK(again->generation == 'b');
    CHECK(again->filename == a + ".b.bin");
  }
}

TEST_CASE("a save of revision N while revision N+1 happens leaves the slot dirty (docs/design.md §7)",
          "[core][slot_pool]") {
  auto c = make_core();
  run_request(c, session("A"), t0);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 1s);
  REQUIRE(s);
  CHECK(s->revision == 1);

  // Another turn of A completes before the save's result is in.
  auto p = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  CHECK(p.resident);
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 3s);

  auto d = c.outcomes().on_save(*s, saved(100), t0 + 4s, wall);
  REQUIRE(d.ok());
  CHECK(d->revision == 1);
  c.outcomes().store_manifest(d.value());
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::dirty);

  auto s2 = c.plans().checkpoint_slot(only_slot, t0 + 5s);
  REQUIRE(s2);
  CHECK(s2->revision == 2);
  auto d2 = c.outcomes().on_save(*s2, saved(180), t0 + 6s, wall);
  c.outcomes().store_manifest(d2.value());
  CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::ready);
}

TEST_CASE("checkpoint requests for the same revision coalesce (docs/design.md §7)",
          "[core][slot_pool]") {
  auto c = make_core();
  CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0));  // nobody owns the slot

  run_request(c, session("A"), t0);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 1s);
  REQUIRE(s);
  CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0 + 1s));  // one is in flight for this revision
  auto d = c.outcomes().on_save(*s, saved(100), t0 + 2s, wall);
  c.outcomes().store_manifest(d.value());
  CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0 + 3s));  // clean: nothing to do
  CHECK_FALSE(c.table().idle_deadline());            // the flush superseded the idle timer
  CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 1h));
  CHECK(c.stats().saves == 1);
}

TEST_CASE("the early checkpoint follows a turn end, waits at least twice the last save, and "
          "never longer than idleMs (docs/design.md §10)",
          "[core][slot_pool]") {
  auto o = test_options();
  o.early_checkpoint = 2s;
  auto c = make_core(o);
  const auto a = c.hash_for("A");
  run_request(c, session("B"), t0 - 5s);  // two sessions take turns: the slot is contended
  run_request(c, session("A"), t0);  // a tool step, not a turn end: the idle deadline
  CHECK(c.table().idle_deadline() == t0 + 30s);

  auto end_turn = [&](steady_time now) {
    REQUIRE(c.plans().prepare(session("A"), only_slot, now, wall).resident);
    c.outcomes().start_inference(session("A"), only_slot);
    CHECK_FALSE(c.outcomes().end_inference(only_slot, true, now,
                                           true));  // no save on the spot: onTurnEnd is off
  };
  end_turn(t0 + 1s);
  CHECK(c.table().idle_deadline() == t0 + 3s);  // earlyMs: no save measured yet
  auto s = c.plans().idle_checkpoint(only_slot, t0 + 3s);
  REQUIRE(s);
  CHECK(s->hash == a);
  auto d =
      c.outcomes().on_save(*s, slot_saved{100, 24 + 100 * 1024, 1500.0}, t0 + 4s, wall);  // 1.5 s
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
  CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));

  end_turn(t0 + 10s);
  CHECK(c.table().idle_deadline() == t0 + 13s);  // twice the last save (3 s) is more than earlyMs

  SECTION("a big snapshot waits no longer than the idle checkpoint would") {
    auto big = c.outcomes().on_save(*c.plans().checkpoint_slot(only_slot, t0 + 11s),
                                    slot_saved{100, 1 << 20, 20'000.0}, t0 + 31s, wall);
    c.outcomes().store_manifest(big.value());
    end_turn(t0 + 40s);
    CHECK(c.table().idle_deadline() == t0 + 70s);
  }
  SECTION("a single conversation never pays for it: only the idle checkpoint") {
    auto alone = make_core(o);
    run_request(alone, session("A"), t0);
    REQUIRE(alone.plans().prepare(session("A"), only_slot, t0 + 1s, wall).resident);
    alone.outcomes().start_inference(session("A"), only_slot);
    alone.outcomes().end_inference(only_slot, true, t0 + 1s, true);
    CHECK(alone.table().idle_deadline() == t0 + 31s);
  }
  SECTION("contention ends when the other session has taken no turn for contention_window") {
    REQUIRE(c.plans().prepare(session("A"), only_slot, t0 + 11min, wall).resident);
    c.outcomes().start_inference(session("A"), only_slot);
    c.outcomes().end_inference(only_slot, true, t0 + 11min, true);
    CHECK(c.table().idle_deadline() == t0 + 11min + 30s);
  }
  SECTION("with earlyMs 0 a turn end arms the idle deadline only") {
    auto plain = make_core();
    run_request(plain, session("A"), t0);
    REQUIRE(plain.plans().prepare(session("A"), only_slot, t0 + 1s, wall).resident);
    plain.outcomes().start_inference(session("A"), only_slot);
    plain.outcomes().end_inference(only_slot, true, t0 + 1s, true);
    CHECK(plain.table().idle_deadline() == t0 + 31s);
  }
}

TEST_CASE("a commit that fails after the save leaves the previous snapshot current and the "
          "session dirty (docs/design.md §11)",
          "[core][slot_pool]") {
  auto c = make_core();
  run_request(c, session("A"), t0);
  checkpoint(c, t0 + 1s, 100);  // generation a, committed
  run_request(c, session("A"), t0 + 2s);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 3s);
  REQUIRE(s);
  CHECK(s->generation == 'b');
  auto d = c.outcomes().on_save(*s, saved(200), t0 + 3s, wall);
  REQUIRE(d.ok());
  const auto saves = c.stats().saves;
  c.outcomes().on_commit_failed(error{errc::file_io_timeout, 0, "manifest write took too long"},
                                t0 + 4s);
  CHECK(c.stats().saves == saves - 1);
  CHECK(c.stats().save_failures == 1);
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.records().find_manifest(c.hash_for("A"))->generation == 'a');
  CHECK(c.health().circuit().consecutive_failures() ==
        1);  // a stuck filesystem counts like a timeout
  auto again = c.plans().checkpoint_slot(only_slot, t0 + 5s);
  REQUIRE(again);
  CHECK(again->generation == 'b');
}

TEST_CASE(
    "the idle checkpoint fires once, at its deadline, for the same owner and revision "
    "(docs/design.md §10)",
    "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  const auto b = c.hash_for("B");
  run_request(c, session("A"), t0);
  REQUIRE(c.table().idle_deadline());
  CHECK(*c.table().idle_deadline() == t0 + 30s);

  SECTION("not before the deadline, once at it") {
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s - 1ms));
    CHECK(c.table().idle_deadline() == t0 + 30s);  // still armed
    auto s = c.plans().idle_checkpoint(only_slot, t0 + 30s);
    REQUIRE(s);
    CHECK(s->hash == a);
    CHECK(s->revision == 1);
    CHECK(c.table().state(only_slot) == slot_state::saving);
    CHECK_FALSE(c.table().idle_deadline());
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 31s));
    auto d = c.outcomes().on_save(*s, saved(100), t0 + 31s, wall);
    c.outcomes().store_manifest(d.value());
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 1h));
  }

  SECTION("a newer revision moves the deadline; the old one does nothing") {
    run_request(c, session("A"), t0 + 10s);
    CHECK(c.table().idle_deadline() == t0 + 40s);
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s));
    auto s = c.plans().idle_checkpoint(only_slot, t0 + 40s);
    REQUIRE(s);
    CHECK(s->revision == 2);
  }

  SECTION("a request that starts before the deadline cancels it") {
    auto p = c.plans().prepare(session("A"), only_slot, t0 + 29s, wall);
    CHECK(p.resident);
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s));
  }

  SECTION("an owner change: the old timer does not save the new owner early") {
    run_request(c, session("B"), t0 + 5s);  // saves A, B now owns the slot
    CHECK(c.table().owner(only_slot) == b);
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s));
    auto s = c.plans().idle_checkpoint(only_slot, t0 + 35s);
    REQUIRE(s);
    CHECK(s->hash == b);
  }

  SECTION("after an auxiliary request nobody owns the slot: no idle save") {
    run_request(c, auxiliary("A", "session-title"), t0 + 1s);
    CHECK(c.table().owner(only_slot).empty());
    CHECK_FALSE(c.table().idle_deadline());
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s));
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 31s));
  }

  SECTION("after an epoch change the slot is empty: no idle save") {
    c.table().on_epoch_change();
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 30s));
  }
}

TEST_CASE("idle checkpoints can be turned off, and a clean owner arms no timer",
          "[core][slot_pool]") {
  SECTION("idle 0") {
    auto o = test_options();
    o.idle_checkpoint = 0ms;
    auto c = make_core(o);
    run_request(c, session("A"), t0);
    CHECK(c.records().dirty(c.table().owner(only_slot)));
    CHECK_FALSE(c.table().idle_deadline());
    CHECK_FALSE(c.plans().idle_checkpoint(only_slot, t0 + 1h));
  }
  SECTION("a restored session whose request never reached the slot stays clean") {
    auto c = make_core();
    c.add_manifest(ready_manifest(c, "A", 'a', 100));
    auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
    REQUIRE(p.restore);
    REQUIRE(c.outcomes().on_restore(*p.restore, restored(100), t0, wall).restored);
    c.outcomes().start_inference(session("A"), only_slot);
    CHECK_FALSE(c.outcomes().end_inference(only_slot, false, t0 + 1s));
    CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));
    CHECK(c.table().state(only_slot) == slot_state::ready);
    CHECK_FALSE(c.table().idle_deadline());
  }
}

namespace {
// A core whose session A was loaded from a manifest of `revision`, restored, and then ran a
// turn that reached the slot (cancelled or not: docs/design.md §7).
slot_pool restored_turn(std::uint64_t revision) {
  auto c = make_core();
  c.add_manifest(ready_manifest(c, "A", 'a', 100, revision));
  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p.restore);
  REQUIRE(c.outcomes().on_restore(*p.restore, restored(100), t0, wall).restored);
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 1s);
  return c;
}
}  // namespace

TEST_CASE("a cancelled request that reached the slot still makes it dirty (docs/design.md §7)",
          "[core][slot_pool]") {
  auto c = restored_turn(3);
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 2s);
  REQUIRE(s);
  CHECK(s->revision == 4);  // the loaded manifest was revision 3
  CHECK(s->generation == 'b');
}

TEST_CASE("a revision at 2^64-1 still wraps to dirty and is saved (serial comparison)",
          "[core][slot_pool]") {
  // parse_manifest refuses revisions above 2^53; the comparison holds on its own too.
  auto c = restored_turn(UINT64_MAX);
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.listing().session(c.hash_for("A"))->dirty);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 2s);
  REQUIRE(s);
  CHECK(s->revision == 0);  // 2^64-1 + 1
  auto d = c.outcomes().on_save(*s, saved(120), t0 + 2s, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
  CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::ready);
  // The next turn is dirty again and the idle checkpoint still fires.
  c.plans().prepare(session("A"), only_slot, t0 + 3s, wall);
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 3s);
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.plans().idle_checkpoint(only_slot, t0 + 1h));
}

TEST_CASE(
    "a save of an emptied slot keeps the previous manifest and ends ownership "
    "(docs/design.md §8)",
    "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);
  checkpoint(c, t0 + 1s, 2124);
  run_request(c, session("A"), t0 + 2s);  // dirty again

  auto p = c.plans().prepare(session("B"), only_slot, t0 + 3s, wall);
  REQUIRE(p.save);
  CHECK(p.save->generation == 'b');
  auto d = c.outcomes().on_save(*p.save, slot_saved{0, 24, 0.1}, t0 + 3s, wall);
  CHECK_FALSE(d.ok());
  CHECK(d.err().code == errc::save_empty);
  CHECK(c.table().owner(only_slot).empty());
  CHECK(c.table().state(only_slot) == slot_state::unknown);
  const manifest* m = c.records().find_manifest(a);
  REQUIRE(m);
  CHECK(m->generation == 'a');
  CHECK(m->tokens == 2124);
  CHECK(m->state == snapshot_state::ready);
  CHECK(c.stats().empty_saves == 1);
  CHECK(c.stats().saves == 1);
  CHECK(c.health().circuit().consecutive_failures() == 0);

  // B continues cold on the slot as it is; A later restores the last good generation.
  REQUIRE(p.kept);
  CHECK(c.outcomes().start_inference(session("B"), only_slot) == prepare_kind::cold);
  c.outcomes().end_inference(only_slot, true, t0 + 4s);
  auto p2 = c.plans().prepare(session("A"), only_slot, t0 + 5s, wall);
  REQUIRE(p2.restore);
  CHECK(p2.restore->filename == a + ".a.bin");
  CHECK(p2.restore->expected_tokens == 2124);
}

TEST_CASE("a save that wrote no bytes is a failure, not a snapshot", "[core][slot_pool]") {
  auto c = make_core();
  run_request(c, session("A"), t0);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 1s);
  REQUIRE(s);
  auto d = c.outcomes().on_save(*s, slot_saved{100, 0, 0.1}, t0 + 1s, wall);
  CHECK_FALSE(d.ok());
  CHECK(d.err().code == errc::save_failed);
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::dirty);
  CHECK(c.stats().save_failures == 1);
}

TEST_CASE(
    "a failed save on a switch keeps the old snapshot and lets the new session run "
    "(docs/design.md §13)",
    "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);
  checkpoint(c, t0 + 1s, 100);
  run_request(c, session("A"), t0 + 2s);

  auto p = c.plans().prepare(session("B"), only_slot, t0 + 3s, wall);
  REQUIRE(p.save);
  auto d = c.outcomes().on_save(*p.save, error{errc::save_failed, 500, "Unable to save slot"},
                                t0 + 3s, wall);
  CHECK_FALSE(d.ok());
  CHECK(d.err().code == errc::save_failed);
  CHECK(d.err().http_status == 500);
  CHECK(c.health().circuit().consecutive_failures() == 1);  // a 5xx is the server's fault
  CHECK(c.table().state(only_slot) == slot_state::dirty);
  REQUIRE(p.kept);
  CHECK_FALSE(p.erase);
  CHECK(c.outcomes().start_inference(session("B"), only_slot) == prepare_kind::cold);
  CHECK(c.records().find_manifest(a)->generation == 'a');
  CHECK(c.records().find_manifest(a)->tokens == 100);
  CHECK(c.stats().save_failures == 1);
}

TEST_CASE("restore outcomes are verified (docs/design.md §9, invariant 10)", "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  c.add_manifest(ready_manifest(c, "A", 'b', 2124));
  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p.restore);
  CHECK(p.restore->filename == a + ".b.bin");
  CHECK(p.restore->expected_tokens == 2124);
  CHECK_FALSE(p.erase);
  CHECK_FALSE(p.save);
  CHECK(c.table().state(only_slot) == slot_state::restoring);

  SECTION("the token count matches: restored") {
    auto d = c.outcomes().on_restore(*p.restore, restored(2124), t0, wall);
    CHECK(d.restored);
    CHECK_FALSE(d.need_erase);
    CHECK_FALSE(d.write);
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::restored);
    CHECK(c.stats().restore_bytes == 24 + 2124 * 1024);
  }

  SECTION("200 with fewer tokens: invalid, erase, cold, never retried") {
    auto d = c.outcomes().on_restore(*p.restore, restored(2000), t0, wall);
    CHECK_FALSE(d.restored);
    CHECK(d.need_erase);
    CHECK(d.err.code == errc::snapshot_corrupt);
    REQUIRE(d.write);
    CHECK(d.write->state == snapshot_state::invalid);
    CHECK(d.write->invalid_reason == "KV_SNAPSHOT_CORRUPT");
    CHECK(d.write->generation == 'b');  // marked, not deleted or moved
    CHECK(d.write->session_hash == a);
    CHECK(c.table().state(only_slot) == slot_state::unknown);
    c.outcomes().store_manifest(*d.write);
    REQUIRE(c.outcomes().on_erase(only_slot, erased(2000), t0));
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold_fallback);
    CHECK(c.stats().restore_failures == 1);
    CHECK(c.stats().invalidations == 1);
    CHECK(c.stats().cold_starts == 1);
    CHECK(c.health().circuit().consecutive_failures() == 0);

    c.outcomes().end_inference(only_slot, true, t0 + 1s);
    c.table().on_epoch_change();
    auto p2 = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
    CHECK_FALSE(p2.restore);
    CHECK_FALSE(p2.erase);  // a new server process: the slot is empty, nothing to erase
    CHECK(c.table().content(0).whose == content_whose::empty);
  }

  SECTION("200 with zero tokens is not a restore") {
    auto d = c.outcomes().on_restore(*p.restore, restored(0), t0, wall);
    CHECK_FALSE(d.restored);
    CHECK(d.need_erase);
    REQUIRE(d.write);
    CHECK(d.write->invalid_reason == "KV_SNAPSHOT_CORRUPT");
  }

  SECTION("HTTP 400: invalid, the server already cleared the slot, no erase") {
    auto d = c.outcomes().on_restore(
        *p.restore,
        error{errc::restore_failed, 400,
              "Unable to restore slot: No available space in KV cache or invalid slot save file"},
        t0, wall);
    CHECK_FALSE(d.restored);
    CHECK_FALSE(d.need_erase);
    REQUIRE(d.write);
    CHECK(d.write->state == snapshot_state::invalid);
    CHECK(d.write->invalid_reason == "KV_RESTORE_FAILED");
    CHECK(d.err.code == errc::restore_failed);
    CHECK(c.table().state(only_slot) == slot_state::idle);
    CHECK(c.health().circuit().consecutive_failures() == 0);  // the file's fault, not the server's
    c.outcomes().store_manifest(*d.write);
    CHECK(c.records().find_manifest(a)->state == snapshot_state::invalid);
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold_fallback);
    CHECK(c.table().owner(only_slot) == a);
  }

  SECTION("transport failure: the snapshot stays valid, the breaker counts") {
    auto d = c.outcomes().on_restore(*p.restore, transport(), t0, wall);
    CHECK_FALSE(d.restored);
    CHECK_FALSE(d.need_erase);
    CHECK_FALSE(d.write);
    CHECK(d.err.code == errc::backend_unavailable);
    CHECK(c.table().state(only_slot) == slot_state::unknown);
    CHECK(c.health().circuit().consecutive_failures() == 1);
    CHECK(c.records().find_manifest(a)->state == snapshot_state::ready);
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold_fallback);
    c.outcomes().end_inference(only_slot, true, t0 + 1s);
    c.table().on_epoch_change();
    auto p2 = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
    REQUIRE(p2.restore);
    CHECK(p2.restore->filename == a + ".b.bin");
  }

  SECTION("KV_SLOT_NOT_FOUND: the slot is wrong, the snapshot stays ready") {
    auto d = c.outcomes().on_restore(*p.restore,
                                     error{errc::slot_not_found, 400, "Invalid slot ID"}, t0, wall);
    CHECK_FALSE(d.restored);
    CHECK_FALSE(d.need_erase);
    CHECK_FALSE(d.write);
    CHECK(d.err.code == errc::slot_not_found);
    CHECK(c.table().state(only_slot) == slot_state::unknown);
    CHECK(c.health().circuit().consecutive_failures() == 0);
    CHECK(c.records().find_manifest(a)->state == snapshot_state::ready);
  }

  SECTION("HTTP 500: a server problem, not the file's") {
    auto d =
        c.outcomes().on_restore(*p.restore, error{errc::restore_failed, 500, "boom"}, t0, wall);
    CHECK_FALSE(d.restored);
    CHECK_FALSE(d.write);
    CHECK(c.health().circuit().consecutive_failures() == 1);
    CHECK(c.records().find_manifest(a)->state == snapshot_state::ready);
  }
}

TEST_CASE("restore verification can be relaxed, and restores turned off",
          "[core][slot_pool]") {
  SECTION("verify_restore off accepts any non-zero count") {
    auto o = test_options();
    o.verify_restore = false;
    auto c = make_core(o);
    c.add_manifest(ready_manifest(c, "A", 'a', 2124));
    auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
    REQUIRE(p.restore);
    auto d = c.outcomes().on_restore(*p.restore, restored(2000), t0, wall);
    CHECK(d.restored);
    CHECK_FALSE(d.write);
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::restored);
  }
  SECTION("restore_enabled off goes cold and leaves the manifest alone") {
    auto o = test_options();
    o.restore_enabled = false;
    auto c = make_core(o);
    c.add_manifest(ready_manifest(c, "A", 'a', 2124));
    auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
    CHECK_FALSE(p.restore);
    CHECK(p.erase);
    CHECK(p.manifest_writes.empty());
    CHECK(c.records().find_manifest(c.hash_for("A"))->state == snapshot_state::ready);
  }
}

TEST_CASE("a snapshot from another runtime is invalidated, never restored (docs/design.md §9)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");

  SECTION("a foreign fingerprint") {
    c.add_manifest(ready_manifest(c, "A", 'a', 500, 3, std::string(64, '0')));
  }
  SECTION("a different build") {
    auto rt = test_runtime();
    rt.build_info = "b5000-0000000";
    c.add_manifest(ready_manifest(c, "A", 'a', 500, 3, expected_fingerprint(test_options(), rt)));
  }
  SECTION("a different context size") {
    auto rt = test_runtime();
    rt.n_ctx = 4096;
    c.add_manifest(ready_manifest(c, "A", 'a', 500, 3, expected_fingerprint(test_options(), rt)));
  }
  SECTION("a different runtimeKey (KV types, -fa, LoRA)") {
    auto o = test_options();
    o.runtime_key = "qwen7b-q8kv";
    c.add_manifest(ready_manifest(c, "A", 'a', 500, 3, expected_fingerprint(o)));
  }

  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  CHECK_FALSE(p.restore);
  CHECK(p.erase);
  REQUIRE(p.manifest_writes.size() == 1);
  const auto& m = p.manifest_writes[0];
  CHECK(m.session_hash == a);
  CHECK(m.state == snapshot_state::invalid);
  CHECK(m.invalid_reason == "KV_SNAPSHOT_INCOMPATIBLE");
  CHECK(m.generation == 'a');
  CHECK(m.updated_at == wall);
  CHECK(c.records().find_manifest(a)->state == snapshot_state::invalid);
  CHECK(c.stats().invalidations == 1);
  REQUIRE(c.outcomes().on_erase(only_slot, erased(), t0));
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold);
}

TEST_CASE("a snapshot from the same runtime in an earlier process restores",
          "[core][slot_pool]") {
  auto c = make_core();
  c.add_manifest(ready_manifest(c, "A", 'b', 777, 9));
  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p.restore);
  CHECK(p.manifest_writes.empty());
  CHECK(p.restore->filename == c.hash_for("A") + ".b.bin");
  CHECK(p.restore->expected_tokens == 777);
}

TEST_CASE("auxiliary requests save the owner and leave the slot unowned (docs/design.md §3, §6)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);
  REQUIRE(c.records().dirty(c.table().owner(only_slot)));

  request_identity aux;
  SECTION("a purpose marks it, even with the session's id") {
    aux = auxiliary("A", "session-title");
  }
  SECTION("no session id at all") { aux = request_identity{}; }

  auto p = c.plans().prepare(aux, only_slot, t0 + 1s, wall);
  CHECK_FALSE(p.resident);
  REQUIRE(p.save);
  CHECK(p.save->hash == a);
  CHECK(p.save->generation == 'a');
  CHECK_FALSE(p.restore);
  CHECK_FALSE(p.erase);
  auto d = c.outcomes().on_save(*p.save, saved(800), t0 + 1s, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());

  CHECK(c.outcomes().start_inference(aux, only_slot) == prepare_kind::auxiliary);
  CHECK(c.table().owner(only_slot).empty());
  CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 2s));
  CHECK(c.table().owner(only_slot).empty());
  CHECK(c.table().state(only_slot) == slot_state::unknown);
  CHECK_FALSE(c.table().idle_deadline());
  CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0 + 3s));  // auxiliary content is never saved
  CHECK(c.records().find_manifest(a)->revision == 1);  // and never counted as A's progress

  // The next session request restores A.
  auto p2 = c.plans().prepare(session("A"), only_slot, t0 + 4s, wall);
  CHECK_FALSE(p2.resident);
  CHECK_FALSE(p2.save);
  REQUIRE(p2.restore);
  CHECK(p2.restore->filename == a + ".a.bin");
  CHECK(p2.restore->expected_tokens == 800);
}

TEST_CASE("an auxiliary request with nothing to save makes no calls", "[core][slot_pool]") {
  auto c = make_core();
  SECTION("an empty slot") { c.table().on_epoch_change(); }
  SECTION("clean owner") {
    run_request(c, session("A"), t0);
    checkpoint(c, t0 + 1s, 100);
  }
  auto p = c.plans().prepare(auxiliary("", "compaction"), only_slot, t0 + 2s, wall);
  CHECK_FALSE(p.save);
  CHECK_FALSE(p.restore);
  CHECK_FALSE(p.erase);
  CHECK_FALSE(p.resident);
  CHECK(c.outcomes().start_inference(auxiliary("", "compaction"), only_slot) ==
        prepare_kind::auxiliary);
  CHECK(c.table().owner(only_slot).empty());
}

TEST_CASE("switch-only saving can be turned off", "[core][slot_pool]") {
  auto o = test_options();
  o.save_on_switch = false;
  auto c = make_core(o);
  run_request(c, session("A"), t0);
  auto p = c.plans().prepare(session("B"), only_slot, t0 + 1s, wall);
  CHECK_FALSE(p.save);
  CHECK(p.kept);  // the unsaved turns stay in the slot, where B may reuse their prefix
}

TEST_CASE("dispose saves a dirty owner, then lets go: the next request restores",
          "[core][slot_pool][dispose]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);
  REQUIRE(c.table().owner(only_slot) == a);
  // Dirty: the ownership is kept until the save is stored.
  CHECK_FALSE(c.plans().release_session(a));
  CHECK(c.table().owner(only_slot) == a);
  auto s = c.plans().checkpoint_session(a, t0 + 1s);
  REQUIRE(s);
  auto d = c.outcomes().on_save(*s, saved(300), t0 + 1s, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
  CHECK(c.plans().release_session(a));
  CHECK(c.table().owner(only_slot).empty());
  REQUIRE(c.listing().session(a));  // still known, with its snapshot
  CHECK(c.listing().session(a)->snapshot->tokens == 300);

  auto p = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  CHECK_FALSE(p.resident);
  CHECK_FALSE(p.save);
  CHECK_FALSE(p.erase);
  REQUIRE(p.restore);
  CHECK(p.restore->expected_tokens == 300);
  // A session that owns no slot has nothing to let go.
  CHECK(c.plans().release_session(c.hash_for("B")));
}

TEST_CASE("checkpoint.onTurnEnd saves when a reply ends the user's turn, not a tool step",
          "[core][slot_pool]") {
  auto o = test_options();
  o.save_on_turn_end = true;
  auto c = make_core(o);
  run_request(c, session("A"), t0);  // a step (turn_end false): no save
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.table().state(only_slot) == slot_state::dirty);
  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p.resident);
  c.outcomes().start_inference(session("A"), only_slot);
  auto s = c.outcomes().end_inference(only_slot, true, t0 + 1s, true);
  REQUIRE(s);
  CHECK(s->hash == c.hash_for("A"));
  CHECK(s->revision == 2);
  CHECK(s->generation == 'a');
  CHECK(c.table().state(only_slot) == slot_state::saving);
}

TEST_CASE("checkpoint.onStepEnd saves after every model call", "[core][slot_pool]") {
  auto o = test_options();
  o.save_on_step_end = true;
  auto c = make_core(o);
  auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p.erase);
  REQUIRE(c.outcomes().on_erase(only_slot, erased(), t0));
  c.outcomes().start_inference(session("A"), only_slot);
  auto s = c.outcomes().end_inference(only_slot, true, t0 + 1s, false);
  REQUIRE(s);
  CHECK(s->revision == 1);
}

namespace {

// Three transport failures in a row: erase (A), save of A (B keeps the slot's content), and
// a checkpoint of B. B owns the slot, dirty, and the breaker is open until t0 + 1s + 60s.
void open_breaker(slot_pool& c) {
  auto p1 = c.plans().prepare(session("A"), only_slot, t0, wall);
  REQUIRE(p1.erase);
  CHECK_FALSE(c.outcomes().on_erase(only_slot, transport(), t0));
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0);
  auto p2 = c.plans().prepare(session("B"), only_slot, t0 + 1s, wall);
  REQUIRE(p2.save);
  REQUIRE(p2.kept);
  CHECK_FALSE(c.outcomes().on_save(*p2.save, transport(), t0 + 1s, wall).ok());
  CHECK(c.health().circuit().current() == breaker::state::closed);
  c.outcomes().start_inference(session("B"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 1s);
  auto s = c.plans().checkpoint_slot(only_slot, t0 + 1s);
  REQUIRE(s);
  CHECK_FALSE(c.outcomes().on_save(*s, transport(), t0 + 1s, wall).ok());
  REQUIRE(c.health().circuit().current() == breaker::state::open);
  REQUIRE(c.table().owner(only_slot) == c.hash_for("B"));
  REQUIRE(c.records().dirty(c.table().owner(only_slot)));
}

}  // namespace

TEST_CASE("an open circuit skips persistence, and inference goes on (docs/design.md §13)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  const auto b = c.hash_for("B");
  open_breaker(c);

  auto p = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  CHECK_FALSE(p.fail);
  CHECK_FALSE(p.save);
  CHECK_FALSE(p.restore);
  CHECK_FALSE(p.erase);
  CHECK_FALSE(p.resident);
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold);
  CHECK(c.table().owner(only_slot) == a);
  c.outcomes().end_inference(only_slot, true, t0 + 2s);

  // A resident session is not affected by the open circuit.
  CHECK(c.plans().prepare(session("A"), only_slot, t0 + 3s, wall).resident);
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 3s);

  // Idle and flush checkpoints are paused too.
  CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0 + 4s));

  // After the cooldown one half-open trial runs the calls again.
  auto trial = c.plans().prepare(session("B"), only_slot, t0 + 61s, wall);
  CHECK(c.health().circuit().current() == breaker::state::half_open);
  REQUIRE(trial.save);
  CHECK(trial.save->hash == a);
  CHECK(trial.kept);
  REQUIRE(c.outcomes().on_save(*trial.save, saved(100), t0 + 61s, wall).ok());
  CHECK(c.health().circuit().current() == breaker::state::closed);
  CHECK(c.health().circuit().consecutive_failures() == 0);
  (void)b;
}

TEST_CASE("a restore miss is a returning session that runs cold, not a first visit",
          "[core][slot_pool][metrics]") {
  auto c = make_core();
  run_request(c, session("A"), t0);
  run_request(c, session("B"), t0 + 1s);  // saves A
  CHECK(c.stats().cold_starts == 2);
  CHECK(c.stats().restore_misses == 0);
  auto p =
      c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);  // saves B, restores A: it fails
  REQUIRE(p.save);
  REQUIRE(p.restore);
  c.outcomes().store_manifest(c.outcomes().on_save(*p.save, saved(100), t0 + 2s, wall).value());
  auto d = c.outcomes().on_restore(*p.restore, error{errc::restore_failed, 400, "bad file"},
                                   t0 + 2s, wall);
  CHECK_FALSE(d.restored);
  CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::cold_fallback);
  c.outcomes().end_inference(only_slot, true, t0 + 2s);
  CHECK(c.stats().restore_misses == 1);
  CHECK(run_request(c, session("B"), t0 + 3s) == prepare_kind::restored);
  CHECK(c.stats().restore_misses == 1);
  CHECK(c.stats().restore_hits == 1);
}

TEST_CASE("the breaker's transitions are reported once each, in order",
          "[core][slot_pool][circuit]") {
  auto c = make_core();
  CHECK(c.health().take_changes().empty());
  open_breaker(c);
  auto opened = c.health().take_changes();
  REQUIRE(opened.size() == 1);
  CHECK(opened[0].opened);
  CHECK(opened[0].cause == errc::backend_unavailable);
  CHECK(c.health().take_changes().empty());  // taken once

  // While open, more cold requests change nothing.
  c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  c.outcomes().start_inference(session("A"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 2s);
  CHECK(c.health().take_changes().empty());

  // A failed half-open trial reopens: still the same outage, no new report.
  auto trial = c.plans().prepare(session("B"), only_slot, t0 + 61s, wall);
  REQUIRE(trial.save);
  CHECK_FALSE(c.outcomes().on_save(*trial.save, transport(), t0 + 61s, wall).ok());
  CHECK(c.health().take_changes().empty());
  c.outcomes().abort_prepare(only_slot);

  // A successful trial after the (doubled) cooldown recovers, reported once.
  auto trial2 = c.plans().prepare(session("B"), only_slot, t0 + 61s + 121s, wall);
  REQUIRE(trial2.save);
  REQUIRE(c.outcomes().on_save(*trial2.save, saved(100), t0 + 182s, wall).ok());
  auto recovered = c.health().take_changes();
  REQUIRE(recovered.size() == 1);
  CHECK_FALSE(recovered[0].opened);
  CHECK(c.outcomes().on_erase(only_slot, erased(), t0 + 182s));
  CHECK(c.health().take_changes().empty());
}

TEST_CASE("an open circuit fails the request in strict mode", "[core][slot_pool]") {
  auto o = test_options();
  o.strict = true;
  auto c = make_core(o);
  const auto b = c.hash_for("B");
  open_breaker(c);

  auto p = c.plans().prepare(session("A"), only_slot, t0 + 2s, wall);
  CHECK(p.fail);
  CHECK_FALSE(p.save);
  CHECK_FALSE(p.restore);
  CHECK_FALSE(p.erase);
  c.outcomes().abort_prepare(only_slot);
  CHECK(c.table().owner(only_slot) == b);  // B's dirty content is still in the slot
  CHECK(c.records().dirty(c.table().owner(only_slot)));
  CHECK(c.plans().prepare(session("B"), only_slot, t0 + 3s, wall).resident);
  c.outcomes().start_inference(session("B"), only_slot);
  c.outcomes().end_inference(only_slot, true, t0 + 3s);

  // The half-open trial fails: open again with a doubled cooldown.
  auto trial = c.plans().prepare(session("A"), only_slot, t0 + 61s, wall);
  CHECK_FALSE(trial.fail);
  REQUIRE(trial.save);
  CHECK_FALSE(c.outcomes().on_save(*trial.save, transport(), t0 + 61s, wall).ok());
  CHECK(c.health().circuit().current() == breaker::state::open);
  c.outcomes().abort_prepare(only_slot);
  CHECK(c.plans().prepare(session("A"), only_slot, t0 + 62s, wall).fail);
  c.outcomes().abort_prepare(only_slot);
  CHECK(c.plans().prepare(session("A"), only_slot, t0 + 61s + 119s, wall).fail);
  c.outcomes().abort_prepare(only_slot);
  CHECK_FALSE(c.plans().prepare(session("A"), only_slot, t0 + 61s + 120s, wall).fail);
}

TEST_CASE("a server epoch change ends residency, and the session restores (docs/design.md §4)",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);
  checkpoint(c, t0 + 1s, 100);
  run_request(c, session("A"), t0 + 2s);  // dirty again, never saved

  c.table().on_epoch_change();
  CHECK(c.table().owner(only_slot).empty());
  CHECK(c.table().state(only_slot) == slot_state::unknown);
  CHECK_FALSE(c.records().dirty(c.table().owner(only_slot)));
  CHECK_FALSE(c.table().idle_deadline());

  auto p = c.plans().prepare(session("A"), only_slot, t0 + 3s, wall);
  CHECK_FALSE(p.resident);
  CHECK_FALSE(p.save);  // the old process's slot is gone: nothing to save
  REQUIRE(p.restore);
  CHECK(p.restore->filename == a + ".a.bin");
  CHECK(p.restore->expected_tokens == 100);
  CHECK(c.stats().switches == 0);
}

TEST_CASE("set_runtime: the same model keeps residency, a new model is an epoch and a new key",
          "[core][slot_pool]") {
  auto c = make_core();
  const auto a = c.hash_for("A");
  run_request(c, session("A"), t0);

  SECTION("re-probe of the same server") {
    c.set_runtime(test_runtime());
    CHECK(c.table().owner(only_slot) == a);
    CHECK(c.plans().prepare(session("A"), only_slot, t0 + 1s, wall).resident);
  }
  SECTION("a different model file (docs/design.md §3)") {
    auto rt = test_runtime();
    rt.model_path = "/models/llama-3.1-8b-instruct-q4_k_m.gguf";
    c.set_runtime(rt);
    CHECK(c.table().owner(only_slot).empty());
    const auto a2 = c.hash_for("A");
    CHECK(a2 != a);
    auto p = c.plans().prepare(session("A"), only_slot, t0 + 1s, wall);
    CHECK_FALSE(p.resident);
    CHECK_FALSE(p.save);
    CHECK_FALSE(p.erase);  // another model: a new process whose slot is empty
    CHECK(c.records().find_manifest(a2) == nullptr);
  }
}

TEST_CASE("without persistence every plan is empty", "[core][slot_pool]") {
  SECTION("before the first successful probe") {
    slot_pool c(test_options());
    CHECK_FALSE(c.persistence_enabled());
    CHECK(c.hash_for("A").empty());
    auto p = c.plans().prepare(session("A"), only_slot, t0, wall);
    CHECK_FALSE(p.save);
    CHECK_FALSE(p.restore);
    CHECK_FALSE(p.erase);
    CHECK_FALSE(p.resident);
    CHECK_FALSE(p.fail);
    CHECK(c.outcomes().start_inference(session("A"), only_slot) == prepare_kind::none);
    CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0));
    CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0));
    CHECK_FALSE(c.table().idle_deadline());
    CHECK(c.table().owner(only_slot).empty());
  }
  SECTION("after disable_persistence (slot actions turned off)") {
    auto c = make_core();
    run_request(c, session("A"), t0);
    c.disable_persistence();
    CHECK_FALSE(c.persistence_enabled());
    CHECK(c.table().owner(only_slot).empty());
    auto p = c.plans().prepare(session("B"), only_slot, t0 + 1s, wall);
    CHECK_FALSE(p.save);
    CHECK_FALSE(p.restore);
    CHECK_FALSE(p.erase);
    CHECK(c.outcomes().start_inference(session("B"), only_slot) == prepare_kind::none);
    CHECK_FALSE(c.outcomes().end_inference(only_slot, true, t0 + 2s));
    CHECK_FALSE(c.plans().checkpoint_slot(only_slot, t0 + 3s));
  }
}

TEST_CASE("hash_for is the session hash under the current model, memoized per runtime",
          "[core][identity]") {
  auto c = make_core();
  const auto rt = test_runtime();
  // More sessions than the memo holds, twice: every answer is the real hash.
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 20; ++i) {
      const auto id = "S" + std::to_string(i);
      CHECK(c.hash_for(id) == session_hash("test-instance", rt.model_path, id));
    }
  // A new model: the memo must not answer with the old model's hashes.
  auto other = rt;
  other.model_path = "/models/other.gguf";
  c.set_runtime(other);
  CHECK(c.hash_for("S1") == session_hash("test-instance", "/models/other.gguf", "S1"));
  CHECK(c.hash_for("S1") != session_hash("test-instance", rt.model_path, "S1"));
}

}  // namespace slot_pool_plans_test
