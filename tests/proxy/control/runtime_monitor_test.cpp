// Tests for proxy/control/runtime_monitor.hpp (docs/design.md §4): probes on a FakeBackend and
// what they do to the pool: the first probe, a restart (a new media marker, or a slot emptied
// behind the same one), sleep seen on /props (handed to the sleep tracker), a slot layout that
// waits for the leases to go (managed mode), the probe back-off, and runtime changes.
#include "proxy/control/runtime_monitor.hpp"

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

namespace runtime_monitor_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::request_identity;
using kvp::proxy::lease_queue;
using kvp::proxy::lease_ticket;
using kvp::proxy::runtime_monitor;
using kvp::proxy::runtime_monitor_options;
using kvp::testing::backend_call;
using kvp::testing::FakeBackend;
using calls = std::vector<backend_call>;
using steady_clock = std::chrono::steady_clock;

const backend_call probe = FakeBackend::probe_call();
const backend_call props = FakeBackend::props_call();
const backend_call inspect{"inspect", -1, ""};

runtime_monitor_options no_background_probe() {
  runtime_monitor_options o;
  o.probe_interval = 0ms;
  return o;
}

// A runtime_monitor over the coordinator's parts on a FakeBackend; the leases are taken by hand.
struct harness : kvp::testing::control_parts {
  lease_queue leases{8, kvp::proxy::chooser_of(pool, kvp::proxy::slot_policy::pinned),
                     [](const std::shared_ptr<lease_ticket>&) {}};
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::sleep_tracker sleep{ioc.get_executor(), {pool, store, actions}, {}};
  runtime_monitor monitor;

  explicit harness(runtime_monitor_options o = no_background_probe())
      : monitor(ioc.get_executor(), {fake, store, pool, leases, actions, sleep}, std::move(o)) {
    REQUIRE(store.open().ok());
  }
  ~harness() {
    monitor.stop();
    kvp::testing::run_for(ioc, 20ms);
  }

  template <class T>
  T run(kvp::net::awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }
  // Started, persistence on, the probe's calls forgotten.
  void start() {
    run(monitor.start());
    REQUIRE(pool.persistence_enabled());
    fake.clear_calls();
  }
  // `id` owns `slot` after a request that left `tokens` there (dirty), run under the slot's
  // lease as the coordinator runs it.
  void take_slot(const std::string& id, std::uint64_t tokens, int slot = 0) {
    const auto held = kvp::testing::hold_slot(leases, ioc, slot);
    request_identity who;
    who.session_id = id;
    pool.resolve_session(who);
    const auto now = steady_clock::now();
    const auto plan = pool.plans().prepare(who, slot, now, "2026-06-01T00:00:00Z");
    REQUIRE(run(actions.execute(plan, false)).ok());
    (void)pool.outcomes().start_inference(who, slot);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(slot, true, now);
    leases.release(held);
    fake.clear_calls();
  }
};

TEST_CASE("runtime_monitor: the first probe turns persistence on with the server's runtime",
          "[proxy][runtime_monitor]") {
  harness h;
  CHECK_FALSE(h.pool.persistence_enabled());
  h.run(h.monitor.start());
  CHECK(h.fake.calls() == calls{probe});
  CHECK(h.pool.persistence_enabled());
  CHECK(h.pool.runtime().media_marker == "<__media_1__>");
  CHECK(h.pool.runtime().model_path == h.fake.runtime().model_path);
  CHECK(h.monitor.disabled_reason().empty());

  // Nothing to look for: no call at all before the next request.
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.fake.calls() == calls{probe});
}

TEST_CASE("runtime_monitor: a server without slot actions leaves persistence off, with why",
          "[proxy][runtime_monitor]") {
  harness h;
  h.fake.slot_actions_disabled = true;
  h.run(h.monitor.start());
  CHECK_FALSE(h.pool.persistence_enabled());
  CHECK_FALSE(h.monitor.disabled_reason().empty());
}

TEST_CASE("runtime_monitor: upstream trouble and a new media marker: a restart, slots reset",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  REQUIRE_FALSE(h.pool.table().owner(0).empty());

  // The same process: /props only, and the slot still holds its tokens.
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.fake.calls() == calls{props, inspect});
  CHECK_FALSE(h.pool.table().owner(0).empty());

  h.fake.clear_calls();
  h.fake.restart_server();
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.fake.calls() == calls{props, probe});
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.runtime().media_marker == "<__media_2__>");
  CHECK(h.pool.persistence_enabled());
}

TEST_CASE("runtime_monitor: a slot emptied behind the same marker is a restart",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  h.fake.clear_slot();  // LLAMA_MEDIA_MARKER pinned: the marker stays, the KV is gone
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{props, inspect});
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.runtime().media_marker == "<__media_1__>");
}

TEST_CASE("runtime_monitor: a leased slot is not read for the restart sign",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  h.fake.clear_slot();
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);  // another request holds it: its content is changing
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{props});
  CHECK_FALSE(h.pool.table().owner(0).empty());
  h.leases.release(held);
}

TEST_CASE("runtime_monitor: sleep entered ends residency and teaches the sleep period",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  h.sleep.note_request_finished(0, steady_clock::now() - 3s);

  auto rt = h.fake.runtime();
  rt.sleeping = true;
  h.fake.set_runtime(rt);
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.fake.calls() == calls{props});  // no slot list read: it would wake the server
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.persistence_enabled());
  // Learned: 3 s since the last request; the idle checkpoint now runs a second before it.
  CHECK(h.pool.checkpoints().idle_checkpoint() == 2000ms);
  kvp::testing::run_for(h.ioc, 100ms);  // sleep.json is written on the file pool
  CHECK(h.store.read_learned_sleep() == 3s);
}

TEST_CASE("runtime_monitor: managed mode takes every slot; a new layout waits for the leases",
          "[proxy][runtime_monitor]") {
  harness h([] {
    auto o = no_background_probe();
    o.single_slot = false;
    return o;
  }());
  auto rt = h.fake.runtime();
  rt.total_slots = 2;
  h.fake.set_runtime(rt);
  h.start();
  CHECK(h.pool.table().ids() == std::vector<int>{0, 1});

  rt.total_slots = 3;
  h.fake.set_runtime(rt);
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);
  // A slot action answered "no such slot": the whole probe runs before the next plan.
  h.monitor.note_slot_error(kvp::core::error{kvp::core::errc::slot_not_found, 404, "no slot"});
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.fake.calls() == calls{probe});
  CHECK(h.monitor.probe_pending());
  CHECK_FALSE(h.pool.persistence_enabled());  // off while the layout waits
  CHECK(h.pool.table().ids() == std::vector<int>{0, 1});

  h.leases.release(held);
  h.monitor.apply_pending_probe();
  CHECK_FALSE(h.monitor.probe_pending());
  CHECK(h.pool.table().ids() == std::vector<int>{0, 1, 2});
  CHECK(h.pool.persistence_enabled());
}

TEST_CASE("runtime_monitor: a probe that fails while /props answers backs off; a new process "
          "is probed at once",
          "[proxy][runtime_monitor]") {
  harness h;
  h.fake.set_probe_failing(true);
  h.run(h.monitor.start());
  CHECK(h.fake.calls() == calls{probe, props});
  CHECK_FALSE(h.pool.persistence_enabled());
  CHECK_FALSE(h.monitor.disabled_reason().empty());

  // Within the back-off (1 s): no probe before a request, even with upstream trouble on the
  // same process (only /props is read, to tell a new one).
  h.fake.clear_calls();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls().empty());
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{props});

  // A new process behind /props: probed now, and it answers.
  h.fake.clear_calls();
  h.fake.set_probe_failing(false);
  h.fake.restart_server();
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{props, probe});
  CHECK(h.pool.persistence_enabled());
  CHECK(h.monitor.disabled_reason().empty());
}

TEST_CASE("runtime_monitor: the back-off ends after its time; the probe then runs again",
          "[proxy][runtime_monitor]") {
  harness h;
  h.fake.set_probe_failing(true);
  h.run(h.monitor.start());
  REQUIRE_FALSE(h.pool.persistence_enabled());
  h.fake.set_probe_failing(false);
  h.fake.clear_calls();
  kvp::testing::run_for(h.ioc, 1100ms);  // the first back-off: 1 s
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{probe});
  CHECK(h.pool.persistence_enabled());
}

TEST_CASE("runtime_monitor: the background probe applies a restart when nothing is leased, "
          "else keeps it for later",
          "[proxy][runtime_monitor]") {
  harness h([] {
    auto o = no_background_probe();
    o.probe_interval = 20ms;
    return o;
  }());
  h.start();
  h.take_slot("A", 1000);
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);
  h.fake.restart_server();
  kvp::testing::drive_until(h.ioc, [&] { return h.monitor.probe_pending(); });
  CHECK_FALSE(h.pool.table().owner(0).empty());  // kept while the slot is leased
  CHECK(h.pool.runtime().media_marker == "<__media_1__>");

  h.leases.release(held);
  h.monitor.apply_pending_probe();
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.runtime().media_marker == "<__media_2__>");
}

TEST_CASE("runtime_monitor: a runtime change that changed the adapters resets residency and "
          "has the whole probe run",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  h.run(h.monitor.begin_runtime_change());
  h.run(h.monitor.end_runtime_change(true));  // read back as before
  CHECK_FALSE(h.pool.table().owner(0).empty());

  h.run(h.monitor.begin_runtime_change());
  auto rt = h.fake.runtime();
  rt.lora_adapters = "0,/models/style.gguf,0.5;";
  h.fake.set_runtime(rt);
  h.run(h.monitor.end_runtime_change(true));
  CHECK(h.pool.table().owner(0).empty());
  h.fake.clear_calls();
  h.run(h.monitor.look_for_changes(-1));
  CHECK(h.fake.calls() == calls{probe});
}

}  // namespace

TEST_CASE("runtime_monitor: a server that stops answering leaves its slots unknown, not empty",
          "[proxy][runtime_monitor]") {
  harness h;
  h.start();
  h.take_slot("A", 1000);
  REQUIRE(h.pool.table().content(0).whose == kvp::core::content_whose::known);
  h.fake.set_unreachable(true);  // a SIGSTOP: every call times out
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.pool.persistence_enabled());
  CHECK(h.pool.table().owner(0).empty());
  CHECK(h.pool.table().content(0).whose == kvp::core::content_whose::unknown);  // on main: empty
  CHECK(h.pool.table().content(0).credential_known);

  // SIGCONT: the same process answers; nothing makes the slot empty.
  h.fake.set_unreachable(false);
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.pool.table().content(0).whose == kvp::core::content_whose::unknown);
  // A new process does.
  h.fake.restart_server();
  h.monitor.note_upstream_trouble();
  h.run(h.monitor.look_for_changes(0));
  CHECK(h.pool.table().content(0).whose == kvp::core::content_whose::empty);
}

TEST_CASE("runtime_monitor: whether kvpersist can erase slots, for isolation without persistence",
          "[proxy][runtime_monitor]") {
  SECTION("slot actions: every slot of the server, persistence on or off") {
    harness h;
    auto rt = h.fake.runtime();
    rt.total_slots = 2;  // single-slot mode: persistence off
    h.fake.set_runtime(rt);
    h.run(h.monitor.start());
    CHECK_FALSE(h.pool.persistence_enabled());
    CHECK(h.monitor.erasable_slots() == 2);
    CHECK_FALSE(h.monitor.isolation_off());
  }
  SECTION("no slot actions: isolation is off") {
    harness h;
    h.fake.slot_actions_disabled = true;
    h.run(h.monitor.start());
    CHECK(h.monitor.erasable_slots() == 0);
    CHECK(h.monitor.isolation_off());
  }
  SECTION("no answer yet: not known") {
    harness h;
    h.fake.set_unreachable(true);
    h.run(h.monitor.start());
    CHECK(h.monitor.erasable_slots() == 0);
    CHECK_FALSE(h.monitor.isolation_off());
  }
}

}  // namespace runtime_monitor_test
