// Tests for proxy/control/server_tenancy.hpp (docs/design.md §5 "Without persistence", §20
// "Isolation without persistence"): who may pass through, when another credential's request
// needs the whole server erased, the erases on a FakeBackend and the refusals when they cannot
// run or fail, and the erases before a request llama-server places itself.
#include "proxy/control/server_tenancy.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "proxy/control/coordinator.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"

namespace server_tenancy_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::errc;
using kvp::core::request_identity;
using kvp::proxy::lease_ticket;
using kvp::testing::backend_call;
using kvp::testing::erase_call;
using kvp::testing::failure;
using calls = std::vector<backend_call>;

// sharing: credential, so that another credential's request needs the erases.
kvp::core::slot_pool_options credential_sharing() {
  auto o = kvp::testing::control_pool_options();
  o.seed_across_sessions = true;
  o.seed_within_credential = true;
  return o;
}

// The tenancy over a started runtime monitor (the probe tells which slots an erase reaches).
struct harness : kvp::testing::control_parts {
  kvp::proxy::lease_queue leases{8, kvp::proxy::chooser_of(pool, kvp::proxy::slot_policy::single_slot),
                                 [](const std::shared_ptr<lease_ticket>&) {}};
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::sleep_tracker sleep{ioc.get_executor(), {pool, store, actions}, {}};
  kvp::proxy::runtime_monitor monitor{ioc.get_executor(),
                                      {fake, store, pool, leases, actions, sleep},
                                      kvp::proxy::runtime_monitor_options{.probe_interval = 0ms}};
  kvp::proxy::server_tenancy tenancy;

  explicit harness(bool strict = false)
      : control_parts(std::chrono::seconds(5), credential_sharing()),
        tenancy({pool, leases, monitor, fake, actions}, strict) {
    REQUIRE(store.open().ok());
  }

  template <class T>
  T run(kvp::net::awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }
  // Probed (persistence on), then persistence off as a failed behaviour probe turns it off.
  void start_persistence_off() {
    run(monitor.start());
    pool.disable_persistence();
    fake.clear_calls();
  }
  std::shared_ptr<lease_ticket> ticket() {
    return std::make_shared<lease_ticket>(ioc.get_executor());
  }
  static request_identity who(const std::string& id, const std::string& key) {
    request_identity w;
    w.session_id = id;
    w.credential = kvp::core::credential_key(key);
    return w;
  }
  kvp::core::result<kvp::core::unit> claim(const std::string& key, bool alone) {
    return run(tenancy.claim(who("S", key), alone));
  }
};

}  // namespace

TEST_CASE("a request passes through only while persistence is off and nothing is leased",
          "[proxy][server_tenancy]") {
  harness h;
  h.run(h.monitor.start());
  const auto t = h.ticket();
  CHECK_FALSE(h.tenancy.may_pass_through(*t));  // persistence on: it takes a lease
  h.pool.disable_persistence();
  CHECK(h.tenancy.may_pass_through(*t));
  t->exclusive = true;
  CHECK_FALSE(h.tenancy.may_pass_through(*t));
  t->exclusive = false;
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);
  CHECK_FALSE(h.tenancy.may_pass_through(*t));  // it would overtake the lease holder
  CHECK(h.tenancy.takes_server_behind_leases());
  h.leases.release(held);
  CHECK(h.tenancy.may_pass_through(*t));

  harness strict(true);
  strict.start_persistence_off();
  CHECK_FALSE(strict.tenancy.may_pass_through(*strict.ticket()));
  CHECK_FALSE(strict.tenancy.takes_server_behind_leases());
}

TEST_CASE("another credential's request erases every slot first and becomes the tenant",
          "[proxy][server_tenancy]") {
  harness h;
  h.start_persistence_off();
  REQUIRE(h.claim("key-A", false));  // the first tenant: nothing to erase
  CHECK(h.fake.calls().empty());
  CHECK_FALSE(h.tenancy.needs_erase(kvp::core::credential_key("key-A")));
  CHECK(h.tenancy.needs_erase(kvp::core::credential_key("key-B")));

  // Not alone: refused, to come back through admission and wait for the server.
  const auto busy = h.claim("key-B", false);
  REQUIRE_FALSE(busy);
  CHECK(busy.err().code == errc::slot_busy);
  CHECK(busy.err().retry_after_s == 1);
  CHECK(h.fake.calls().empty());

  REQUIRE(h.claim("key-B", true));
  CHECK(h.fake.calls() == calls{erase_call(0)});
  CHECK_FALSE(h.tenancy.needs_erase(kvp::core::credential_key("key-B")));
  CHECK(h.tenancy.needs_erase(kvp::core::credential_key("key-A")));
}

TEST_CASE("a failed erase refuses the request; the tenant stays", "[proxy][server_tenancy]") {
  harness h;
  h.start_persistence_off();
  REQUIRE(h.claim("key-A", true));
  h.fake.fail_next_erase(failure::http(500));
  const auto refused = h.claim("key-B", true);
  REQUIRE_FALSE(refused);
  CHECK(refused.err().code == errc::erase_failed);
  CHECK(h.fake.calls() == calls{erase_call(0)});
  CHECK(h.tenancy.needs_erase(kvp::core::credential_key("key-B")));
  CHECK_FALSE(h.tenancy.needs_erase(kvp::core::credential_key("key-A")));
}

TEST_CASE("without slot actions nothing can be erased: isolation is off",
          "[proxy][server_tenancy]") {
  harness h;
  h.fake.slot_actions_disabled = true;
  h.run(h.monitor.start());
  REQUIRE_FALSE(h.pool.persistence_enabled());
  h.fake.clear_calls();
  REQUIRE(h.claim("key-A", true));
  CHECK_FALSE(h.tenancy.needs_erase(kvp::core::credential_key("key-B")));
  REQUIRE(h.claim("key-B", false));
  CHECK(h.fake.calls().empty());
  CHECK_FALSE(h.tenancy.takes_server_behind_leases());
}

TEST_CASE("before a request llama-server places itself, a slot it may not run on is erased",
          "[proxy][server_tenancy]") {
  harness h;
  h.run(h.monitor.start());
  REQUIRE(h.pool.persistence_enabled());
  // key-A's session runs on slot 0 and stays there.
  const auto a = harness::who("A", "key-A");
  const auto plan = h.pool.plans().prepare(a, 0, std::chrono::steady_clock::now(), "2026-06-01T00:00:00Z");
  REQUIRE(h.run(h.actions.execute(plan, false)).ok());
  (void)h.pool.outcomes().start_inference(a, 0);
  h.fake.run_inference(500);
  (void)h.pool.outcomes().end_inference(0, true, std::chrono::steady_clock::now());
  h.fake.clear_calls();

  REQUIRE(h.run(h.tenancy.erase_foreign_slots(harness::who("X", "key-A"))));
  CHECK(h.fake.calls().empty());  // its own credential's content: it may run there
  h.fake.fail_next_erase(failure::http(500));
  const auto refused = h.run(h.tenancy.erase_foreign_slots(harness::who("X", "key-B")));
  REQUIRE_FALSE(refused);
  CHECK(refused.err().code == errc::erase_failed);
  CHECK(h.fake.calls() == calls{erase_call(0)});
  REQUIRE(h.run(h.tenancy.erase_foreign_slots(harness::who("X", "key-B"))));
  CHECK(h.fake.calls() == calls{erase_call(0), erase_call(0)});
}

}  // namespace server_tenancy_test
