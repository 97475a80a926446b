// Tests for proxy/control/retention_keeper.hpp (docs/design.md §12): which sessions gc and the
// disk budget forget, in what order, with which calls to FakeBackend and what is left on disk,
// driven on an io_context with slot_actions wired to it as the coordinator wires them.
#include "proxy/control/retention_keeper.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "core/manifest.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"
#include "tests/support/temp_dir.hpp"

namespace retention_keeper_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::request_identity;
using kvp::proxy::retention_keeper;
using kvp::proxy::slot_action_hooks;
using kvp::proxy::slot_actions;
using kvp::testing::backend_call;
using kvp::testing::erase_call;
using kvp::testing::FakeBackend;
using kvp::testing::save_call;
using calls = std::vector<backend_call>;

// A retention_keeper with its slot_actions over a FakeBackend, a state directory and
// server-owned snapshots (llama-server's files: forgotten sessions' files stay, unless the disk
// budget overwrites them).
struct harness : kvp::testing::control_parts {
  slot_actions actions;
  retention_keeper keeper;

  int holds_taken = 0;
  int holds_released = 0;

  explicit harness(kvp::core::retention_limits limits,
                   std::chrono::milliseconds interval = 0ms)
      : actions(fake, store, pool, files, commits, snapshots, reuse, hooks()),
        keeper(ioc.get_executor(), limits, interval, fake, pool, actions, commits, store,
               snapshots, reuse, [this] { return hold_server(); }) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }

  // The test thread is the only user: a hold is only counted, taken and released.
  kvp::net::awaitable<kvp::proxy::server_hold> hold_server() {
    ++holds_taken;
    co_return kvp::proxy::server_hold(new int(0), [this](void* p) {
      delete static_cast<int*>(p);
      ++holds_released;
    });
  }

  slot_action_hooks hooks() {
    slot_action_hooks h;
    h.session_added = [this] { return keeper.enforce_session_budget(); };
    h.saved = [this](int slot, kvp::core::manifest m) {
      return keeper.keep_disk_budget(slot, std::move(m));
    };
    h.restored = [this](const std::string& hash) { keeper.note_restored(hash); };
    return h;
  }

  template <class T>
  T run(kvp::net::awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }

  std::string hash(const std::string& id) const { return pool.hash_for(std::string_view(id)); }
  std::string file(const std::string& id, char generation) const {
    return kvp::core::snapshot_filename(hash(id), generation);
  }
  // A snapshot an earlier process saved for `id` (of `credential`, a credential_key()) in
  // generation a: its manifest on disk and known to the pool, its file with llama-server.
  void add_snapshot(const std::string& id, std::uint64_t bytes, const std::string& updated_at,
                    const std::string& credential = "") {
    kvp::core::manifest m;
    m.credential = credential;
    m.session_id = id;
    m.session_hash = hash(id);
    m.instance_key = "test";
    m.tokens = 10;
    m.bytes = bytes;
    m.created_at = m.updated_at = updated_at;
    REQUIRE(store.write(m).ok());
    pool.add_manifest(m);
    fake.put_snapshot(m.snapshot_file(), m.tokens);
  }
  bool known(const std::string& id) const {
    return pool.records().find_manifest(hash(id)) != nullptr && store.read(hash(id)).has_value();
  }
  bool forgotten(const std::string& id) const {
    return pool.records().find_manifest(hash(id)) == nullptr && !store.read(hash(id)).has_value();
  }
  // `id`, sent with `credential`, takes slot 0 (its cold start erases it) and leaves `tokens`
  // there, then is saved.
  void save_in_slot(const std::string& id, std::uint64_t tokens,
                    const std::string& credential = "") {
    request_identity who;
    who.session_id = id;
    who.credential = credential;
    pool.resolve_session(who);
    const auto now = std::chrono::steady_clock::now();
    const auto plan = pool.plans().prepare(who, 0, now, "2026-06-01T00:00:00Z");
    REQUIRE(run(actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, 0);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, now);
    const auto step = pool.plans().checkpoint_slot(0, now);
    REQUIRE(step);
    REQUIRE(run(actions.run_save(*step)).ok());
  }
};

kvp::core::retention_limits max_sessions(std::size_t n) {
  kvp::core::retention_limits l;
  l.max_sessions = n;
  return l;
}

kvp::core::retention_limits max_bytes(std::uint64_t n) {
  kvp::core::retention_limits l;
  l.max_total_bytes = n;
  return l;
}

kvp::core::retention_limits max_bytes_per_credential(std::uint64_t n) {
  kvp::core::retention_limits l;
  l.max_bytes_per_credential = n;
  return l;
}

}  // namespace

TEST_CASE("gc forgets the least recently used snapshot first; a restore is a use",
          "[proxy][retention_keeper]") {
  harness h(max_sessions(2));
  h.add_snapshot("A", 1000, "2026-01-01T00:00:01Z");
  h.add_snapshot("B", 1000, "2026-01-01T00:00:02Z");
  h.add_snapshot("C", 1000, "2026-01-01T00:00:03Z");
  h.fake.clear_calls();

  SECTION("by their saves: A, the oldest") {
    const auto report = h.run(h.keeper.run_gc());
    CHECK(h.forgotten("A"));
    CHECK(h.known("B"));
    CHECK(h.known("C"));
    CHECK(report.evicted == 1);
    CHECK(report.remaining_sessions == 2);
  }
  SECTION("A restored since: B is now the least recently used") {
    h.keeper.note_restored(h.hash("A"));
    const auto report = h.run(h.keeper.run_gc());
    CHECK(h.known("A"));
    CHECK(h.forgotten("B"));
    CHECK(h.known("C"));
    CHECK(report.evicted == 1);
  }
  // Server-owned mode: the files are llama-server's; nothing touches them.
  CHECK(h.fake.calls().empty());
  CHECK(h.fake.snapshot_tokens(h.file("A", 'a')) == 10u);
  CHECK(h.fake.snapshot_tokens(h.file("B", 'a')) == 10u);
  CHECK(h.keeper.counters().sessions_forgotten == 1);
  CHECK(h.keeper.counters().gc_evicted == 0);
}

TEST_CASE("gc keeps a session whose commit is in flight, for the next run",
          "[proxy][retention_keeper]") {
  harness h(max_sessions(1));
  h.add_snapshot("A", 1000, "2026-01-01T00:00:01Z");
  h.add_snapshot("B", 1000, "2026-01-01T00:00:02Z");
  auto pc = h.commits.begin(h.hash("A"));
  (void)h.run(h.keeper.run_gc());
  CHECK(h.known("A"));
  CHECK(h.known("B"));
  CHECK(h.keeper.counters().sessions_forgotten == 0);

  h.commits.settle(h.hash("A"), pc, kvp::core::unit{});
  (void)h.run(h.keeper.run_gc());
  CHECK(h.forgotten("A"));
  CHECK(h.known("B"));
  CHECK(h.keeper.counters().sessions_forgotten == 1);
}

TEST_CASE("gc under a disk budget overwrites the evicted session's files and reports the rest",
          "[proxy][retention_keeper]") {
  harness h(max_bytes(25'000));
  h.add_snapshot("A", 10'000, "2026-01-01T00:00:01Z");
  h.add_snapshot("B", 10'000, "2026-01-01T00:00:02Z");
  h.add_snapshot("C", 10'000, "2026-01-01T00:00:03Z");
  h.fake.clear_calls();
  const auto report = h.run(h.keeper.run_gc());
  // The empty slot erased once, then saved over A's two generations, the one the manifest
  // does not name first.
  CHECK(h.fake.calls() == calls{erase_call(0), save_call(h.file("A", 'b')),
                                save_call(h.file("A", 'a'))});
  CHECK(h.fake.snapshot_tokens(h.file("A", 'a')) == 0u);
  CHECK(h.fake.snapshot_tokens(h.file("A", 'b')) == 0u);
  CHECK(h.forgotten("A"));
  CHECK(h.known("B"));
  CHECK(h.known("C"));
  CHECK(report.evicted == 1);
  CHECK(report.freed_bytes == 10'000);
  CHECK(report.remaining_sessions == 2);
  CHECK(report.remaining_bytes == 20'000);
  CHECK_FALSE(report.files_kept);
  CHECK(h.keeper.counters().gc_evicted == 1);
  CHECK(h.keeper.counters().gc_freed_bytes == 10'000);
}

TEST_CASE("a save under a disk budget makes room for the next one from its own slot",
          "[proxy][retention_keeper]") {
  // C's save writes 24 + 10 * 1024 = 10264 bytes: the budget keeps room for one more such
  // file, 35000 - 10264 = 24736 for what stays, so of A, B (10000 each) and C only A goes.
  harness h(max_bytes(35'000));
  h.add_snapshot("A", 10'000, "2026-01-01T00:00:01Z");
  h.add_snapshot("B", 10'000, "2026-01-01T00:00:02Z");
  h.fake.clear_calls();
  h.save_in_slot("C", 10);
  CHECK(h.fake.slot_calls() == calls{erase_call(0), save_call(h.file("C", 'a')), erase_call(0),
                                     save_call(h.file("A", 'b')), save_call(h.file("A", 'a'))});
  CHECK(h.forgotten("A"));
  CHECK(h.known("B"));
  CHECK(h.known("C"));
  CHECK(h.fake.snapshot_tokens(h.file("C", 'a')) == 10u);
  CHECK(h.keeper.counters().gc_evicted == 1);
  CHECK(h.keeper.counters().gc_freed_bytes == 10'000);
}

// docs/design.md §12, "Disk budget": a credential's share keeps room for its own next save.
// Key A's save of 24 + 10 * 1024 = 10264 bytes leaves B's share (12000) to B: B's 4000 bytes
// stay, with room for B's own next snapshot (2000). Before, the room was the largest file
// any credential had saved, taken from every share: B's share became 1736 bytes and A's save
// overwrote B's sessions.
TEST_CASE("a save keeps room in the saving credential's share, not in another's",
          "[proxy][retention_keeper]") {
  harness h(max_bytes_per_credential(12'000));
  h.add_snapshot("B1", 2'000, "2026-01-01T00:00:01Z", "key-B");
  h.add_snapshot("B2", 2'000, "2026-01-01T00:00:02Z", "key-B");
  h.fake.clear_calls();
  h.save_in_slot("A", 10, "key-A");
  request_identity a;
  a.session_id = "A";
  a.credential = "key-A";
  const auto a_file = kvp::core::snapshot_filename(h.pool.hash_for(a), 'a');
  CHECK(h.fake.slot_calls() == calls{erase_call(0), save_call(a_file)});
  CHECK(h.known("B1"));
  CHECK(h.known("B2"));
  CHECK(h.pool.records().find_manifest(
      h.pool.hash_for(a)));  // alone over its share: the one just saved
  CHECK(h.keeper.counters().gc_evicted == 0);
}

// The room kept for the next save is the saver's largest snapshot that is still kept: it goes
// down once the large one is gone. A 10264-byte snapshot purged, then a 2072-byte save
// (24 + 2 * 1024) beside X and Y (4000 each): room for 4000 more under 16000, all stay.
// Before, the room stayed 10264 for the life of the process and X was overwritten.
TEST_CASE("the room kept for the next save goes down when the large snapshot is gone",
          "[proxy][retention_keeper]") {
  harness h(max_bytes(16'000));
  h.save_in_slot("big", 10);
  REQUIRE_FALSE(h.run(h.keeper.overwrite_snapshots(h.hash("big"))));
  (void)h.run(h.keeper.drop_session(h.hash("big")));
  REQUIRE(h.forgotten("big"));
  h.add_snapshot("X", 4'000, "2026-01-01T00:00:01Z");
  h.add_snapshot("Y", 4'000, "2026-01-01T00:00:02Z");
  h.fake.clear_calls();
  h.save_in_slot("small", 2);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("small", 'a'))});  // the purge erased it
  CHECK(h.known("X"));
  CHECK(h.known("Y"));
  CHECK(h.keeper.counters().gc_evicted == 0);
}

TEST_CASE("without a disk budget a save evicts nothing", "[proxy][retention_keeper]") {
  harness h(max_sessions(0));
  h.add_snapshot("A", 10'000, "2026-01-01T00:00:01Z");
  h.fake.clear_calls();
  h.save_in_slot("C", 10);
  CHECK(h.fake.slot_calls() == calls{erase_call(0), save_call(h.file("C", 'a'))});
  CHECK(h.known("A"));
  CHECK(h.keeper.counters().gc_evicted == 0);
}

TEST_CASE("the gc loop runs gc on its interval with the whole server held, until stopped",
          "[proxy][retention_keeper]") {
  harness h(max_sessions(1), 20ms);
  h.add_snapshot("A", 1000, "2026-01-01T00:00:01Z");
  h.add_snapshot("B", 1000, "2026-01-01T00:00:02Z");
  auto loop = kvp::testing::spawn(h.ioc.get_executor(), h.keeper.gc_loop());
  kvp::testing::drive_until(h.ioc, [&] { return h.forgotten("A"); });
  CHECK(h.known("B"));
  CHECK(h.holds_taken >= 1);
  h.keeper.stop();
  kvp::testing::drive_until(h.ioc, [&] { return kvp::testing::is_ready(loop); });
  loop.get();
  CHECK(h.holds_released == h.holds_taken);
}

}  // namespace retention_keeper_test
