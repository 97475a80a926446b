// Tests for proxy/control/slot_actions.hpp: a core::slot_pool plan's save, restore and erase
// carried out against FakeBackend and a temporary state directory (docs/design.md §6, §9,
// §11), with the exact calls, the manifests on disk and what the owner is told (the hooks).
#include "proxy/control/slot_actions.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/identity.hpp"
#include "core/manifest.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"
#include "tests/support/temp_dir.hpp"

namespace slot_actions_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::errc;
using kvp::core::request_identity;
using kvp::core::result;
using kvp::core::snapshot_state;
using kvp::core::unit;
using kvp::proxy::slot_action_hooks;
using kvp::proxy::slot_actions;
using kvp::testing::backend_call;
using kvp::testing::erase_call;
using kvp::testing::failure;
using kvp::testing::FakeBackend;
using kvp::testing::is_ready;
using kvp::testing::restore_call;
using kvp::testing::save_call;
using calls = std::vector<backend_call>;

// slot_actions over a FakeBackend, a state directory and a server-owned snapshot directory,
// driven from the test thread; the hooks record what the owner was told.
struct harness : kvp::testing::control_parts {
  std::vector<std::string> told;  // the hooks called, in order
  slot_actions actions;

  explicit harness(std::chrono::milliseconds file_timeout = 5s)
      : control_parts(file_timeout),
        actions(fake, store, pool, files, commits, snapshots, reuse, hooks()) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }

  slot_action_hooks hooks() {
    slot_action_hooks h;
    h.slot_error = [this](const kvp::core::error& e) {
      told.push_back("slot_error " + std::string(kvp::core::to_string(e.code)));
    };
    h.commit_ended = [this] { told.push_back("commit_ended"); };
    h.session_added = [this]() -> kvp::net::awaitable<void> {
      told.push_back("session_added");
      co_return;
    };
    h.saved = [this](int slot, kvp::core::manifest m) -> kvp::net::awaitable<void> {
      told.push_back("saved " + std::to_string(slot) + " " + std::to_string(m.tokens));
      co_return;
    };
    h.restored = [this](const std::string& hash) {
      told.push_back("restored " + std::string(kvp::core::abbrev(hash)));
    };
    return h;
  }

  template <class T>
  T run(kvp::net::awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }

  // `id` takes the slot (the plan carried out by slot_actions) and leaves `tokens` in it,
  // dirty. Returns how the request was prepared (restored, cold_fallback after a failed
  // restore, ...).
  kvp::core::prepare_kind take_slot(const std::string& id, std::uint64_t tokens) {
    request_identity who;
    who.session_id = id;
    pool.resolve_session(who);
    const auto now = std::chrono::steady_clock::now();
    const auto plan = pool.plans().prepare(who, 0, now, "2026-01-01T00:00:00Z");
    REQUIRE(run(actions.execute(plan, false)).ok());
    const auto kind = pool.outcomes().start_inference(who, 0);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, std::chrono::steady_clock::now());
    return kind;
  }
  kvp::core::save_step checkpoint() {
    auto s = pool.plans().checkpoint_slot(0, std::chrono::steady_clock::now());
    REQUIRE(s);
    return *s;
  }
};

}  // namespace

TEST_CASE("a save writes the snapshot file, then the manifest that names it",
          "[proxy][slot_actions]") {
  harness h;
  h.take_slot("A", 1000);
  h.fake.clear_calls();
  h.told.clear();
  const auto step = h.checkpoint();
  h.fake.delay_save(50ms);
  auto saving = kvp::testing::spawn(h.ioc.get_executor(), h.actions.run_save(step));
  // While llama-server writes the file, nothing points at it.
  kvp::testing::run_for(h.ioc, 20ms);
  REQUIRE_FALSE(is_ready(saving));
  CHECK_FALSE(h.store.read(step.hash));
  kvp::testing::drive_until(h.ioc, [&] { return is_ready(saving); });
  REQUIRE(saving.get().ok());
  CHECK(h.fake.slot_calls() == calls{save_call(step.filename)});
  CHECK(h.fake.snapshot_tokens(step.filename) == 1000u);
  const auto on_disk = h.store.read(step.hash);
  REQUIRE(on_disk);
  CHECK(on_disk->tokens == 1000);
  CHECK(on_disk->generation == step.generation);
  CHECK(on_disk->state == snapshot_state::ready);
  REQUIRE(h.pool.records().find_manifest(step.hash));
  CHECK(h.pool.records().find_manifest(step.hash)->generation == step.generation);
  CHECK_FALSE(h.commits.in_flight(step.hash));
  CHECK(h.told == std::vector<std::string>{"saved 0 1000", "session_added", "commit_ended"});
}

TEST_CASE("a failed save leaves the previous manifest current", "[proxy][slot_actions]") {
  harness h;
  h.take_slot("A", 1000);
  const auto first = h.checkpoint();
  REQUIRE(h.run(h.actions.run_save(first)).ok());
  h.take_slot("A", 1500);  // A's next turn, in the slot it still owns
  const auto second = h.checkpoint();
  REQUIRE(second.generation != first.generation);
  h.fake.clear_calls();
  h.told.clear();
  h.fake.fail_next_save(failure::http(500));
  const auto r = h.run(h.actions.run_save(second));
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::save_failed);
  CHECK(h.fake.slot_calls() == calls{save_call(second.filename)});
  const auto on_disk = h.store.read(first.hash);
  REQUIRE(on_disk);
  CHECK(on_disk->generation == first.generation);
  CHECK(on_disk->tokens == 1000);
  CHECK(h.pool.records().find_manifest(first.hash)->generation == first.generation);
  CHECK(h.pool.records().dirty(h.pool.table().owner(0)));  // still to be saved
  // No commit started: the owner hears only of the failed slot action.
  CHECK(h.told == std::vector<std::string>{"slot_error KV_SAVE_FAILED"});
}

TEST_CASE("a restore is checked against the manifest's token count", "[proxy][slot_actions]") {
  harness h;
  h.take_slot("A", 1000);
  const auto saved = h.checkpoint();
  REQUIRE(h.run(h.actions.run_save(saved)).ok());
  h.take_slot("B", 200);  // A leaves the slot (clean), B's cold start erases it
  REQUIRE(h.run(h.actions.run_save(h.checkpoint())).ok());

  SECTION("the count the manifest promised: restored") {
    h.fake.clear_calls();
    h.told.clear();
    CHECK(h.take_slot("A", 1100) == kvp::core::prepare_kind::restored);
    CHECK(h.fake.slot_calls() == calls{restore_call(saved.filename)});
    const auto restored = "restored " + std::string(kvp::core::abbrev(saved.hash));
    CHECK(h.told == std::vector<std::string>{restored});
    CHECK(h.store.read(saved.hash)->state == snapshot_state::ready);
  }
  SECTION("another count: the snapshot is invalidated on disk and the slot erased") {
    h.fake.put_snapshot(saved.filename, 10);  // the file no longer holds what was saved
    h.fake.clear_calls();
    h.told.clear();
    CHECK(h.take_slot("A", 1100) == kvp::core::prepare_kind::cold_fallback);
    CHECK(h.fake.slot_calls() == calls{restore_call(saved.filename), erase_call()});
    const auto on_disk = h.store.read(saved.hash);
    REQUIRE(on_disk);
    CHECK(on_disk->state == snapshot_state::invalid);
    CHECK(on_disk->invalid_reason == "KV_SNAPSHOT_CORRUPT");
    CHECK(h.told == std::vector<std::string>{"slot_error KV_SNAPSHOT_CORRUPT"});
  }
}

TEST_CASE("an erase: done, or its failure's code with the owner told", "[proxy][slot_actions]") {
  harness h;
  h.take_slot("A", 1000);
  h.fake.clear_calls();
  h.told.clear();
  CHECK(h.run(h.actions.run_erase(0)) == std::nullopt);
  CHECK(h.fake.slot_calls() == calls{erase_call()});
  CHECK(h.fake.slot_tokens() == 0u);
  CHECK(h.told.empty());

  h.fake.fail_next_erase(failure::http(500));
  CHECK(h.run(h.actions.run_erase(0)) == errc::erase_failed);
  CHECK(h.fake.slot_calls() == calls{erase_call(), erase_call()});
  CHECK(h.told == std::vector<std::string>{"slot_error KV_ERASE_FAILED"});
}

TEST_CASE("a file operation past its deadline is reported to the breaker",
          "[proxy][slot_actions]") {
  harness h(30ms);
  const int before = h.pool.health().circuit().consecutive_failures();
  std::function<result<unit>()> stuck = [] {
    std::this_thread::sleep_for(200ms);
    return result<unit>(unit{});
  };
  const auto r = h.run(h.actions.on_file_pool<unit>("a stuck write", std::move(stuck)));
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::file_io_timeout);
  CHECK(h.pool.health().circuit().consecutive_failures() == before + 1);
}

}  // namespace slot_actions_test
