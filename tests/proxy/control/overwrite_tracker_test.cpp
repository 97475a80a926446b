// Tests for proxy/control/overwrite_tracker.hpp: an unpinnable request's slot is told by the
// slots' last tasks before and after it; only that slot's owner is forgotten, every owner when
// the slot list cannot be read, and that state is logged once per change.
#include "proxy/control/overwrite_tracker.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "proxy/control/slot_actions.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"

namespace overwrite_tracker_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::backends::slot_info;
using kvp::core::request_identity;
using kvp::net::awaitable;
namespace core = kvp::core;

// GET /slots as the test sets it: each slot's last task, or unreadable (--no-slots: 501).
// The tracker makes no other call.
class slot_list final : public kvp::backends::kv_backend {
 public:
  std::optional<std::map<int, std::int64_t>> tasks = std::map<int, std::int64_t>{};
  int reads = 0;

  awaitable<core::result<std::vector<slot_info>>> inspect_slots() override {
    ++reads;
    if (!tasks) co_return core::error{core::errc::backend_unsupported, 501, "slots disabled"};
    std::vector<slot_info> out;
    for (const auto& [id, task] : *tasks) {
      slot_info s;
      s.id = id;
      s.id_task = task;
      out.push_back(s);
    }
    co_return out;
  }
  awaitable<core::result<core::server_probe>> probe() override { co_return unexpected(); }
  awaitable<core::result<core::slot_saved>> save(int, std::string) override {
    co_return unexpected();
  }
  awaitable<core::result<core::slot_restored>> restore(int, std::string) override {
    co_return unexpected();
  }
  awaitable<core::result<core::slot_erased>> erase(int) override { co_return unexpected(); }

 private:
  static core::error unexpected() {
    FAIL("the overwrite tracker only reads the slot list");
    return core::error{};
  }
};

// Two managed slots, A owning 0 and B owning 1 (set up through slot_actions on the FakeBackend);
// the tracker reads `slots`.
struct harness : kvp::testing::control_parts {
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  slot_list slots;
  kvp::proxy::overwrite_tracker tracker{"default", slots, pool};
  kvp::testing::log_capture logged;

  harness() {
    REQUIRE(store.open().ok());
    pool.table().set_ids({0, 1});
    auto rt = kvp::testing::qwen7b_runtime();
    rt.total_slots = 2;
    pool.set_runtime(rt);
    REQUIRE(pool.persistence_enabled());
    take_slot("A", 0);
    take_slot("B", 1);
  }

  template <class T>
  T run(awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }
  void take_slot(const std::string& id, int slot) {
    request_identity who;
    who.session_id = id;
    pool.resolve_session(who);
    const auto now = std::chrono::steady_clock::now();
    const auto plan = pool.plans().prepare(who, slot, now, "2026-06-01T00:00:00Z");
    REQUIRE(run(actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, slot);
    (void)pool.outcomes().end_inference(slot, true, now);
    REQUIRE(pool.table().owner(slot) == pool.hash_for(std::string_view(id)));
  }
  // One unpinnable request: `after` is the slot list once it ran.
  void unpinnable_request(std::optional<std::map<int, std::int64_t>> after) {
    run(tracker.note_tasks_before());
    slots.tasks = std::move(after);
    run(tracker.forget_overwritten("k2"));
  }
};

TEST_CASE("overwrite_tracker: only the slot whose last task changed loses its owner",
          "[proxy][overwrite_tracker]") {
  harness h;
  const auto a = h.pool.table().owner(0);
  h.slots.tasks = std::map<int, std::int64_t>{{0, 5}, {1, 7}};
  h.unpinnable_request(std::map<int, std::int64_t>{{0, 5}, {1, 8}});
  CHECK(h.slots.reads == 2);
  CHECK(h.pool.table().owner(0) == a);
  CHECK(h.pool.table().owner(1).empty());
  const auto lines = h.logged.of("kv.slot.overwritten");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("slot=1") != std::string::npos);
  CHECK(h.logged.of("kv.slot.state_unknown").empty());
}

TEST_CASE("overwrite_tracker: the one slot that ran the request holds its credential's content",
          "[proxy][overwrite_tracker]") {
  harness h;
  h.slots.tasks = std::map<int, std::int64_t>{{0, 5}, {1, 7}};
  h.unpinnable_request(std::map<int, std::int64_t>{{0, 5}, {1, 8}});
  CHECK(h.pool.table().content(1).whose == kvp::core::content_whose::known);
  CHECK(h.pool.table().content(1).credential == "k2");
  CHECK(h.pool.table().content(1).session.empty());
  CHECK(h.pool.table().content(0).session == h.pool.table().owner(0));  // untouched
}

TEST_CASE("overwrite_tracker: a slot that shows no task before or after did not run it; a list "
          "that shows no task anywhere cannot tell",
          "[proxy][overwrite_tracker]") {
  harness h;
  h.slots.tasks = std::map<int, std::int64_t>{{0, 5}, {1, -1}};
  h.unpinnable_request(std::map<int, std::int64_t>{{0, 6}, {1, -1}});
  CHECK(h.pool.table().owner(0).empty());
  CHECK_FALSE(h.pool.table().owner(1).empty());

  h.take_slot("A", 0);
  h.slots.tasks = std::map<int, std::int64_t>{{0, -1}, {1, -1}};
  h.unpinnable_request(std::map<int, std::int64_t>{{0, -1}, {1, -1}});
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.table().owner(1).empty());
  CHECK(h.pool.table().content(0).whose == kvp::core::content_whose::unknown);
  CHECK(h.logged.of("kv.slot.state_unknown").size() == 1);
}

TEST_CASE("overwrite_tracker: an unreadable slot list forgets every owner, logged once per "
          "change",
          "[proxy][overwrite_tracker]") {
  harness h;
  h.slots.tasks = std::nullopt;
  h.unpinnable_request(std::nullopt);
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.table().owner(1).empty());
  CHECK(h.logged.of("kv.slot.overwritten").size() == 2);
  CHECK(h.logged.of("kv.slot.state_unknown").size() == 1);

  h.take_slot("A", 0);
  h.unpinnable_request(std::nullopt);  // still unreadable: not logged again
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.logged.of("kv.slot.state_unknown").size() == 1);

  // Readable before but not after: every owner again.
  h.take_slot("A", 0);
  h.slots.tasks = std::map<int, std::int64_t>{{0, 5}, {1, 7}};
  h.unpinnable_request(std::nullopt);
  CHECK(h.pool.table().owner(0).empty());

  h.take_slot("A", 0);
  h.slots.tasks = std::map<int, std::int64_t>{{0, 5}, {1, 7}};
  h.unpinnable_request(std::map<int, std::int64_t>{{0, 5}, {1, 7}});
  CHECK_FALSE(h.pool.table().owner(0).empty());
  CHECK(h.logged.of("kv.slot.state_known").size() == 1);
}

}  // namespace

}  // namespace overwrite_tracker_test
