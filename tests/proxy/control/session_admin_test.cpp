// Tests for proxy/control/session_admin.hpp (docs/design.md §18, §10): the admin API's session
// operations and reads over slot_actions and retention_keeper on a FakeBackend, with the exact
// calls, the manifests on disk, and the whole server held for each operation (its hook).
#include "proxy/control/session_admin.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "core/manifest.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"
#include "tests/support/temp_dir.hpp"

namespace session_admin_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::request_identity;
using kvp::core::snapshot_state;
using kvp::proxy::admin_reply;
using kvp::proxy::admin_result;
using kvp::proxy::session_admin;
using kvp::proxy::slot_actions;
using kvp::testing::backend_call;
using kvp::testing::erase_call;
using kvp::testing::failure;
using kvp::testing::FakeBackend;
using kvp::testing::restore_call;
using kvp::testing::save_call;
using calls = std::vector<backend_call>;

// session_admin over slot_actions, the plan runner and retention_keeper on a FakeBackend,
// server-owned snapshots; its hooks count the holds of the whole server and the runtime refreshes.
struct harness : kvp::testing::control_parts {
  slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::retention_keeper keeper{ioc.get_executor(), {}, 0ms, fake, pool, actions, commits,
                                      store, snapshots, reuse, kvp::proxy::server_holder{}};
  int holds_taken = 0;
  int holds_released = 0;
  std::vector<int> refreshed_while_held;  // the slot of each refresh, if the hold was held
  kvp::proxy::lease_queue leases{8, kvp::testing::one_slot_chooser(),
                                 [](const std::shared_ptr<kvp::proxy::lease_ticket>&) {}};
  kvp::proxy::prefix_maker prefix{ioc.get_executor(), {pool, leases, actions, fake}};
  kvp::proxy::plan_runner plans{{pool, actions, reuse, keeper, prefix}};
  session_admin admin{"default", pool, actions, plans, keeper, snapshots, reuse, hooks()};

  explicit harness(kvp::core::slot_pool_options options = kvp::testing::control_pool_options())
      : control_parts(std::chrono::seconds(5), std::move(options)) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }

  kvp::proxy::session_admin_hooks hooks() {
    kvp::proxy::session_admin_hooks h;
    h.hold_server = [this]() -> kvp::net::awaitable<kvp::proxy::server_hold> {
      ++holds_taken;
      co_return std::shared_ptr<void>(new int(0), [this](void* p) {
        delete static_cast<int*>(p);
        ++holds_released;
      });
    };
    h.refresh_runtime = [this](int slot) -> kvp::net::awaitable<void> {
      if (holds_taken == holds_released + 1) refreshed_while_held.push_back(slot);
      co_return;
    };
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
  // `id`, sent with `credential` (a credential_key(), "" for none), takes slot 0 and leaves
  // `tokens` in it, dirty.
  void take_slot(const std::string& id, std::uint64_t tokens, const std::string& credential = "") {
    const auto who = identity(id, credential);
    const auto now = std::chrono::steady_clock::now();
    const auto plan = pool.plans().prepare(who, 0, now, "2026-06-01T00:00:00Z");
    REQUIRE(run(actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, 0);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, now);
  }
  static request_identity identity(const std::string& id, const std::string& credential) {
    request_identity who;
    who.session_id = id;
    who.credential = credential;
    return who;
  }
  // The plan a request of `id` sent with `credential` would get on slot 0 now; nothing runs.
  kvp::core::prepare_plan plan_for(const std::string& id, const std::string& credential) {
    const auto plan = pool.plans().prepare(
        identity(id, credential), 0, std::chrono::steady_clock::now(), "2026-06-01T00:00:00Z");
    pool.outcomes().abort_prepare(0);
    return plan;
  }
};

// What an admin operation did; nullopt when it failed.
std::optional<admin_result> done(const admin_reply& r) {
  if (!r) return std::nullopt;
  return r.value().result;
}

// "<KV_CODE>: <message>" of an operation that failed; "" when it succeeded.
std::string error_of(const admin_reply& r) {
  if (r) return "";
  return std::string(kvp::core::to_string(r.err().code)) + ": " + r.err().message;
}

// `sharing: credential` (docs/design.md §20): a request may run on what its own credential
// put in the slot.
kvp::core::slot_pool_options credential_sharing() {
  auto o = kvp::testing::control_pool_options();
  o.seed_across_sessions = true;
  o.seed_within_credential = true;
  return o;
}

}  // namespace

TEST_CASE("admin save checkpoints a dirty resident session, under a hold of the server",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  h.fake.clear_calls();
  CHECK(done(h.run(h.admin.save("A"))) == admin_result::saved);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
  REQUIRE(h.store.read(h.hash("A")));
  CHECK(h.store.read(h.hash("A"))->tokens == 1000);
  CHECK(h.holds_taken == 1);
  CHECK(h.holds_released == 1);

  CHECK(done(h.run(h.admin.save(h.hash("A")))) == admin_result::clean);  // by its hash
  CHECK(error_of(h.run(h.admin.save("nobody"))) == "KV_NOT_FOUND: unknown session");
  CHECK(h.fake.slot_calls().size() == 1);
  h.pool.disable_persistence();
  CHECK(error_of(h.run(h.admin.save("A"))) == "KV_PERSISTENCE_UNAVAILABLE: persistence is off");
  CHECK(h.holds_taken == 3);  // persistence off: refused before holding anything
  CHECK(h.holds_released == 3);
}

TEST_CASE("an admin save that fails answers the save's code; the snapshot stays as it was",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  h.fake.clear_calls();
  h.fake.fail_next_save(failure::http(500));
  CHECK(error_of(h.run(h.admin.save("A"))) == "KV_SAVE_FAILED: save failed");
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
  CHECK_FALSE(h.store.read(h.hash("A")));
  CHECK(h.pool.records().dirty(h.pool.table().owner(0)));
}

TEST_CASE("admin restore runs the session's plan now and leaves the slot to it",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  REQUIRE(done(h.run(h.admin.save("A"))) == admin_result::saved);
  h.take_slot("B", 200);  // A leaves the slot
  REQUIRE(done(h.run(h.admin.save("B"))) == admin_result::saved);
  h.fake.clear_calls();
  CHECK(done(h.run(h.admin.restore("A"))) == admin_result::restored);
  CHECK(h.fake.slot_calls() == calls{restore_call(h.file("A", 'a'))});
  CHECK(h.pool.table().slot_of(h.hash("A")) == 0);
  CHECK(h.refreshed_while_held == std::vector<int>{0});
  CHECK(done(h.run(h.admin.restore("A"))) == admin_result::resident);
  CHECK(h.fake.slot_calls().size() == 1);
  CHECK(h.holds_taken == h.holds_released);
}

// docs/design.md §20: what a restore puts in the slot is the snapshot's, and so is its
// credential. An admin restore has no request, so it must take the credential from the
// session's manifest; without it the slot held a key's KV recorded as "no key"'s.
TEST_CASE("admin restore puts the session's KV in the slot under its manifest's credential",
          "[proxy][session_admin]") {
  harness h(credential_sharing());
  // A header session's hash is scoped by its key; a content session's id holds its key.
  const std::string id = GENERATE(as<std::string>{}, "A", "content:A");
  h.take_slot(id, 1000, "key-A");
  const auto a = h.pool.hash_for(harness::identity(id, "key-A"));
  REQUIRE(done(h.run(h.admin.save(a))) == admin_result::saved);
  h.take_slot("B", 200, "key-B");  // A saved on the way out, B erased first
  const auto b = h.pool.hash_for(harness::identity("B", "key-B"));
  REQUIRE(done(h.run(h.admin.save(b))) == admin_result::saved);
  h.fake.clear_calls();

  CHECK(done(h.run(h.admin.restore(a))) == admin_result::restored);
  CHECK(h.fake.slot_calls() == calls{restore_call(kvp::core::snapshot_filename(a, 'a'))});
  CHECK(h.pool.table().slot_of(a) == 0);
  CHECK(h.pool.table().content(0).credential == "key-A");
  const auto entries = h.pool.listing().retention_entries();
  const auto rec = std::find_if(entries.begin(), entries.end(),
                                [&](const auto& e) { return e.hash == a; });
  REQUIRE(rec != entries.end());
  CHECK(rec->credential == "key-A");
  // A's own next turn runs on the restored KV, and so may A's key's other sessions; a request
  // without a key, or with B's, may not: its plan erases first, and a failed erase fails it.
  CHECK(h.pool.listing().session(a)->resident);
  using kvp::core::door_answer;
  CHECK(h.pool.plans().door_for(0, harness::identity("X", "key-A")) == door_answer::run);
  CHECK(h.pool.plans().door_for(0, harness::identity("X", "key-B")) ==
        door_answer::erase_or_refuse);
  CHECK(h.pool.plans().door_for(0, harness::identity("X", "")) == door_answer::erase_or_refuse);
  const auto plan = h.plan_for("X", "");
  CHECK(plan.erase);
  CHECK(plan.erase_required);
}

TEST_CASE("admin dispose saves the session, then lets its slot go; not when the save fails",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  h.fake.clear_calls();

  SECTION("saved: disposed") {
    CHECK(done(h.run(h.admin.dispose("A"))) == admin_result::disposed);
    CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
    CHECK(h.pool.table().slot_of(h.hash("A")) == -1);
    CHECK(done(h.run(h.admin.dispose("A"))) == admin_result::nothing_to_dispose);
  }
  SECTION("the save failed: kept") {
    h.fake.fail_next_save(failure::http(500));
    CHECK(error_of(h.run(h.admin.dispose("A"))) ==
          "KV_SAVE_FAILED: save failed: the session keeps its slot");
    CHECK(h.pool.table().slot_of(h.hash("A")) == 0);
    CHECK(h.pool.records().dirty(h.pool.table().owner(0)));
  }
}

TEST_CASE("admin invalidate marks the snapshot on disk with the operator's note",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  REQUIRE(done(h.run(h.admin.save("A"))) == admin_result::saved);
  CHECK(done(h.run(h.admin.invalidate("A", "bad weights"))) == admin_result::invalidated);
  const auto m = h.store.read(h.hash("A"));
  REQUIRE(m);
  CHECK(m->state == snapshot_state::invalid);
  CHECK(m->invalid_note == "bad weights");
  CHECK(error_of(h.run(h.admin.invalidate("nobody", ""))) ==
        "KV_NOT_FOUND: no snapshot for that session");
}

TEST_CASE("admin purge in server-owned mode overwrites both generations, then forgets",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  REQUIRE(done(h.run(h.admin.save("A"))) == admin_result::saved);
  h.fake.clear_calls();
  const auto out = h.run(h.admin.purge("A"));
  REQUIRE(out);
  CHECK(out.value().result == admin_result::purged);
  CHECK_FALSE(out.value().files_deleted);
  // Its own slot, erased, saved over the generation the manifest does not name first.
  CHECK(h.fake.slot_calls() ==
        calls{erase_call(0), save_call(h.file("A", 'b')), save_call(h.file("A", 'a'))});
  CHECK(h.fake.snapshot_tokens(h.file("A", 'a')) == 0u);
  CHECK_FALSE(h.store.read(h.hash("A")));
  CHECK_FALSE(h.admin.session("A"));
  CHECK(error_of(h.run(h.admin.purge("A"))) == "KV_NOT_FOUND: unknown session");
}

TEST_CASE("admin gc runs retention under a hold of the server", "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  REQUIRE(done(h.run(h.admin.save("A"))) == admin_result::saved);
  const auto report = h.run(h.admin.gc());
  CHECK(report.evicted == 0);  // no limits
  CHECK(report.remaining_sessions == 1);
  CHECK(h.holds_taken == 2);
  CHECK(h.holds_released == 2);
}

TEST_CASE("the session list pages in hash order; one session by id or hash",
          "[proxy][session_admin]") {
  harness h;
  h.take_slot("A", 1000);
  h.take_slot("B", 200);  // A saved on the way out, B resident and dirty
  const auto first = h.admin.sessions_page("", 1);
  CHECK(first.server == "default");
  REQUIRE(first.sessions.size() == 1);
  CHECK(first.next == first.sessions[0].hash);
  const auto second = h.admin.sessions_page(first.next, 1);
  REQUIRE(second.sessions.size() == 1);
  CHECK(second.next.empty());
  CHECK(first.sessions[0].hash < second.sessions[0].hash);

  const auto b = h.admin.session("B");
  REQUIRE(b);
  CHECK(b->hash == h.hash("B"));
  CHECK(b->resident);
  CHECK(b->dirty);
  const auto a = h.admin.session(h.hash("A"));
  REQUIRE(a);
  CHECK(a->session_id == "A");
  CHECK_FALSE(a->resident);
  REQUIRE(a->snapshot);
  CHECK(a->snapshot->tokens == 1000);
  const auto nobody = h.admin.session("nobody");
  REQUIRE_FALSE(nobody);
  CHECK(nobody.err().code == kvp::core::errc::not_found);
  CHECK(nobody.err().message == "unknown session");
}

}  // namespace session_admin_test
