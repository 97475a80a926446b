// Tests for proxy/control/coordinator.hpp driven with FakeBackend on an io_context (docs/design.md §19,
// §84): the lease protocol (enqueue -> settle -> prepare -> finish) with the exact
// management calls, manifests in a temporary state directory, idle and shutdown
// checkpoints, the FIFO queue and its bound. No sockets.
#include "proxy/control/coordinator.hpp"

#include <algorithm>
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proxy/admin/admin.hpp"
#include "tests/support/chains.hpp"
#include "tests/support/core_strings.hpp"
#include "tests/support/coordinator_on_fake.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

using namespace std::chrono_literals;
using kvp::core::prepare_kind;
using kvp::net::io_context;
using kvp::proxy::admin_outcome;
using kvp::proxy::admin_result;
using kvp::proxy::answer_admin_outcome;
using kvp::proxy::coordinator;
using kvp::proxy::coordinator_options;
using kvp::proxy::lease_ticket;
using kvp::proxy::prepare_result;
using kvp::testing::backend_call;
using kvp::testing::drive_until;
using kvp::testing::erase_call;
using kvp::testing::failure;
using kvp::testing::FakeBackend;
using kvp::testing::is_ready;
using kvp::testing::restore_call;
using kvp::testing::save_call;
using kvp::testing::temp_dir;
using calls = std::vector<backend_call>;

coordinator_options test_options() {
  coordinator_options o;
  o.pool.instance_key = "test";
  o.pool.runtime_key = "qwen7b-f16kv";
  o.pool.idle_checkpoint = 0ms;  // tests that want it turn it on
  o.epoch_probe_interval = 0ms;  // no background probe loop
  return o;
}

// `sharing: session`: a cold start always erases, as every cold start did before the slot's
// content decided (docs/design.md §20); under the default scope it keeps the slot's content.
coordinator_options session_scope_options() {
  auto o = test_options();
  o.pool.seed_across_sessions = false;
  return o;
}

coordinator_options strict_options() {
  auto o = test_options();
  o.pool.strict = true;
  return o;
}

coordinator_options idle_checkpoint_options(std::chrono::milliseconds idle) {
  auto o = test_options();
  o.pool.idle_checkpoint = idle;
  return o;
}

// One coordinator with a FakeBackend and a state directory, driven from the test thread.
struct harness : kvp::testing::coordinator_on_fake {
  std::string state_dir;

  explicit harness(const std::string& dir, coordinator_options o = test_options())
      : coordinator_on_fake(dir, std::move(o)), state_dir(dir) {}

  template <class T>
  T run(kvp::net::awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), coord->on_strand(std::move(a)));
  }
  template <class T>
  std::future<T> spawn(kvp::net::awaitable<T> a) {
    return kvp::testing::spawn(ioc.get_executor(), coord->on_strand(std::move(a)));
  }

  void start() { run(coord->start()); }
  // Starts and forgets the probe's calls.
  void start_quiet() {
    start();
    fake->clear_calls();
  }
  // Starts, then A (1000 tokens, resident and dirty); forgets the calls so far.
  void start_with_a_dirty() {
    start();
    request("A", 1000);
    fake->clear_calls();
  }
  // Starts, then A (1000 tokens, saved when B took the slot) and B (500, resident and
  // dirty); forgets the calls so far.
  void start_with_a_saved_b_dirty() {
    start_with_a_dirty();
    request("B", 500);
    fake->clear_calls();
  }

  std::shared_ptr<lease_ticket> ticket() {
    auto t = std::make_shared<lease_ticket>(ioc.get_executor());
    t->wakeup.expires_after(1h);
    return t;
  }
  // A ticket that the queue accepted.
  std::shared_ptr<lease_ticket> enqueued() {
    auto t = ticket();
    REQUIRE(run(coord->enqueue(t)));
    return t;
  }
  // Enqueues and requires the lease at once (the slot is free).
  std::shared_ptr<lease_ticket> acquire() {
    auto t = enqueued();
    REQUIRE(t->granted);
    REQUIRE(run(coord->settle(t)));
    return t;
  }
  // One whole request: lease, prepare, inference leaving `tokens` in the slot, finish.
  prepare_result request(const std::string& session, std::uint64_t tokens,
                         const std::string& purpose = "", bool fresh_upstream = false) {
    return request_as({session, purpose, {}, ""}, tokens, fresh_upstream);
  }
  // The same for any identity (a credential, a prefix chain).
  prepare_result request_as(kvp::core::request_identity who, std::uint64_t tokens,
                            bool fresh_upstream = false) {
    auto t = acquire();
    auto pr = run(coord->prepare(t, std::move(who), fresh_upstream));
    if (pr.ok) {
      fake->run_inference(tokens);
      run(coord->finish(t, true));
    }
    CHECK_FALSE(coord->busy());
    return pr;
  }

  std::string hash(const std::string& session) const { return coord->pool().hash_for(session); }
  std::string file(const std::string& session, char gen) const {
    return kvp::core::snapshot_filename(hash(session), gen);
  }
  std::string manifest_path(const std::string& session) const {
    return state_dir + "/sessions/" + hash(session) + ".json";
  }
  std::optional<kvp::core::manifest> manifest_on_disk(const std::string& session) const {
    const auto text = kvp::testing::read_file(manifest_path(session));
    if (text.empty()) return std::nullopt;
    auto m = kvp::core::parse_manifest(text);
    REQUIRE(m.ok());
    return m.value();
  }
};

// A client session as proxy/data/server runs it: enqueue, wait for the wakeup, settle, prepare,
// inference, finish. Records the order in which clients got the slot.
kvp::net::awaitable<void> client(coordinator* c, FakeBackend* fake, int id,
                                 std::vector<int>* order) {
  // (Each awaited operation is built in a named local first: GCC 12 mishandles some
  // temporaries inside co_await full-expressions.)
  auto ex = co_await kvp::net::this_coro::executor;
  auto t = std::make_shared<lease_ticket>(ex);
  t->wakeup.expires_after(10s);
  auto enqueue = c->enqueue(t);
  const bool queued = co_await c->on_strand(std::move(enqueue));
  if (!queued) co_return;
  auto [ec] = co_await t->wakeup.async_wait();
  (void)ec;  // aborted (woken) or expired: settle decides
  auto settle = c->settle(t);
  const bool granted = co_await c->on_strand(std::move(settle));
  if (!granted) co_return;
  order->push_back(id);
  kvp::core::request_identity who{"S" + std::to_string(id), "", {}, ""};
  auto prepare = c->prepare(t, who, false);
  auto pr = co_await c->on_strand(std::move(prepare));
  if (pr.ok) fake->run_inference(100 * static_cast<std::uint64_t>(id));
  auto finish = c->finish(t, true);
  co_await c->on_strand(std::move(finish));
}

}  // namespace

TEST_CASE("A, A, B, A makes exactly the milestone's management calls (docs/design.md §6)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), session_scope_options());
  h.start();
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});
  CHECK(h.coord->pool().persistence_enabled());
  h.fake->clear_calls();

  auto r1 = h.request("A", 1000);
  CHECK(r1.ok);
  CHECK(r1.kind == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call()});

  auto r2 = h.request("A", 1200);
  CHECK(r2.ok);
  CHECK(r2.kind == prepare_kind::resident);
  CHECK(h.fake->calls() == calls{erase_call()});  // nothing, not even a probe

  auto r3 = h.request("B", 500);
  CHECK(r3.kind == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call()});

  auto r4 = h.request("A", 1300);
  CHECK(r4.kind == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call(),
                                 save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});

  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 1200u);
  CHECK(h.fake->snapshot_tokens(h.file("B", 'a')) == 500u);

  // Manifests land in <state>/sessions/<hash>.json.
  auto ma = h.manifest_on_disk("A");
  REQUIRE(ma);
  CHECK(ma->session_id == "A");
  CHECK(ma->generation == 'a');
  CHECK(ma->tokens == 1200);
  CHECK(ma->bytes == FakeBackend::header_bytes + 1200 * FakeBackend::bytes_per_token);
  CHECK(ma->state == kvp::core::snapshot_state::ready);
  CHECK(ma->runtime_fingerprint == h.coord->pool().runtime().fingerprint());
  auto mb = h.manifest_on_disk("B");
  REQUIRE(mb);
  CHECK(mb->tokens == 500);
  CHECK(h.coord->pool().owner(0) == h.hash("A"));
}

TEST_CASE("A, A, B, A under the default scope: B keeps the slot's content (docs/design.md §20)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  CHECK(h.request("A", 1000).kind == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call()});  // what the slot held before kvpersist: unknown
  CHECK(h.request("A", 1200).kind == prepare_kind::resident);
  // B (the same credential): A is saved, then B runs on A's KV, where llama-server reuses
  // whatever prefix they share: no erase.
  CHECK(h.request("B", 500).kind == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
  CHECK(h.request("A", 1300).kind == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')),
                                 save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
}

TEST_CASE("resident requests cost no management call and no disk write (docs/design.md §2)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  for (int i = 0; i < 5; ++i) CHECK(h.request("A", 100 + i).ok);
  CHECK(h.fake->calls() == calls{erase_call()});
  CHECK_FALSE(h.manifest_on_disk("A"));
  CHECK(h.coord->pool().owner_dirty(0));
}

TEST_CASE("a corrupt snapshot is invalidated on disk and the session runs cold (docs/design.md §19)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();

  SECTION("the server rejects the file") { h.fake->corrupt_snapshot(h.file("A", 'a')); }
  SECTION("the file was deleted by hand (acceptance 17)") {
    h.fake->remove_snapshot(h.file("A", 'a'));
  }

  auto r = h.request("A", 1100);
  CHECK(r.ok);
  CHECK(r.kind == prepare_kind::cold_fallback);
  // The failed restore already cleared the slot: no erase.
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->state == kvp::core::snapshot_state::invalid);
  CHECK(m->invalid_reason == "KV_RESTORE_FAILED");
  CHECK(m->generation == 'a');

  // The session recovers: its next save goes to the other generation and is restorable.
  h.fake->clear_calls();
  h.request("B", 600);
  h.request("A", 1200);
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'b')), restore_call(h.file("B", 'a')),
                                 save_call(h.file("B", 'b')), restore_call(h.file("A", 'b'))});
  m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->state == kvp::core::snapshot_state::ready);
  CHECK(m->generation == 'b');
  CHECK(m->tokens == 1100);
}

TEST_CASE("a restore that reports the wrong token count is erased and invalidated",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  h.fake->put_snapshot(h.file("A", 'a'), 10);  // the file no longer holds what was saved

  auto r = h.request("A", 1100);
  CHECK(r.kind == prepare_kind::cold_fallback);
  CHECK(h.fake->calls() ==
        calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a')), erase_call()});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->state == kvp::core::snapshot_state::invalid);
  CHECK(m->invalid_reason == "KV_SNAPSHOT_CORRUPT");
}

TEST_CASE("an unreachable backend never blocks requests (docs/design.md §19 'backend unavailable')",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.fake->set_unreachable(true);
  h.start();
  CHECK_FALSE(h.coord->pool().persistence_enabled());

  auto r = h.request("A", 1000);
  CHECK(r.ok);
  CHECK(r.kind == prepare_kind::none);
  CHECK(h.request("B", 1000).ok);
  CHECK(h.fake->slot_calls().empty());

  // Once the server answers, the next request turns persistence on and starts cold.
  h.fake->set_unreachable(false);
  auto r2 = h.request("A", 1000);
  CHECK(r2.kind == prepare_kind::cold);
  CHECK(h.coord->pool().persistence_enabled());
  CHECK(h.fake->slot_calls() == calls{erase_call()});
}

TEST_CASE("a server without --slot-save-path: requests are forwarded untouched",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.fake->slot_actions_disabled = true;
  h.start();
  CHECK_FALSE(h.coord->pool().persistence_enabled());
  CHECK(h.request("A", 1000).kind == prepare_kind::none);
  CHECK(h.request("B", 1000).kind == prepare_kind::none);
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});  // no re-probing, no slot calls
}

namespace {

using kvp::proxy::admission;

// A ticket through admit, as proxy/control/lease.hpp's acquire sends it.
// `pooled`: the request has a pooled upstream connection (false: it will open a fresh one).
admission admit(harness& h, const std::shared_ptr<lease_ticket>& t, const std::string& session,
                bool pooled = true) {
  t->who = {session, "", {}, ""};
  return h.run(h.coord->admit(t, t->who, pooled));
}

// Persistence off (no --slot-save-path): two requests, of A and B, admitted; both pass through.
std::pair<std::shared_ptr<lease_ticket>, std::shared_ptr<lease_ticket>> two_passing_through(
    harness& h) {
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  auto a = h.ticket(), b = h.ticket();
  REQUIRE(admit(h, a, "A").what == admission::outcome::pass_through);
  REQUIRE(admit(h, b, "B").what == admission::outcome::pass_through);
  return {a, b};
}

}  // namespace

TEST_CASE("persistence off: requests pass through without a slot and run at once",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  auto [a, b] = two_passing_through(h);
  CHECK_FALSE(h.coord->busy());
  CHECK(h.coord->passing_through() == 2);
  h.run(h.coord->finish(a, true));
  h.run(h.coord->release(b));
  h.run(h.coord->release(b));  // a second end counts once
  CHECK(h.coord->passing_through() == 0);
  CHECK(h.fake->calls().empty());
}

TEST_CASE("persistence back while requests pass through: no slot call until they end",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  auto [a, b] = two_passing_through(h);
  // llama-server restarted with --slot-save-path: the next admission probes and manages.
  h.fake->slot_actions_disabled = false;
  h.coord->note_upstream_trouble();
  auto c = h.ticket();
  CHECK(admit(h, c, "C").what == admission::outcome::queued);
  CHECK(h.coord->pool().persistence_enabled());
  auto d = h.ticket();
  CHECK(admit(h, d, "D").what == admission::outcome::queued);  // behind C, not through
  h.run(h.coord->finish(a, true));
  CHECK_FALSE(c->granted);
  CHECK(h.fake->slot_calls().empty());
  h.run(h.coord->finish(b, true));
  REQUIRE(c->granted);
  REQUIRE(h.run(h.coord->settle(c)));
  CHECK(h.run(h.coord->prepare(c, c->who, false)).kind == prepare_kind::cold);
  // What ran on the slot meanwhile is unknown: erased before C's turn (docs/design.md §20).
  CHECK(h.fake->slot_calls() == calls{erase_call()});
  CHECK(h.fake->calls().front() == FakeBackend::probe_call());
  h.run(h.coord->finish(c, true));
  CHECK(h.run(h.coord->settle(d)));
  h.run(h.coord->release(d));
}

TEST_CASE("persistence off: a request without a pooled connection probes before passing through",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  // llama-server restarted with --slot-save-path: only the new connection can tell.
  h.fake->slot_actions_disabled = false;
  h.fake->restart_server();
  auto a = h.ticket();
  CHECK(admit(h, a, "A").what == admission::outcome::pass_through);  // pooled: no reason to look
  h.run(h.coord->finish(a, true));
  CHECK(h.fake->calls().empty());
  auto b = h.ticket();
  CHECK(admit(h, b, "B", false).what == admission::outcome::granted);
  CHECK(h.coord->pool().persistence_enabled());
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});
  h.run(h.coord->release(b));
}

TEST_CASE("persistence off while a lease is held: requests keep taking leases until it ends",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_dirty();
  auto a = h.acquire();
  REQUIRE(h.run(h.coord->prepare(a, {"A", "", {}, ""}, false)).kind == prepare_kind::resident);
  auto b = h.ticket();
  REQUIRE(admit(h, b, "B").what == admission::outcome::queued);
  // llama-server restarted without --slot-save-path; B's fresh connection reads it.
  h.fake->slot_actions_disabled = true;
  h.fake->restart_server();
  h.run(h.coord->finish(a, true));
  REQUIRE(h.run(h.coord->settle(b)));
  CHECK(h.run(h.coord->prepare(b, b->who, true)).kind == prepare_kind::none);
  CHECK_FALSE(h.coord->pool().persistence_enabled());
  auto c = h.ticket();
  CHECK(admit(h, c, "C").what == admission::outcome::queued);  // B holds the slot
  h.run(h.coord->finish(b, true));
  REQUIRE(h.run(h.coord->settle(c)));
  h.run(h.coord->finish(c, true));
  auto d = h.ticket();
  CHECK(admit(h, d, "D").what == admission::outcome::pass_through);
  h.run(h.coord->finish(d, true));
  CHECK(h.fake->slot_calls().empty());  // A's turn was not saved: persistence is off
}

TEST_CASE("strict mode never passes through: session requests are refused as before",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path(), strict_options());
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  auto a = h.ticket();
  const auto adm = admit(h, a, "A");
  REQUIRE(adm.what == admission::outcome::prepared);
  CHECK_FALSE(adm.prepared.ok);
  CHECK(h.coord->passing_through() == 0);
}

TEST_CASE("a failed save of the previous owner (docs/design.md §19 'save failure')", "[proxy][coordinator]") {
  temp_dir tmp;

  SECTION("non-strict: B still runs") {
    harness h(tmp.path());
    h.start_with_a_dirty();
    h.fake->fail_next_save(failure::http(500));
    auto r = h.request("B", 500);
    CHECK(r.ok);
    CHECK(r.kind == prepare_kind::cold);
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});  // B keeps A's unsaved KV
    CHECK_FALSE(h.manifest_on_disk("A"));
    CHECK(h.coord->pool().owner(0) == h.hash("B"));
  }

  SECTION("strict: prepare fails and releases the lease to the next waiter") {
    harness h(tmp.path(), strict_options());
    h.start_with_a_dirty();
    h.fake->fail_next_save(failure::transport());

    auto t1 = h.acquire();
    auto t2 = h.enqueued();
    CHECK_FALSE(t2->granted);
    auto pr = h.run(h.coord->prepare(t1, {"B", "", {}, ""}, false));
    CHECK_FALSE(pr.ok);
    CHECK_FALSE(pr.message.empty());
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
    CHECK(t2->granted);  // the lease moved on
    CHECK(h.coord->waiting() == 0);

    // A is still in the slot, dirty: the next A request is resident.
    auto pr2 = h.run(h.coord->prepare(t2, {"A", "", {}, ""}, false));
    CHECK(pr2.ok);
    CHECK(pr2.kind == prepare_kind::resident);
    h.run(h.coord->finish(t2, true));
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
    CHECK_FALSE(h.coord->busy());
  }
}

TEST_CASE("strict mode: a failed restore fails the request and frees the slot",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), strict_options());
  h.start_with_a_saved_b_dirty();
  h.fake->fail_next_restore(failure::http(400));
  auto t = h.acquire();
  auto pr = h.run(h.coord->prepare(t, {"A", "", {}, ""}, false));
  CHECK_FALSE(pr.ok);
  CHECK_FALSE(h.coord->busy());
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  CHECK(h.coord->pool().owner(0).empty());  // the failed restore cleared the slot
}

TEST_CASE("auxiliary requests save the owner and never own the slot (docs/design.md §19)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_dirty();

  std::string aux_session, purpose;
  SECTION("session-title for A") {
    aux_session = "A";
    purpose = "session-title";
  }
  SECTION("a request without a session") {}

  auto r = h.request(aux_session, 50, purpose);
  CHECK(r.ok);
  CHECK(r.kind == prepare_kind::auxiliary);
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
  CHECK(h.coord->pool().owner(0).empty());

  auto r2 = h.request("A", 1100);
  CHECK(r2.kind == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a')), restore_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->tokens == 1000);  // the auxiliary request's 50 tokens were never saved as A
}

TEST_CASE("the idle checkpoint fires once after the idle time (docs/design.md §10)", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), idle_checkpoint_options(50ms));
  h.start_quiet();
  h.request("A", 1000);
  CHECK(h.fake->calls() == calls{erase_call()});

  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->tokens == 1000);
  CHECK_FALSE(h.coord->pool().owner_dirty(0));

  kvp::testing::run_for(h.ioc, 200ms);
  CHECK(h.fake->calls().size() == 2);  // not again

  // A new turn re-arms it; the next save rotates the generation.
  auto r = h.request("A", 1200);
  CHECK(r.kind == prepare_kind::resident);
  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() ==
        calls{erase_call(), save_call(h.file("A", 'a')), save_call(h.file("A", 'b'))});
  CHECK(h.manifest_on_disk("A")->generation == 'b');
}

TEST_CASE("a request arriving during an idle save waits for it", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), idle_checkpoint_options(30ms));
  h.start_quiet();
  h.request("A", 1000);
  h.fake->delay_save(200ms);
  drive_until(h.ioc, [&] { return h.fake->calls().size() == 2; });  // the idle save started
  REQUIRE(h.fake->calls().back() == save_call(h.file("A", 'a')));

  auto t = h.enqueued();
  CHECK_FALSE(t->granted);
  CHECK(h.coord->busy());
  drive_until(h.ioc, [&] { return t->granted; });
  REQUIRE(h.run(h.coord->settle(t)));
  auto pr = h.run(h.coord->prepare(t, {"A", "", {}, ""}, false));
  CHECK(pr.kind == prepare_kind::resident);
  h.run(h.coord->finish(t, false));
  CHECK(h.fake->calls().size() == 2);
  // The request waited for llama-server's write only; the commit lands on its own.
  drive_until(h.ioc, [&] {
    const auto m = h.manifest_on_disk("A");
    return m && m->tokens == 1000;
  });
}

TEST_CASE("the lease queue is FIFO and every waiter is woken", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();

  auto t1 = h.acquire();
  REQUIRE(h.run(h.coord->prepare(t1, {"S1", "", {}, ""}, false)).ok);
  h.fake->run_inference(100);

  std::vector<int> order;
  std::vector<std::future<void>> clients;
  for (int id = 2; id <= 4; ++id) {
    clients.push_back(
        kvp::testing::spawn(h.ioc.get_executor(), client(h.coord.get(), h.fake, id, &order)));
    drive_until(h.ioc, [&] { return h.coord->waiting() == static_cast<std::size_t>(id - 1); });
  }
  CHECK(order.empty());
  h.run(h.coord->finish(t1, true));
  // Well before the clients' 10 s wakeup timers would expire on their own.
  auto all_done = [&] {
    return std::all_of(clients.begin(), clients.end(),
                       [](const std::future<void>& c) { return is_ready(c); });
  };
  drive_until(h.ioc, all_done, 3s);
  for (auto& c : clients) c.get();
  CHECK(order == std::vector<int>{2, 3, 4});
  auto file_of = [&](int id) { return h.file("S" + std::to_string(id), 'a'); };
  // One credential: each session keeps the slot's content of the one before it.
  CHECK(h.fake->calls() == calls{erase_call(), save_call(file_of(1)), save_call(file_of(2)),
                                 save_call(file_of(3))});
  CHECK_FALSE(h.coord->busy());
}

TEST_CASE("a full queue refuses new tickets", "[proxy][coordinator]") {
  temp_dir tmp;
  auto o = test_options();
  o.max_waiting = 2;
  harness h(tmp.path(), o);
  h.start();
  auto t1 = h.acquire();
  auto t2 = h.ticket();
  auto t3 = h.ticket();
  auto t4 = h.ticket();
  CHECK(h.run(h.coord->enqueue(t2)));
  CHECK(h.run(h.coord->enqueue(t3)));
  CHECK_FALSE(h.run(h.coord->enqueue(t4)));
  CHECK(t4->rejected);
  CHECK_FALSE(t4->granted);
  CHECK(h.coord->waiting() == 2);
  CHECK(t1->id < t2->id);
  CHECK(t2->id < t3->id);
}

TEST_CASE("a waiter that gives up leaves the queue without touching the slot",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  auto t1 = h.acquire();
  auto t2 = h.enqueued();
  CHECK(h.coord->waiting() == 1);
  CHECK_FALSE(h.run(h.coord->settle(t2)));  // its timeout fired or its client left
  CHECK(h.coord->waiting() == 0);
  h.run(h.coord->release(t1));  // the holder never prepared either
  CHECK_FALSE(h.coord->busy());
  CHECK_FALSE(t2->granted);
  CHECK(h.fake->calls().empty());
  // The slot is free for the next one.
  CHECK(h.request("A", 10).kind == prepare_kind::cold);
}

TEST_CASE("prepare refuses a ticket that does not hold the lease", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  auto t1 = h.acquire();
  auto t2 = h.enqueued();
  auto pr = h.run(h.coord->prepare(t2, {"B", "", {}, ""}, false));
  CHECK_FALSE(pr.ok);
  CHECK(h.fake->calls().empty());
  h.run(h.coord->finish(t2, true));  // ignored: not the holder
  CHECK(h.coord->busy());
  CHECK_FALSE(t2->granted);
  h.run(h.coord->release(t1));
  CHECK(t2->granted);
}

TEST_CASE("management calls are serialized with the lease (docs/design.md §5)", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  h.fake->delay_restore(100ms);

  auto t1 = h.acquire();
  auto prep = h.spawn(h.coord->prepare(t1, {"A", "", {}, ""}, false));
  drive_until(h.ioc, [&] { return h.fake->calls().size() == 2; });  // save B, restore A started
  CHECK(h.fake->calls().back() == restore_call(h.file("A", 'a')));
  CHECK_FALSE(is_ready(prep));

  auto t2 = h.enqueued();
  CHECK_FALSE(t2->granted);
  drive_until(h.ioc, [&] { return is_ready(prep); });
  CHECK(prep.get().kind == prepare_kind::restored);
  CHECK_FALSE(t2->granted);
  h.fake->run_inference(1100);
  h.run(h.coord->finish(t1, true));
  CHECK(t2->granted);
  CHECK(h.fake->calls().size() == 2);
}

TEST_CASE("checkpoint() saves the dirty owner on shutdown, once (docs/design.md §10)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();

  SECTION("nothing to save") {
    CHECK(h.run(h.coord->checkpoint()));
    CHECK(h.fake->calls().empty());
  }

  SECTION("the dirty owner is saved, a second flush coalesces") {
    h.request("A", 1000);
    CHECK(h.run(h.coord->checkpoint()));
    CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
    auto m = h.manifest_on_disk("A");
    REQUIRE(m);
    CHECK(m->tokens == 1000);
    CHECK(h.run(h.coord->checkpoint()));
    CHECK(h.fake->calls().size() == 2);
    CHECK_FALSE(h.coord->busy());
  }

  SECTION("a failed save is reported") {
    h.request("A", 1000);
    h.fake->fail_next_save(failure::http(500));
    CHECK_FALSE(h.run(h.coord->checkpoint()));
  }

  SECTION("it waits for the request holding the lease") {
    auto t = h.acquire();
    REQUIRE(h.run(h.coord->prepare(t, {"A", "", {}, ""}, false)).ok);
    auto cp = h.spawn(h.coord->checkpoint());
    kvp::testing::run_for(h.ioc, 50ms);
    CHECK_FALSE(is_ready(cp));
    CHECK(h.fake->calls() == calls{erase_call()});
    h.fake->run_inference(1000);
    h.run(h.coord->finish(t, true));
    drive_until(h.ioc, [&] { return is_ready(cp); });
    CHECK(cp.get());
    CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
    CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);
    CHECK_FALSE(h.coord->busy());
  }
}

TEST_CASE("after a proxy restart the session restores from its manifest (acceptance 14-16)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  std::string file;
  {
    harness h1(tmp.path());
    h1.start();
    h1.request("A", 1000);
    REQUIRE(h1.run(h1.coord->checkpoint()));
    file = h1.file("A", 'a');
  }
  harness h2(tmp.path());
  h2.fake->put_snapshot(file, 1000);  // llama-server kept its save directory
  h2.start();
  h2.fake->clear_calls();
  auto r = h2.request("A", 1100);
  CHECK(r.kind == prepare_kind::restored);
  CHECK(h2.fake->calls() == calls{restore_call(file)});
}

TEST_CASE("a server restart is noticed on a fresh upstream connection (docs/design.md §4)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  h.request("A", 1000);
  REQUIRE(h.run(h.coord->checkpoint()));
  h.fake->clear_calls();

  SECTION("same server: GET /props, and GET /slots shows A's KV still there: resident") {
    auto r = h.request("A", 1100, "", true);
    CHECK(r.kind == prepare_kind::resident);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), backend_call{"inspect", -1, ""}});
  }
  SECTION("restarted behind a pinned marker (LLAMA_MEDIA_MARKER): the empty slot tells") {
    const auto marker = h.fake->runtime().media_marker;
    h.fake->restart_server();
    auto rt = h.fake->runtime();
    rt.media_marker = marker;
    h.fake->set_runtime(rt);
    auto r = h.request("A", 1100, "", true);
    CHECK(r.kind == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), backend_call{"inspect", -1, ""},
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("restarted server: ownership is reset and A restores") {
    h.fake->restart_server();
    auto r = h.request("A", 1100, "", true);
    CHECK(r.kind == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call(),
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("note_upstream_trouble has the same effect") {
    h.fake->restart_server();
    h.coord->note_upstream_trouble();
    auto r = h.request("A", 1100);
    CHECK(r.kind == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call(),
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("without a reason to look, a restart goes unnoticed (no extra calls)") {
    h.fake->restart_server();
    auto r = h.request("A", 1100);
    CHECK(r.kind == prepare_kind::resident);
    CHECK(h.fake->calls().empty());
  }
  SECTION("a different model: a new session key, cold") {
    auto old_hash = h.hash("A");
    auto rt = h.fake->runtime();
    rt.model_path = "/models/llama-3.1-8b-instruct-q4_k_m.gguf";
    h.fake->set_runtime(rt);
    h.fake->restart_server();
    auto r = h.request("A", 1100, "", true);
    CHECK(r.kind == prepare_kind::cold);
    // A new server process holds nothing: no erase (docs/design.md §20).
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call()});
    CHECK(h.coord->pool().content(0).whose == kvp::core::content_whose::known);
    CHECK(h.hash("A") != old_hash);
    REQUIRE(h.manifest_on_disk("A") == std::nullopt);
  }
}

TEST_CASE("repeated backend failures open the circuit, and requests keep flowing",
          "[proxy][coordinator]") {
  temp_dir tmp;
  auto o = session_scope_options();  // every cold start erases: three calls to fail
  o.pool.cooldown = 200ms;
  harness h(tmp.path(), o);
  h.start_quiet();
  h.fake->set_unreachable(true);  // down after the startup probe

  CHECK(h.request("A", 1000).ok);  // erase fails (1)
  CHECK(h.request("B", 1000).ok);  // save A fails (2), erase fails (3)
  CHECK(h.coord->pool().circuit().current() == kvp::core::breaker::state::open);
  CHECK(h.fake->slot_calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call()});

  h.fake->set_unreachable(false);
  auto r = h.request("A", 1000);
  CHECK(r.ok);
  CHECK(h.fake->slot_calls().size() == 3);  // skipped while open

  kvp::testing::run_for(h.ioc, 250ms);
  auto r2 = h.request("B", 500);
  CHECK(r2.ok);
  CHECK(h.fake->slot_calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call(),
                                      save_call(h.file("A", 'a')), erase_call()});
  CHECK(h.coord->pool().circuit().current() == kvp::core::breaker::state::closed);
}

// proxy/data/server.cpp's lease_guard releases a lease through coordinator::release when the
// request coroutine leaves by an exception after prepare(). core::slot_pool::
// abort_prepare() then leaves the slot in state `inference` with the owner kept, so the
// shutdown checkpoint (checkpoint_owner requires state `dirty`) no longer saves an owner
// that was dirty before that request.
TEST_CASE("a lease released after prepare still lets the shutdown checkpoint save the owner",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  h.request("A", 1000);  // A dirty, never saved
  h.fake->clear_calls();
  auto t = h.acquire();
  REQUIRE(h.run(h.coord->prepare(t, {"A", "", {}, ""}, false)).kind == prepare_kind::resident);
  h.run(h.coord->release(t));
  CHECK_FALSE(h.coord->busy());
  CHECK(h.run(h.coord->checkpoint()));
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
}

TEST_CASE("admin restore by 64-hex hash restores that session, like GET resolves it",
          "[proxy][coordinator][admin]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  auto r = h.run(h.coord->admin().restore(h.hash("A")));
  CHECK(r.result == admin_result::restored);
  CHECK(answer_admin_outcome(r).body == R"({"result":"restored"})");
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  CHECK(h.coord->pool().owner(0) == h.hash("A"));
  auto page = h.coord->admin().sessions_page("", 10);
  REQUIRE(page.sessions.size() == 2);  // A and B: no session named after A's hash
  CHECK(page.next.empty());
}

TEST_CASE("admin outcomes answer with their status and body", "[proxy][admin]") {
  const auto saved = answer_admin_outcome({admin_result::saved});
  CHECK(saved.status == 200);
  CHECK(saved.body == R"({"result":"saved"})");
  const auto unknown = answer_admin_outcome({admin_result::unknown_session});
  CHECK(unknown.status == 404);
  CHECK(unknown.body == R"({"error":{"code":404,"message":"unknown session"}})");
  const auto kept = answer_admin_outcome({admin_result::save_failed_kept_slot});
  CHECK(kept.status == 502);
  CHECK(kept.body == R"({"error":{"code":502,"message":"save failed: the session keeps its slot"}})");
  const auto purged = answer_admin_outcome(admin_outcome{admin_result::purged, 1234, true});
  CHECK(purged.status == 200);
  CHECK(purged.body == R"({"result":"purged","freedBytes":1234,"filesDeleted":true})");
}

TEST_CASE("purge in server-owned mode overwrites both generations with an empty slot",
          "[proxy][coordinator][admin][purge]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  REQUIRE(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);
  auto r = h.run(h.coord->admin().purge(h.hash("A")));
  CHECK(r.result == admin_result::purged);
  // B's unsaved turns are saved before the slot is used; then the slot is erased and its
  // empty content saved over both of A's names: the files hold no token of A's prompt.
  // The generation the manifest does not name goes first: a failure leaves the named one whole.
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), erase_call(),
                                 save_call(h.file("A", 'b')), save_call(h.file("A", 'a'))});
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 0u);
  CHECK(h.fake->snapshot_tokens(h.file("A", 'b')) == 0u);
  CHECK(h.fake->snapshot_tokens(h.file("B", 'a')) == 500u);
  CHECK_FALSE(h.coord->pool().session(h.hash("A")).has_value());
  CHECK(h.coord->pool().owner(0).empty());  // B let go: its next request restores
}

TEST_CASE("a purge that cannot overwrite the files answers 502 and still forgets the session",
          "[proxy][coordinator][admin][purge]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  h.fake->fail_next_erase(failure::http(500));
  auto r = h.run(h.coord->admin().purge(h.hash("A")));
  CHECK(r.result == admin_result::purged_files_kept);
  CHECK(answer_admin_outcome(r).status == 502);
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), erase_call()});
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);  // kept, and said so
  CHECK_FALSE(h.coord->pool().session(h.hash("A")).has_value());
}

TEST_CASE("sessions_page: hash order, `next` until the last page", "[proxy][coordinator][admin]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  std::vector<std::string> hashes;
  for (const char* s : {"S0", "S1", "S2", "S3", "S4"}) {
    h.request(s, 100);
    hashes.push_back(h.hash(s));
  }
  std::sort(hashes.begin(), hashes.end());
  std::vector<std::string> seen;
  std::string after;
  for (int pages = 1;; ++pages) {
    auto page = h.coord->admin().sessions_page(after, 2);
    for (const auto& row : page.sessions) seen.push_back(row.hash);
    if (page.next.empty()) {
      CHECK(pages == 3);
      break;
    }
    CHECK(page.next == page.sessions.back().hash);
    after = page.next;
  }
  CHECK(seen == hashes);
}

TEST_CASE("server-owned budget: a new session's manifest makes the oldest clean one go",
          "[proxy][coordinator][retention]") {
  temp_dir tmp;
  auto o = test_options();
  o.retention_max_sessions = 2;
  o.retention_interval = 1h;
  harness h(tmp.path(), o);
  h.start();
  for (const char* s : {"S0", "S1", "S2", "S3"}) h.request(s, 100);  // S0, S1, S2 saved
  // S2 was saved while it still owned the slot; of S0 and S1 (saved within a second or
  // two), the older goes, by hash when the second is the same. No file is touched.
  const bool s0_kept = h.manifest_on_disk("S0").has_value();
  const bool s1_kept = h.manifest_on_disk("S1").has_value();
  CHECK(s0_kept != s1_kept);
  CHECK(h.manifest_on_disk("S2"));
  CHECK(h.coord->admin().sessions_page("", 10).sessions.size() == 3);  // two snapshots + resident S3
  CHECK(h.fake->snapshot_tokens(h.file(s0_kept ? "S1" : "S0", 'a')) == 100u);
}

namespace {

// A session `id` of `credential` as an earlier run left it: saved long ago.
std::string write_old_manifest(const std::string& state_dir, const std::string& id,
                               const std::string& credential) {
  kvp::core::manifest m;
  m.session_id = id;
  m.session_hash = kvp::core::session_hash("test", "elsewhere.gguf", id, credential);
  m.instance_key = "test";
  m.model_id = "elsewhere.gguf";
  m.runtime_fingerprint = std::string(64, 'f');
  m.tokens = 100;
  m.bytes = 1000;
  m.revision = 1;
  m.created_at = m.updated_at = "2026-01-01T00:00:00Z";
  m.credential = credential;
  const kvp::proxy::manifest_store store(state_dir);
  REQUIRE(store.open().ok());
  REQUIRE(store.write(m).ok());
  return m.session_hash;
}

// How many of sessions <prefix>0 .. <prefix><n-1> have a manifest on disk.
int manifests_of(const harness& h, const std::string& prefix, int n) {
  int out = 0;
  for (int i = 0; i < n; ++i) out += h.manifest_on_disk(prefix + std::to_string(i)) ? 1 : 0;
  return out;
}

kvp::core::request_identity as(const std::string& credential, const std::string& session) {
  kvp::core::request_identity who{session, "", {}, credential};
  return who;
}

}  // namespace

// docs/design.md §12: over retention.maxSessions, the credential holding the most sessions
// loses its own least recently saved ones; a tenant's older snapshots stay.
TEST_CASE("a credential creating many sessions evicts its own, not another's",
          "[proxy][coordinator][retention]") {
  temp_dir tmp;
  auto o = test_options();
  o.retention_max_sessions = 5;
  o.retention_interval = 1h;
  const auto a0 = write_old_manifest(tmp.path(), "A0", "key-A");
  const auto a1 = write_old_manifest(tmp.path(), "A1", "key-A");
  harness h(tmp.path(), o);
  h.start();
  for (int i = 0; i < 8; ++i) CHECK(h.request_as(as("key-B", "B" + std::to_string(i)), 100).ok);
  CHECK(h.run(h.coord->checkpoint()));  // B7's save too; every commit on disk
  CHECK(std::filesystem::exists(tmp.path() + "/sessions/" + a0 + ".json"));
  CHECK(std::filesystem::exists(tmp.path() + "/sessions/" + a1 + ".json"));
  CHECK(manifests_of(h, "B", 8) == 3);  // saved within a second: which ones, by hash
}

TEST_CASE("retention.maxSessionsPerCredential: a credential over its cap loses its oldest",
          "[proxy][coordinator][retention]") {
  temp_dir tmp;
  auto o = test_options();
  o.retention_max_sessions_per_credential = 2;
  o.retention_interval = 1h;
  const auto a0 = write_old_manifest(tmp.path(), "A0", "key-A");
  harness h(tmp.path(), o);
  h.start();
  for (int i = 0; i < 4; ++i) CHECK(h.request_as(as("key-B", "B" + std::to_string(i)), 100).ok);
  CHECK(h.run(h.coord->checkpoint()));
  CHECK(std::filesystem::exists(tmp.path() + "/sessions/" + a0 + ".json"));
  CHECK(manifests_of(h, "B", 4) == 2);
}

// README "Security": limits.newSessionsPerMinute refuses a credential's new session before
// any slot work (no save of the dirty owner, no erase); known sessions and other credentials
// go on.
TEST_CASE("a new session over its credential's rate is refused with Retry-After, untouched",
          "[proxy][coordinator]") {
  temp_dir tmp;
  auto o = test_options();
  o.new_sessions_per_minute = 2;
  harness h(tmp.path(), o);
  h.start_quiet();
  CHECK(h.request_as(as("key-B", "B0"), 100).ok);
  CHECK(h.request_as(as("key-B", "B1"), 100).ok);  // B0 saved; B1 resident and dirty
  h.fake->clear_calls();
  const auto refused = h.request_as(as("key-B", "B2"), 100);  // no lease left held: request()
  CHECK_FALSE(refused.ok);
  CHECK(refused.code == kvp::core::errc::session_rate);
  CHECK(refused.retry_after == 30s);
  CHECK(h.fake->slot_calls().empty());
  CHECK_FALSE(h.coord->admin().session("B2"));
  CHECK(h.coord->pool().owner(0) == h.hash("B1"));
  CHECK(h.request_as(as("key-B", "B0"), 100).ok);  // a known session: B1 saved, B0 restored
  CHECK(h.request_as(as("key-A", "A0"), 100).ok);  // another credential: its own bucket
}

// docs/design.md §12: a session whose saves come back empty (llama-server refused its
// request, or cleared the slot) has no snapshot; retention.maxSessions bounds such records
// too, the least recently used going first. A session with a snapshot is retention's.
TEST_CASE("records without a snapshot are bounded by retention.maxSessions",
          "[proxy][coordinator][retention]") {
  temp_dir tmp;
  auto o = test_options();
  o.retention_max_sessions = 3;  // retention.intervalMs 0: snapshots wait for POST /kv/gc
  harness h(tmp.path(), o);
  h.start_quiet();
  h.request("A", 1000);  // saved when S0 takes the slot
  for (int i = 0; i < 10; ++i) h.request("S" + std::to_string(i), 0);  // an empty slot each
  CHECK(h.fake->snapshot_tokens(h.file("S0", 'a')) == 0u);  // what an empty save leaves
  std::vector<std::string> known;
  for (const auto& row : h.coord->admin().sessions_page("", 100).sessions) known.push_back(row.hash);
  std::vector<std::string> expected{h.hash("A"), h.hash("S7"), h.hash("S8"), h.hash("S9")};
  std::sort(expected.begin(), expected.end());
  CHECK(known == expected);
  CHECK(h.manifest_on_disk("A"));
  h.fake->clear_calls();
  auto back = h.request("A", 1100);
  CHECK(back.kind == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{save_call(h.file("S9", 'a')), restore_call(h.file("A", 'a'))});
}

// docs/design.md §12, "Disk budget": in server-owned mode kvpersist cannot delete
// llama-server's files, so a save that leaves no room under retention.maxTotalBytes has
// llama-server overwrite the oldest clean session's two files with the empty slot, from the
// slot just saved, before that slot serves the next session.
namespace {

// A session `id` an earlier run saved twice (both generations on disk, `bytes` each), long ago.
std::string write_old_session(const std::string& state_dir, const std::string& id,
                              std::uint64_t bytes) {
  kvp::core::manifest m;
  m.session_id = id;
  m.session_hash = kvp::core::session_hash("test", "elsewhere.gguf", id, "");
  m.instance_key = "test";
  m.model_id = "elsewhere.gguf";
  m.runtime_fingerprint = std::string(64, 'f');
  m.tokens = 100;
  m.bytes = m.previous_bytes = bytes;
  m.revision = 2;
  m.created_at = m.updated_at = "2026-01-01T00:00:00Z";
  const kvp::proxy::manifest_store store(state_dir);
  REQUIRE(store.open().ok());
  REQUIRE(store.write(m).ok());
  return m.session_hash;
}

coordinator_options disk_budget_options(std::uint64_t budget) {
  auto o = session_scope_options();  // a cold start erases: the calls below are exact
  o.retention_max_bytes = budget;
  o.retention_interval = 1h;
  return o;
}

constexpr std::uint64_t snapshot_of_100 = FakeBackend::header_bytes + 100 * FakeBackend::bytes_per_token;

}  // namespace

TEST_CASE("disk budget: a save that leaves no room overwrites the oldest session's files first",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);
  // Room for A's snapshot and one more as large: not for OLD's two files besides.
  harness h(tmp.path(), disk_budget_options(2 * snapshot_of_100 + 150'000));
  h.start();
  h.request("A", 100);
  h.fake->clear_calls();
  h.request("B", 100);
  // A saved; the slot, which held only A, erased and saved over OLD's generations (the one
  // its manifest does not name first); then B's cold start.
  const auto old_a = kvp::core::snapshot_filename(old, 'a');
  const auto old_b = kvp::core::snapshot_filename(old, 'b');
  CHECK(h.fake->calls() ==
        calls{save_call(h.file("A", 'a')), erase_call(), save_call(old_b), save_call(old_a),
              erase_call()});
  CHECK(h.fake->snapshot_tokens(old_a) == 0u);
  CHECK(h.fake->snapshot_tokens(old_b) == 0u);
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/sessions/" + old + ".json"));
  CHECK_FALSE(h.coord->pool().session(old).has_value());
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 100u);
  const auto a = h.manifest_on_disk("A");
  REQUIRE(a);
  CHECK(a->bytes == snapshot_of_100);
  CHECK(a->previous_bytes == 0u);
  // A comes back: its snapshot is restored, B's saved; nothing else to evict
  h.fake->clear_calls();
  h.request("A", 150);
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
}

TEST_CASE("disk budget: both generations count, and a session a request uses is never overwritten",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  // Room for one 100-token snapshot beside one more: A's two generations do not fit with B's.
  harness h(tmp.path(), disk_budget_options(2 * snapshot_of_100 + 1000));
  h.start();
  h.request("A", 100);
  h.request("B", 100);  // A.a saved: A alone fits
  h.request("A", 100);  // B.a saved; A is the one being restored: kept, over budget
  h.fake->clear_calls();
  h.request("B", 100);  // A.b saved (A: two generations); B is being restored: kept
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'b')), restore_call(h.file("B", 'a'))});
  REQUIRE(h.manifest_on_disk("A"));
  CHECK(h.manifest_on_disk("A")->previous_bytes == snapshot_of_100);
  h.fake->clear_calls();
  h.request("C", 100);  // B.b saved; C is new: A, the oldest clean, is overwritten
  CHECK(h.fake->calls() ==
        calls{save_call(h.file("B", 'b')), erase_call(), save_call(h.file("A", 'a')),
              save_call(h.file("A", 'b')), erase_call()});
  CHECK_FALSE(h.manifest_on_disk("A"));
  CHECK(h.fake->snapshot_tokens(h.file("B", 'b')) == 100u);
  // A comes back: forgotten, so a cold start (no restore of its overwritten files)
  h.fake->clear_calls();
  CHECK(h.request("A", 100).ok);
  CHECK(h.fake->calls() == calls{save_call(h.file("C", 'a')), erase_call(), save_call(h.file("B", 'a')),
                                 save_call(h.file("B", 'b')), erase_call()});
}

TEST_CASE("disk budget: gc overwrites what is over the budget without a save",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);  // 200'000 on disk
  harness h(tmp.path(), disk_budget_options(150'000));
  h.start_quiet();
  const auto report = h.run(h.coord->admin_gc());
  CHECK(report.evicted == 1);
  CHECK(report.freed_bytes == 200'000u);
  CHECK(report.remaining_sessions == 0);
  CHECK_FALSE(report.files_kept);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(kvp::core::snapshot_filename(old, 'b')),
                                 save_call(kvp::core::snapshot_filename(old, 'a'))});
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/sessions/" + old + ".json"));
}

TEST_CASE("disk budget: a snapshot that seeds new sessions ranks by its last use, not its save",
          "[proxy][coordinator][retention][disk_budget]") {
  using kvp::testing::chain;
  temp_dir tmp;
  auto o = disk_budget_options(4 * snapshot_of_100 + 1000);  // room for three, and one more
  o.pool.seed_across_sessions = true;
  harness h(tmp.path(), o);
  h.start_quiet();
  auto with_chain = [](const std::string& id, std::vector<kvp::core::chain_link> c) {
    kvp::core::request_identity who{id, "", std::move(c), ""};
    return who;
  };
  CHECK(h.request_as(with_chain("D", chain({1, 2, 3})), 100).ok);
  CHECK(h.request_as(with_chain("X", chain({50, 51})), 100).ok);  // D saved
  std::this_thread::sleep_for(1100ms);                             // updatedAt: 1 s resolution
  CHECK(h.request_as(with_chain("Y", chain({60, 61})), 100).ok);  // X saved, a second later
  std::this_thread::sleep_for(1100ms);
  h.fake->clear_calls();
  CHECK(h.request_as(with_chain("N", chain({1, 2, 9})), 100).ok);  // Y saved; D seeds N
  CHECK(h.fake->calls() == calls{save_call(h.file("Y", 'a')), restore_call(h.file("D", 'a'))});
  h.fake->clear_calls();
  CHECK(h.request_as(with_chain("Z", chain({70, 71})), 100).ok);  // N saved: one must go
  // D was saved first but used last: X, the least recently saved or used, is overwritten
  // (Z's cold start keeps the slot's content under the default scope: it is empty already)
  CHECK(h.fake->calls() == calls{save_call(h.file("N", 'a')), erase_call(),
                                 save_call(h.file("X", 'b')), save_call(h.file("X", 'a'))});
  CHECK_FALSE(h.manifest_on_disk("X"));
  CHECK(h.manifest_on_disk("D"));
}

TEST_CASE("disk budget: an idle checkpoint over the budget overwrites from the saved slot and lets its owner go",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);
  auto o = disk_budget_options(2 * snapshot_of_100 + 150'000);
  o.pool.idle_checkpoint = 50ms;
  harness h(tmp.path(), o);
  h.start_quiet();
  h.request("A", 100);
  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call(),
                                 save_call(kvp::core::snapshot_filename(old, 'b')),
                                 save_call(kvp::core::snapshot_filename(old, 'a'))});
  CHECK(h.coord->pool().owner(0).empty());  // its KV is gone from the slot: A restores next
  h.fake->clear_calls();
  CHECK(h.request("A", 150).ok);
  CHECK(h.fake->calls() == calls{restore_call(h.file("A", 'a'))});
}

TEST_CASE("disk budget: with persistence off gc forgets nothing, since it cannot overwrite",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);  // 200'000 on disk
  harness h(tmp.path(), disk_budget_options(150'000));
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  REQUIRE_FALSE(h.coord->pool().persistence_enabled());
  const auto report = h.run(h.coord->admin_gc());
  CHECK(report.evicted == 0);
  CHECK(report.remaining_bytes == 200'000u);
  CHECK(h.fake->calls().empty());
  CHECK(std::filesystem::exists(tmp.path() + "/sessions/" + old + ".json"));
}
