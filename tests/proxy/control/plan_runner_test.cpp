// Tests for proxy/control/plan_runner.hpp: one plan on a leased slot, from the pool's plan to the
// slot handed over, on a FakeBackend: the exact calls, how the slot was prepared, the log lines
// of a switch and a cold start, and, when a plan cannot run, the error with the prepare aborted
// (the slot and its owner as they were).
#include "proxy/control/plan_runner.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"

namespace plan_runner_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::errc;
using kvp::core::prepare_kind;
using kvp::core::request_identity;
using kvp::testing::backend_call;
using kvp::testing::erase_call;
using kvp::testing::failure;
using kvp::testing::restore_call;
using kvp::testing::save_call;
using calls = std::vector<backend_call>;

// The runner over the parts a coordinator hands it, on one slot.
struct harness : kvp::testing::control_parts {
  kvp::proxy::lease_queue leases{8, kvp::testing::one_slot_chooser(),
                                 [](const std::shared_ptr<kvp::proxy::lease_ticket>&) {}};
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::retention_keeper keeper{ioc.get_executor(), {}, 0ms, fake, pool, actions, commits,
                                      store, snapshots, reuse, kvp::proxy::server_holder{}};
  kvp::proxy::prefix_maker prefix{ioc.get_executor(), {pool, leases, actions, fake}};
  kvp::proxy::plan_runner runner{{pool, actions, reuse, keeper, prefix}};

  explicit harness(kvp::core::slot_pool_options options = kvp::testing::control_pool_options())
      : control_parts(std::chrono::seconds(5), std::move(options)) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }

  static request_identity who(const std::string& id, const std::string& credential = "") {
    request_identity w;
    w.session_id = id;
    w.credential = credential;
    return w;
  }
  kvp::core::result<prepare_kind> run(const request_identity& w, bool strict) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), runner.run(w, 0, strict));
  }
  // `id` runs on slot 0 as planned, leaves `tokens` there, dirty; how it was prepared.
  prepare_kind turn(const std::string& id, std::uint64_t tokens, const std::string& key = "") {
    const auto prepared = run(who(id, key), false);
    REQUIRE(prepared);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, std::chrono::steady_clock::now());
    return prepared.value();
  }
  std::string hash(const std::string& id) const { return pool.hash_for(std::string_view(id)); }
  std::string file(const std::string& id, char generation) const {
    return kvp::core::snapshot_filename(hash(id), generation);
  }
};

kvp::core::slot_pool_options strict_options() {
  auto o = kvp::testing::control_pool_options();
  o.strict = true;
  return o;
}

}  // namespace

TEST_CASE("a session switch: the owner saved, the slot erased for a cold start, both logged",
          "[proxy][plan_runner]") {
  harness h;
  CHECK(h.turn("A", 1000) == prepare_kind::cold);
  h.fake.clear_calls();
  kvp::testing::log_capture log;
  CHECK(h.turn("B", 200) == prepare_kind::cold);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a')), erase_call(0)});
  CHECK(h.pool.table().owner(0) == h.hash("B"));
  REQUIRE(log.of("kv.session.switch").size() == 1);
  CHECK(log.of("kv.session.switch")[0].find("slot=0") != std::string::npos);
  CHECK(log.of("kv.session.cold").size() == 1);
  h.fake.clear_calls();
  CHECK(h.turn("A", 1100) == prepare_kind::restored);
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  CHECK(h.turn("A", 1200) == prepare_kind::resident);
  CHECK(log.of("kv.session.switch").size() == 2);  // B to A; A's next turn is no switch
}

TEST_CASE("strict mode: a failed save stops the plan, aborted, the owner keeps its slot",
          "[proxy][plan_runner]") {
  harness h(strict_options());
  h.turn("A", 1000);
  h.fake.clear_calls();
  h.fake.fail_next_save(failure::http(500));
  const auto prepared = h.run(harness::who("B"), true);
  REQUIRE_FALSE(prepared);
  CHECK(prepared.err().code == errc::save_failed);
  CHECK(prepared.err().message == "saving the previous session failed (strict mode)");
  CHECK(h.fake.slot_calls() == calls{save_call(h.file("A", 'a'))});
  CHECK(h.pool.table().owner(0) == h.hash("A"));
  CHECK(h.pool.records().dirty(h.pool.table().owner(0)));
  CHECK(h.turn("A", 1100) == prepare_kind::resident);  // nothing half-prepared left behind
}

TEST_CASE("strict mode while persistence is off: the plan fails before any call",
          "[proxy][plan_runner]") {
  harness h(strict_options());
  h.pool.disable_persistence();
  const auto prepared = h.run(harness::who("A"), true);
  REQUIRE_FALSE(prepared);
  CHECK(prepared.err().message == "persistence is off and strict mode is on");
  CHECK(h.fake.slot_calls().empty());
}

// docs/design.md §20: an erase the sharing scope requires is no optimisation, in any mode.
TEST_CASE("a required erase that fails stops the plan without strict mode; the slot is not "
          "handed over",
          "[proxy][plan_runner]") {
  auto options = kvp::testing::control_pool_options();
  options.seed_across_sessions = true;  // sharing: credential
  options.seed_within_credential = true;
  harness h(options);
  h.turn("A", 1000, "key-A");
  h.fake.clear_calls();
  h.fake.fail_next_erase(failure::http(500));
  const auto b = harness::who("B", "key-B");
  const auto prepared = h.run(b, false);
  REQUIRE_FALSE(prepared);
  CHECK(prepared.err().code == errc::erase_failed);
  CHECK(h.fake.slot_calls() == calls{save_call(kvp::core::snapshot_filename(
                                         h.pool.hash_for(harness::who("A", "key-A")), 'a')),
                                     erase_call(0)});
  CHECK(h.pool.table().owner(0) != h.pool.hash_for(b));
}

}  // namespace plan_runner_test
