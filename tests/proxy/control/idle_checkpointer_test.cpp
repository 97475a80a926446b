// Tests for proxy/control/idle_checkpointer.hpp (docs/design.md §10): a dirty slot is saved at its
// idle deadline under the slot's lease, a leased slot is left to its request, a re-arm moves the
// deadline, and nothing is saved after stop.
#include "proxy/control/idle_checkpointer.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/identity.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"

namespace idle_checkpointer_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::request_identity;
using kvp::proxy::lease_queue;
using kvp::proxy::lease_ticket;
using kvp::testing::backend_call;
using kvp::testing::save_call;
using calls = std::vector<backend_call>;

// An idle checkpointer over the coordinator's parts, checkpoint.idleMs 50 ms; it counts the
// after-save calls and whether the slot's lease was held during each.
struct harness : kvp::testing::control_parts {
  lease_queue leases{8, kvp::testing::one_slot_chooser(),
                     [](const std::shared_ptr<lease_ticket>&) {}};
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  int after_saves = 0;
  int saves_under_lease = 0;
  kvp::proxy::idle_checkpointer idle{ioc.get_executor(), {pool, leases, actions}, [this] {
                                       ++after_saves;
                                       saves_under_lease += leases.is_leased(0) ? 1 : 0;
                                     }};

  harness() {
    REQUIRE(store.open().ok());
    pool.checkpoints().set_idle_checkpoint(50ms);
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }
  ~harness() {
    idle.stop();
    kvp::testing::run_for(ioc, 20ms);
  }

  std::string file(const std::string& id, char generation) const {
    return kvp::core::snapshot_filename(pool.hash_for(std::string_view(id)), generation);
  }
  // `id` takes slot 0 and leaves `tokens` in it, dirty; its idle deadline is 50 ms from now.
  void take_slot(const std::string& id, std::uint64_t tokens) {
    request_identity who;
    who.session_id = id;
    pool.resolve_session(who);
    const auto now = std::chrono::steady_clock::now();
    const auto plan = pool.plans().prepare(who, 0, now, "2026-06-01T00:00:00Z");
    REQUIRE(kvp::testing::run_on(ioc, ioc.get_executor(), actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, 0);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, std::chrono::steady_clock::now());
    fake.clear_calls();
  }
};

TEST_CASE("idle_checkpointer: a dirty slot is saved at its idle deadline, under its lease",
          "[proxy][idle_checkpointer]") {
  harness h;
  h.take_slot("A", 1000);
  h.idle.arm();
  kvp::testing::run_for(h.ioc, 20ms);
  CHECK(h.fake.slot_calls().empty());  // not yet idle long enough
  kvp::testing::run_for(h.ioc, 150ms);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
  CHECK(h.after_saves == 1);
  CHECK(h.saves_under_lease == 1);
  CHECK_FALSE(h.leases.is_leased(0));  // released after the save
  REQUIRE(h.store.read(h.pool.hash_for(std::string_view("A"))));  // the commit landed
  CHECK(h.store.read(h.pool.hash_for(std::string_view("A")))->tokens == 1000);

  // Clean now: no deadline, no second save.
  h.idle.arm();
  kvp::testing::run_for(h.ioc, 100ms);
  CHECK(h.fake.slot_calls().size() == 1);
}

TEST_CASE("idle_checkpointer: a leased slot is left to its request; the next arm saves it",
          "[proxy][idle_checkpointer]") {
  harness h;
  h.take_slot("A", 1000);
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);
  h.idle.arm();
  kvp::testing::run_for(h.ioc, 120ms);
  CHECK(h.fake.slot_calls().empty());

  h.leases.release(held);
  h.idle.arm();  // as the coordinator does after every release
  kvp::testing::run_for(h.ioc, 50ms);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
}

TEST_CASE("idle_checkpointer: nothing is saved after stop", "[proxy][idle_checkpointer]") {
  harness h;
  h.take_slot("A", 1000);
  h.idle.arm();
  h.idle.stop();
  kvp::testing::run_for(h.ioc, 120ms);
  h.idle.arm();
  kvp::testing::run_for(h.ioc, 120ms);
  CHECK(h.fake.slot_calls().empty());
  CHECK(h.after_saves == 0);
}

}  // namespace

}  // namespace idle_checkpointer_test
