// Tests for proxy/control/coordinator.hpp driven with FakeBackend on an io_context (docs/design.md §19,
// §84): the lease protocol (enqueue -> settle -> prepare -> finish) with the exact
// management calls, manifests in a temporary state directory, idle and shutdown
// checkpoints, the FIFO queue and its bound. No sockets.
#include "proxy/control/coordinator.hpp"

#include <rapidjson/document.h>

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

#include "proxy/http/http_status.hpp"
#include "proxy/control/lease.hpp"
#include "tests/support/chains.hpp"
#include "tests/support/core_strings.hpp"
#include "tests/support/coordinator_on_fake.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace coordinator_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::prepare_kind;
using kvp::net::io_context;
using kvp::proxy::admin_result;
using kvp::proxy::coordinator;
using kvp::proxy::coordinator_options;
using kvp::net::awaitable;
using kvp::proxy::acquisition;
using kvp::proxy::lease;
using outcome = acquisition::outcome;
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

using kvp::testing::client_leaves_after;
using kvp::testing::client_stays;

kvp::core::request_identity named(const std::string& session, const std::string& purpose = "") {
  kvp::core::request_identity who{session, purpose, {}, ""};
  return who;
}

// One coordinator with a FakeBackend and a state directory, driven from the test thread.
// Requests go through proxy/control/lease.hpp as proxy/data/server.cpp sends them; what the
// tests see of the coordinator is what GET /kv/status, the session rows and the fake
// backend's recorded calls show.
struct harness : kvp::testing::coordinator_on_fake {
  std::string state_dir;
  int waits = 0;  // requests that had to queue (acquire's on_wait)

  explicit harness(const std::string& dir, coordinator_options o = test_options())
      : coordinator_on_fake(dir, std::move(o)), state_dir(dir) {}

  // A coroutine of the coordinator's own (start, checkpoint, admin), run on its strand.
  template <class T>
  T run(awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), coord->on_strand(std::move(a)));
  }
  template <class T>
  std::future<T> spawn(awaitable<T> a) {
    return kvp::testing::spawn(ioc.get_executor(), coord->on_strand(std::move(a)));
  }
  // A client's coroutine (acquire and the lease's steps hop onto the strand themselves).
  template <class T>
  T run_client(awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }
  template <class T>
  std::future<T> spawn_client(awaitable<T> a) {
    return kvp::testing::spawn(ioc.get_executor(), std::move(a));
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
    REQUIRE(request("A", 1000).ok());
    fake->clear_calls();
  }
  // Starts, then A (1000 tokens, saved when B took the slot) and B (500, resident and
  // dirty); forgets the calls so far.
  void start_with_a_saved_b_dirty() {
    start_with_a_dirty();
    REQUIRE(request("B", 500).ok());
    fake->clear_calls();
  }

  // `pooled`: the request has a pooled upstream connection (false: it opens a fresh one).
  awaitable<acquisition> acquire_for(kvp::core::request_identity who, bool pooled,
                                     std::function<awaitable<bool>()> gone = client_stays(),
                                     std::chrono::milliseconds timeout = 1h) {
    return kvp::proxy::acquire(*coord, std::move(who), false, pooled, timeout, std::move(gone),
                               [this] { ++waits; });
  }
  // The lease for `session`, required at once (the slot is free), not yet prepared.
  lease acquire(const std::string& session) {
    auto a = run_client(acquire_for(named(session), false));
    REQUIRE(a.what == outcome::granted);
    return std::move(a.held);
  }
  // A request for `session` that has to wait: its acquire, running, once it is in the queue.
  std::future<acquisition> enqueued(const std::string& session, bool pooled = true) {
    const int before = waits;
    auto f = spawn_client(acquire_for(named(session), pooled));
    drive_until(ioc, [&] { return waits > before || is_ready(f); });
    REQUIRE_FALSE(is_ready(f));
    return f;
  }
  // Whether a waiting request has been granted, after every handler ready now has run.
  bool granted(std::future<acquisition>& f) {
    kvp::testing::run_for(ioc, 20ms);
    return is_ready(f);
  }
  // The waiting request's lease, once granted.
  lease lease_of(std::future<acquisition>& f) {
    drive_until(ioc, [&] { return is_ready(f); });
    auto a = f.get();
    REQUIRE(a.what == outcome::granted);
    return std::move(a.held);
  }
  // One whole request: lease, prepare, inference leaving `tokens` in the slot, finish.
  prepare_result request(const std::string& session, std::uint64_t tokens,
                         const std::string& purpose = "", bool fresh_upstream = false) {
    return request_as(named(session, purpose), tokens, fresh_upstream);
  }
  // A request whose outcome the test reads from the calls and the state it leaves (setup,
  // or a fault it injected).
  void turn(const std::string& session, std::uint64_t tokens) {
    const auto prepared = request(session, tokens);
    (void)prepared;
  }
  // request() for any identity (a credential, a prefix chain). A pooled request granted at
  // once is prepared on the same trip, as proxy/data/server.cpp sends it; one on a fresh
  // upstream connection prepares on its own.
  prepare_result request_as(kvp::core::request_identity who, std::uint64_t tokens,
                            bool fresh_upstream = false) {
    const int queued_before = waits;
    auto a = run_client(acquire_for(who, !fresh_upstream));
    REQUIRE(a.what != outcome::rejected);
    REQUIRE(waits == queued_before);  // granted at once: nothing held the slot
    prepare_result pr = prepare_kind::none;  // pass_through: nothing to prepare
    if (a.what == outcome::granted) pr = run_client(a.held.prepare(who, fresh_upstream));
    if (pr.ok()) {
      fake->run_inference(tokens);
      run_client(a.held.finish(true));
    }
    CHECK_FALSE(busy());
    return pr;
  }

  // What GET /kv/status shows.
  rapidjson::Document status() const {
    rapidjson::Document d;
    d.Parse(coord->status_json().c_str());
    REQUIRE(d.IsObject());
    return d;
  }
  bool persistence_on() const { return status()["enabled"].GetBool(); }
  std::string backend_state() const { return status()["backend"]["state"].GetString(); }
  bool busy() const {
    const auto d = status();
    for (const auto& slot : d["slots"].GetArray())
      if (slot["leased"].GetBool()) return true;
    return false;
  }
  std::size_t waiting() const { return status()["queue"]["waiting"].GetUint64(); }
  std::size_t passing_through() const { return status()["queue"]["passThrough"].GetUint64(); }
  // Slot 0's owner as the status shows it (an abbreviated hash), "" for none.
  std::string owner_of_slot0() const {
    const auto d = status();
    const auto& owner = d["slots"][rapidjson::SizeType{0}]["owner"];
    return owner.IsNull() ? std::string() : std::string(owner.GetString());
  }
  bool owner_is(const std::string& session) const {
    return owner_of_slot0() == std::string(kvp::core::abbrev(hash(session)));
  }
  std::string slot0_state() const { return status()["slots"][rapidjson::SizeType{0}]["state"].GetString(); }
  bool known(const std::string& hash_or_id) const { return coord->admin().session(hash_or_id).ok(); }

  // The session's key under the runtime the server reports (core/slot_pool.hpp: hash_for).
  std::string hash(const std::string& session) const {
    return kvp::core::session_hash("test", fake->runtime().model_path, session, "");
  }
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

// A client session as proxy/data/server runs it: acquire (waiting in the queue), prepare,
// inference, finish. Records the order in which clients got the slot.
awaitable<void> client(coordinator* c, FakeBackend* fake, int id, std::vector<int>* order) {
  // (Each awaited operation is built in a named local first: GCC 12 mishandles some
  // temporaries inside co_await full-expressions.)
  const auto who = named("S" + std::to_string(id));
  auto acquiring = kvp::proxy::acquire(*c, who, false, false, 10s, client_stays(), [] {});
  auto acq = co_await std::move(acquiring);
  if (acq.what != outcome::granted) co_return;
  order->push_back(id);
  auto preparing = acq.held.prepare(who, false);
  auto pr = co_await std::move(preparing);
  if (!pr.ok()) co_return;
  fake->run_inference(100 * static_cast<std::uint64_t>(id));
  auto finishing = acq.held.finish(true);
  co_await std::move(finishing);
}

}  // namespace

TEST_CASE("A, A, B, A makes exactly the milestone's management calls (docs/design.md §6)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), session_scope_options());
  h.start();
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});
  CHECK(h.persistence_on());
  h.fake->clear_calls();

  auto r1 = h.request("A", 1000);
  CHECK(r1.ok());
  CHECK(r1.value() == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call()});

  auto r2 = h.request("A", 1200);
  CHECK(r2.ok());
  CHECK(r2.value() == prepare_kind::resident);
  CHECK(h.fake->calls() == calls{erase_call()});  // nothing, not even a probe

  auto r3 = h.request("B", 500);
  CHECK(r3.value() == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call()});

  auto r4 = h.request("A", 1300);
  CHECK(r4.value() == prepare_kind::restored);
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
  // The runtime's fingerprint as the coordinator computed it (the probe, runtimeKey and the
  // behaviour class): its own record of A's snapshot carries it, and a restarted proxy
  // restores only a manifest whose fingerprint it computes again ("after a proxy restart").
  const auto row = h.coord->admin().session("A");
  REQUIRE(row);
  REQUIRE(row->snapshot);
  CHECK(ma->runtime_fingerprint == row->snapshot->runtime_fingerprint);
  CHECK(ma->runtime_fingerprint.size() == 64);
  auto mb = h.manifest_on_disk("B");
  REQUIRE(mb);
  CHECK(mb->tokens == 500);
  CHECK(h.owner_is("A"));
}

TEST_CASE("A, A, B, A under the default scope: B keeps the slot's content (docs/design.md §20)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  CHECK(h.request("A", 1000).value() == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call()});  // what the slot held before kvpersist: unknown
  CHECK(h.request("A", 1200).value() == prepare_kind::resident);
  // B (the same credential): A is saved, then B runs on A's KV, where llama-server reuses
  // whatever prefix they share: no erase.
  CHECK(h.request("B", 500).value() == prepare_kind::cold);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
  CHECK(h.request("A", 1300).value() == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')),
                                 save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
}

TEST_CASE("resident requests cost no management call and no disk write (docs/design.md §2)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  for (int i = 0; i < 5; ++i) CHECK(h.request("A", 100 + i).ok());
  CHECK(h.fake->calls() == calls{erase_call()});
  CHECK_FALSE(h.manifest_on_disk("A"));
  CHECK(h.slot0_state() == "dirty");
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
  CHECK(r.ok());
  CHECK(r.value() == prepare_kind::cold_fallback);
  // The failed restore already cleared the slot: no erase.
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->state == kvp::core::snapshot_state::invalid);
  CHECK(m->invalid_reason == "KV_RESTORE_FAILED");
  CHECK(m->generation == 'a');

  // The session recovers: its next save goes to the other generation and is restorable.
  h.fake->clear_calls();
  h.turn("B", 600);
  h.turn("A", 1200);
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
  CHECK(r.value() == prepare_kind::cold_fallback);
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
  CHECK_FALSE(h.persistence_on());

  auto r = h.request("A", 1000);
  CHECK(r.ok());
  CHECK(r.value() == prepare_kind::none);
  CHECK(h.request("B", 1000).ok());
  CHECK(h.fake->slot_calls().empty());

  // Once the server answers, the next request turns persistence on and starts cold.
  h.fake->set_unreachable(false);
  auto r2 = h.request("A", 1000);
  CHECK(r2.value() == prepare_kind::cold);
  CHECK(h.persistence_on());
  CHECK(h.fake->slot_calls() == calls{erase_call()});
}

TEST_CASE("a server without --slot-save-path: requests are forwarded untouched",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.fake->slot_actions_disabled = true;
  h.start();
  CHECK_FALSE(h.persistence_on());
  CHECK(h.request("A", 1000).value() == prepare_kind::none);
  CHECK(h.request("B", 1000).value() == prepare_kind::none);
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});  // no re-probing, no slot calls
}

namespace {

// Persistence off (no --slot-save-path): two requests, of A and B, acquired; both pass through.
std::pair<acquisition, acquisition> two_passing_through(harness& h) {
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  auto a = h.run_client(h.acquire_for(named("A"), true));
  auto b = h.run_client(h.acquire_for(named("B"), true));
  REQUIRE(a.what == outcome::pass_through);
  REQUIRE(b.what == outcome::pass_through);
  return {std::move(a), std::move(b)};
}

}  // namespace

TEST_CASE("persistence off: requests pass through without a slot and run at once",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  auto [a, b] = two_passing_through(h);
  CHECK_FALSE(h.busy());
  CHECK(h.passing_through() == 2);
  h.run_client(a.held.finish(true));
  CHECK(h.passing_through() == 1);
  h.run_client(b.held.release());
  CHECK(h.passing_through() == 0);
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
  auto c = h.enqueued("C");  // queued
  CHECK(h.persistence_on());
  auto d = h.enqueued("D");  // behind C, not through
  h.run_client(a.held.finish(true));
  CHECK_FALSE(h.granted(c));
  CHECK(h.fake->slot_calls().empty());
  h.run_client(b.held.finish(true));
  auto c_lease = h.lease_of(c);
  CHECK(h.run_client(c_lease.prepare(named("C"), false)).value() == prepare_kind::cold);
  // What ran on the slot meanwhile is unknown: erased before C's turn (docs/design.md §20).
  CHECK(h.fake->slot_calls() == calls{erase_call()});
  CHECK(h.fake->calls().front() == FakeBackend::probe_call());
  h.run_client(c_lease.finish(true));
  auto d_lease = h.lease_of(d);
  h.run_client(d_lease.release());
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
  auto a = h.run_client(h.acquire_for(named("A"), true));
  CHECK(a.what == outcome::pass_through);  // pooled: no reason to look
  h.run_client(a.held.finish(true));
  CHECK(h.fake->calls().empty());
  auto b = h.run_client(h.acquire_for(named("B"), false));
  CHECK(b.what == outcome::granted);
  CHECK(h.persistence_on());
  CHECK(h.fake->calls() == calls{FakeBackend::probe_call()});
  h.run_client(b.held.release());
}

TEST_CASE("persistence off while a lease is held: requests keep taking leases until it ends",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_dirty();
  auto a = h.acquire("A");
  REQUIRE(h.run_client(a.prepare(named("A"), false)).value() == prepare_kind::resident);
  auto b = h.enqueued("B");  // queued
  // llama-server restarted without --slot-save-path; B's fresh connection reads it.
  h.fake->slot_actions_disabled = true;
  h.fake->restart_server();
  h.run_client(a.finish(true));
  auto b_lease = h.lease_of(b);
  CHECK(h.run_client(b_lease.prepare(named("B"), true)).value() == prepare_kind::none);
  CHECK_FALSE(h.persistence_on());
  auto c = h.enqueued("C");  // queued: B holds the slot
  h.run_client(b_lease.finish(true));
  auto c_lease = h.lease_of(c);
  h.run_client(c_lease.finish(true));
  auto d = h.run_client(h.acquire_for(named("D"), true));
  CHECK(d.what == outcome::pass_through);
  h.run_client(d.held.finish(true));
  CHECK(h.fake->slot_calls().empty());  // A's turn was not saved: persistence is off
}

namespace {

// `sharing: credential` in single-slot mode in front of -np 2: persistence off, slot actions on.
coordinator_options credential_scope() {
  auto o = test_options();
  o.pool.seed_within_credential = true;
  return o;
}

kvp::core::request_identity keyed(const std::string& session, const std::string& credential) {
  auto who = named(session);
  who.credential = credential;
  return who;
}

}  // namespace

TEST_CASE("persistence off with slot actions: another credential's request erases every slot",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path(), credential_scope());
  auto rt = h.fake->runtime();
  rt.total_slots = 2;
  h.fake->set_runtime(rt);
  h.start_quiet();
  REQUIRE_FALSE(h.persistence_on());
  CHECK(h.request_as(keyed("A", "kA"), 100).value() == prepare_kind::none);  // passes through
  CHECK(h.request_as(keyed("A2", "kA"), 100).value() == prepare_kind::none);
  CHECK(h.fake->slot_calls().empty());

  auto b = h.run_client(h.acquire_for(keyed("B", "kB"), true));
  REQUIRE(b.what == outcome::granted);  // the whole server, not a pass-through
  CHECK(b.held.exclusive());
  CHECK(h.run_client(b.held.prepare(keyed("B", "kB"), false)).value() == prepare_kind::none);
  CHECK(h.fake->slot_calls() == calls{erase_call(0), erase_call(1)});
  h.run_client(b.held.finish(true));

  h.fake->clear_calls();
  CHECK(h.request_as(keyed("B2", "kB"), 100).value() == prepare_kind::none);  // the tenant's
  CHECK(h.fake->slot_calls().empty());

  SECTION("a failed erase refuses the request and frees the server") {
    h.fake->fail_next_erase(failure::http(500));
    auto a = h.run_client(h.acquire_for(keyed("A", "kA"), true));
    REQUIRE(a.what == outcome::granted);
    const auto pr = h.run_client(a.held.prepare(keyed("A", "kA"), false));
    REQUIRE_FALSE(pr.ok());
    CHECK(pr.err().code == kvp::core::errc::erase_failed);
    CHECK_FALSE(h.busy());
    CHECK(h.request_as(keyed("B3", "kB"), 100).value() == prepare_kind::none);  // still B's
  }
  SECTION("under sharing: instance nothing is erased") {
    temp_dir tmp2;
    harness i(tmp2.path());
    i.fake->set_runtime(rt);
    i.start_quiet();
    CHECK(i.request_as(keyed("A", "kA"), 100).value() == prepare_kind::none);
    CHECK(i.request_as(keyed("B", "kB"), 100).value() == prepare_kind::none);
    CHECK(i.fake->slot_calls().empty());
  }
}

TEST_CASE("persistence back while another credential waits for the server: it still erases",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path(), credential_scope());
  auto rt = h.fake->runtime();
  rt.total_slots = 2;
  h.fake->set_runtime(rt);
  h.start_quiet();
  auto a = h.run_client(h.acquire_for(keyed("A", "kA"), true));
  REQUIRE(a.what == outcome::pass_through);
  auto b = h.spawn_client(h.acquire_for(keyed("B", "kB"), true));
  drive_until(h.ioc, [&] { return h.waits > 0; });  // B waits for A's request to end
  // llama-server restarted with -np 1 meanwhile: B's prepare reads it, persistence is on.
  rt.total_slots = 1;
  h.fake->set_runtime(rt);
  h.coord->note_upstream_trouble();
  h.run_client(a.held.finish(true));
  auto b_lease = h.lease_of(b);
  REQUIRE(b_lease.exclusive());
  REQUIRE(h.run_client(b_lease.prepare(keyed("B", "kB"), false)).ok());
  CHECK(h.persistence_on());
  CHECK(h.fake->slot_calls() == calls{erase_call(0)});  // what A's request left
  h.run_client(b_lease.finish(true));
}

TEST_CASE("strict mode never passes through: session requests are refused as before",
          "[proxy][coordinator][pass-through]") {
  temp_dir tmp;
  harness h(tmp.path(), strict_options());
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  auto a = h.run_client(h.acquire_for(named("A"), true));
  REQUIRE(a.what == outcome::granted);
  CHECK_FALSE(a.held);  // refused in admission's trip: the coordinator released it
  CHECK_FALSE(h.run_client(a.held.prepare(named("A"), false)).ok());
  CHECK(h.passing_through() == 0);
}

TEST_CASE("a failed save of the previous owner (docs/design.md §19 'save failure')", "[proxy][coordinator]") {
  temp_dir tmp;

  SECTION("non-strict: B still runs") {
    harness h(tmp.path());
    h.start_with_a_dirty();
    h.fake->fail_next_save(failure::http(500));
    auto r = h.request("B", 500);
    CHECK(r.ok());
    CHECK(r.value() == prepare_kind::cold);
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});  // B keeps A's unsaved KV
    CHECK_FALSE(h.manifest_on_disk("A"));
    CHECK(h.owner_is("B"));
  }

  SECTION("strict: prepare fails and releases the lease to the next waiter") {
    harness h(tmp.path(), strict_options());
    h.start_with_a_dirty();
    h.fake->fail_next_save(failure::transport());

    auto t1 = h.acquire("B");
    auto t2 = h.enqueued("A");
    CHECK_FALSE(h.granted(t2));
    auto pr = h.run_client(t1.prepare(named("B"), false));
    CHECK_FALSE(pr.ok());
    CHECK_FALSE(pr.err().message.empty());
    CHECK_FALSE(t1);  // the coordinator released it
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
    CHECK(h.granted(t2));  // the lease moved on
    CHECK(h.waiting() == 0);

    // A is still in the slot, dirty: the next A request is resident.
    auto a_lease = h.lease_of(t2);
    auto pr2 = h.run_client(a_lease.prepare(named("A"), false));
    CHECK(pr2.ok());
    CHECK(pr2.value() == prepare_kind::resident);
    h.run_client(a_lease.finish(true));
    CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
    CHECK_FALSE(h.busy());
  }
}

TEST_CASE("strict mode: a failed restore fails the request and frees the slot",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), strict_options());
  h.start_with_a_saved_b_dirty();
  h.fake->fail_next_restore(failure::http(400));
  auto t = h.acquire("A");
  auto pr = h.run_client(t.prepare(named("A"), false));
  CHECK_FALSE(pr.ok());
  CHECK_FALSE(h.busy());
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  CHECK(h.owner_of_slot0().empty());  // the failed restore cleared the slot
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
  CHECK(r.ok());
  CHECK(r.value() == prepare_kind::auxiliary);
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
  CHECK(h.owner_of_slot0().empty());

  auto r2 = h.request("A", 1100);
  CHECK(r2.value() == prepare_kind::restored);
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a')), restore_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->tokens == 1000);  // the auxiliary request's 50 tokens were never saved as A
}

TEST_CASE("the idle checkpoint fires once after the idle time (docs/design.md §10)", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), idle_checkpoint_options(50ms));
  h.start_quiet();
  h.turn("A", 1000);
  CHECK(h.fake->calls() == calls{erase_call()});

  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
  auto m = h.manifest_on_disk("A");
  REQUIRE(m);
  CHECK(m->tokens == 1000);
  CHECK_FALSE(h.slot0_state() == "dirty");

  kvp::testing::run_for(h.ioc, 200ms);
  CHECK(h.fake->calls().size() == 2);  // not again

  // A new turn re-arms it; the next save rotates the generation.
  auto r = h.request("A", 1200);
  CHECK(r.value() == prepare_kind::resident);
  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() ==
        calls{erase_call(), save_call(h.file("A", 'a')), save_call(h.file("A", 'b'))});
  CHECK(h.manifest_on_disk("A")->generation == 'b');
}

TEST_CASE("a request arriving during an idle save waits for it", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path(), idle_checkpoint_options(30ms));
  h.start_quiet();
  h.turn("A", 1000);
  h.fake->delay_save(200ms);
  drive_until(h.ioc, [&] { return h.fake->calls().size() == 2; });  // the idle save started
  REQUIRE(h.fake->calls().back() == save_call(h.file("A", 'a')));

  auto t = h.enqueued("A", false);
  CHECK(h.busy());
  auto a_lease = h.lease_of(t);
  auto pr = h.run_client(a_lease.prepare(named("A"), false));
  CHECK(pr.value() == prepare_kind::resident);
  h.run_client(a_lease.finish(false));
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

  auto t1 = h.acquire("S1");
  REQUIRE(h.run_client(t1.prepare(named("S1"), false)).ok());
  h.fake->run_inference(100);

  std::vector<int> order;
  std::vector<std::future<void>> clients;
  for (int id = 2; id <= 4; ++id) {
    clients.push_back(
        kvp::testing::spawn(h.ioc.get_executor(), client(h.coord.get(), h.fake, id, &order)));
    drive_until(h.ioc, [&] { return h.waiting() == static_cast<std::size_t>(id - 1); });
  }
  CHECK(order.empty());
  h.run_client(t1.finish(true));
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
  CHECK_FALSE(h.busy());
}

TEST_CASE("a full queue refuses new tickets", "[proxy][coordinator]") {
  temp_dir tmp;
  auto o = test_options();
  o.max_waiting = 2;
  harness h(tmp.path(), o);
  h.start();
  auto t1 = h.acquire("S1");
  auto t2 = h.enqueued("S2");
  auto t3 = h.enqueued("S3");
  auto t4 = h.run_client(h.acquire_for(named("S4"), true));
  CHECK(t4.what == outcome::rejected);
  CHECK_FALSE(t4.held);
  CHECK(h.waiting() == 2);
  // The refused request took no place: the two waiting are granted in their order.
  h.run_client(t1.release());
  auto l2 = h.lease_of(t2);
  CHECK_FALSE(h.granted(t3));
  h.run_client(l2.release());
  auto l3 = h.lease_of(t3);
  h.run_client(l3.release());
  CHECK(h.waiting() == 0);
}

TEST_CASE("a waiter that gives up leaves the queue without touching the slot",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_quiet();
  auto t1 = h.acquire("S1");
  SECTION("its timeout fired") {
    auto t2 = h.run_client(h.acquire_for(named("S2"), true, client_stays(), 30ms));
    CHECK(t2.what == outcome::timed_out);
    CHECK_FALSE(t2.held);
  }
  SECTION("its client left") {
    auto t2 = h.spawn_client(h.acquire_for(named("S2"), true, client_leaves_after(100ms)));
    drive_until(h.ioc, [&] { return h.waits == 1; });
    CHECK(h.waiting() == 1);
    drive_until(h.ioc, [&] { return is_ready(t2); });
    const auto gone = t2.get();
    CHECK(gone.what == outcome::client_gone);
    CHECK_FALSE(gone.held);
  }
  CHECK(h.waiting() == 0);
  h.run_client(t1.release());  // the holder never prepared either
  CHECK_FALSE(h.busy());  // nobody was left to take it
  CHECK(h.fake->calls().empty());
  // The slot is free for the next one.
  CHECK(h.request("A", 10).value() == prepare_kind::cold);
}

TEST_CASE("management calls are serialized with the lease (docs/design.md §5)", "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  h.fake->delay_restore(100ms);

  auto t1 = h.acquire("A");
  auto prep = h.spawn_client(t1.prepare(named("A"), false));
  drive_until(h.ioc, [&] { return h.fake->calls().size() == 2; });  // save B, restore A started
  CHECK(h.fake->calls().back() == restore_call(h.file("A", 'a')));
  CHECK_FALSE(is_ready(prep));

  auto t2 = h.enqueued("B");
  CHECK_FALSE(h.granted(t2));
  drive_until(h.ioc, [&] { return is_ready(prep); });
  CHECK(prep.get().value() == prepare_kind::restored);
  CHECK_FALSE(h.granted(t2));
  h.fake->run_inference(1100);
  h.run_client(t1.finish(true));
  CHECK(h.granted(t2));
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
    h.turn("A", 1000);
    CHECK(h.run(h.coord->checkpoint()));
    CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
    auto m = h.manifest_on_disk("A");
    REQUIRE(m);
    CHECK(m->tokens == 1000);
    CHECK(h.run(h.coord->checkpoint()));
    CHECK(h.fake->calls().size() == 2);
    CHECK_FALSE(h.busy());
  }

  SECTION("a failed save is reported") {
    h.turn("A", 1000);
    h.fake->fail_next_save(failure::http(500));
    const auto saved = h.run(h.coord->checkpoint());
    REQUIRE_FALSE(saved);
    CHECK(saved.err().code == kvp::core::errc::save_failed);
  }

  SECTION("it waits for the request holding the lease") {
    auto t = h.acquire("A");
    REQUIRE(h.run_client(t.prepare(named("A"), false)).ok());
    auto cp = h.spawn(h.coord->checkpoint());
    kvp::testing::run_for(h.ioc, 50ms);
    CHECK_FALSE(is_ready(cp));
    CHECK(h.fake->calls() == calls{erase_call()});
    h.fake->run_inference(1000);
    h.run_client(t.finish(true));
    drive_until(h.ioc, [&] { return is_ready(cp); });
    CHECK(cp.get());
    CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a'))});
    CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);
    CHECK_FALSE(h.busy());
  }
}

TEST_CASE("after a proxy restart the session restores from its manifest (acceptance 14-16)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  std::string file;
  {
    harness h1(tmp.path());
    h1.start();
    h1.turn("A", 1000);
    REQUIRE(h1.run(h1.coord->checkpoint()));
    file = h1.file("A", 'a');
  }
  harness h2(tmp.path());
  h2.fake->put_snapshot(file, 1000);  // llama-server kept its save directory
  h2.start();
  h2.fake->clear_calls();
  auto r = h2.request("A", 1100);
  CHECK(r.value() == prepare_kind::restored);
  CHECK(h2.fake->calls() == calls{restore_call(file)});
}

TEST_CASE("a server restart is noticed on a fresh upstream connection (docs/design.md §4)",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  h.turn("A", 1000);
  REQUIRE(h.run(h.coord->checkpoint()));
  h.fake->clear_calls();

  SECTION("same server: GET /props, and GET /slots shows A's KV still there: resident") {
    auto r = h.request("A", 1100, "", true);
    CHECK(r.value() == prepare_kind::resident);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), backend_call{"inspect", -1, ""}});
  }
  SECTION("restarted behind a pinned marker (LLAMA_MEDIA_MARKER): the empty slot tells") {
    const auto marker = h.fake->runtime().media_marker;
    h.fake->restart_server();
    auto rt = h.fake->runtime();
    rt.media_marker = marker;
    h.fake->set_runtime(rt);
    auto r = h.request("A", 1100, "", true);
    CHECK(r.value() == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), backend_call{"inspect", -1, ""},
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("restarted server: ownership is reset and A restores") {
    h.fake->restart_server();
    auto r = h.request("A", 1100, "", true);
    CHECK(r.value() == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call(),
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("note_upstream_trouble has the same effect") {
    h.fake->restart_server();
    h.coord->note_upstream_trouble();
    auto r = h.request("A", 1100);
    CHECK(r.value() == prepare_kind::restored);
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call(),
                                   restore_call(h.file("A", 'a'))});
  }
  SECTION("without a reason to look, a restart goes unnoticed (no extra calls)") {
    h.fake->restart_server();
    auto r = h.request("A", 1100);
    CHECK(r.value() == prepare_kind::resident);
    CHECK(h.fake->calls().empty());
  }
  SECTION("a different model: a new session key, cold") {
    auto old_hash = h.hash("A");
    auto rt = h.fake->runtime();
    rt.model_path = "/models/llama-3.1-8b-instruct-q4_k_m.gguf";
    h.fake->set_runtime(rt);
    h.fake->restart_server();
    auto r = h.request("A", 1100, "", true);
    CHECK(r.value() == prepare_kind::cold);
    // A new server process holds nothing: no erase (docs/design.md §20).
    CHECK(h.fake->calls() == calls{FakeBackend::props_call(), FakeBackend::probe_call()});
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

  CHECK(h.request("A", 1000).ok());  // erase fails (1)
  CHECK(h.request("B", 1000).ok());  // save A fails (2), erase fails (3)
  CHECK(h.backend_state() == "open");
  CHECK(h.fake->slot_calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call()});

  h.fake->set_unreachable(false);
  auto r = h.request("A", 1000);
  CHECK(r.ok());
  CHECK(h.fake->slot_calls().size() == 3);  // skipped while open

  kvp::testing::run_for(h.ioc, 250ms);
  auto r2 = h.request("B", 500);
  CHECK(r2.ok());
  CHECK(h.fake->slot_calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call(),
                                      save_call(h.file("A", 'a')), erase_call()});
  CHECK(h.backend_state() == "healthy");
}

// proxy/data/server.cpp's lease_guard releases a lease through coordinator::release when the
// request coroutine leaves by an exception after prepare(). core::plan_outcomes::
// abort_prepare() then leaves the slot in state `inference` with the owner kept, so the
// shutdown checkpoint (checkpoint_owner requires state `dirty`) no longer saves an owner
// that was dirty before that request.
TEST_CASE("a lease released after prepare still lets the shutdown checkpoint save the owner",
          "[proxy][coordinator]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  h.turn("A", 1000);  // A dirty, never saved
  h.fake->clear_calls();
  auto t = h.acquire("A");
  REQUIRE(h.run_client(t.prepare(named("A"), false)).value() == prepare_kind::resident);
  h.run_client(t.release());
  CHECK_FALSE(h.busy());
  CHECK(h.run(h.coord->checkpoint()));
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'a'))});
}

TEST_CASE("admin restore by 64-hex hash restores that session, like GET resolves it",
          "[proxy][coordinator][admin]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  auto r = h.run(h.coord->admin().restore(h.hash("A")));
  REQUIRE(r);
  CHECK(r.value().result == admin_result::restored);
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
  CHECK(h.owner_is("A"));
  auto page = h.coord->admin().sessions_page("", 10);
  REQUIRE(page.sessions.size() == 2);  // A and B: no session named after A's hash
  CHECK(page.next.empty());
}

TEST_CASE("purge in server-owned mode overwrites both generations with an empty slot",
          "[proxy][coordinator][admin][purge]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  REQUIRE(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);
  auto r = h.run(h.coord->admin().purge(h.hash("A")));
  REQUIRE(r);
  CHECK(r.value().result == admin_result::purged);
  // B's unsaved turns are saved before the slot is used; then the slot is erased and its
  // empty content saved over both of A's names: the files hold no token of A's prompt.
  // The generation the manifest does not name goes first: a failure leaves the named one whole.
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), erase_call(),
                                 save_call(h.file("A", 'b')), save_call(h.file("A", 'a'))});
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 0u);
  CHECK(h.fake->snapshot_tokens(h.file("A", 'b')) == 0u);
  CHECK(h.fake->snapshot_tokens(h.file("B", 'a')) == 500u);
  CHECK_FALSE(h.known(h.hash("A")));
  CHECK(h.owner_of_slot0().empty());  // B let go: its next request restores
}

TEST_CASE("a purge that cannot overwrite the files answers 502 and still forgets the session",
          "[proxy][coordinator][admin][purge]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start_with_a_saved_b_dirty();
  h.fake->fail_next_erase(failure::http(500));
  auto r = h.run(h.coord->admin().purge(h.hash("A")));
  REQUIRE_FALSE(r);
  CHECK(r.err().code == kvp::core::errc::snapshot_files_kept);
  CHECK(kvp::proxy::error_response(r.err(), 11, true).result() == kvp::http::status::bad_gateway);
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), erase_call()});
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 1000u);  // kept, and said so
  CHECK_FALSE(h.known(h.hash("A")));
}

TEST_CASE("sessions_page: hash order, `next` until the last page", "[proxy][coordinator][admin]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  std::vector<std::string> hashes;
  for (const char* s : {"S0", "S1", "S2", "S3", "S4"}) {
    h.turn(s, 100);
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
  for (const char* s : {"S0", "S1", "S2", "S3"}) h.turn(s, 100);  // S0, S1, S2 saved
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
  for (int i = 0; i < 8; ++i) CHECK(h.request_as(as("key-B", "B" + std::to_string(i)), 100).ok());
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
  for (int i = 0; i < 4; ++i) CHECK(h.request_as(as("key-B", "B" + std::to_string(i)), 100).ok());
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
  CHECK(h.request_as(as("key-B", "B0"), 100).ok());
  CHECK(h.request_as(as("key-B", "B1"), 100).ok());  // B0 saved; B1 resident and dirty
  h.fake->clear_calls();
  const auto refused = h.request_as(as("key-B", "B2"), 100);  // no lease left held: request()
  CHECK_FALSE(refused.ok());
  CHECK(refused.err().code == kvp::core::errc::session_rate);
  CHECK(refused.err().retry_after_s == 30);
  CHECK(h.fake->slot_calls().empty());
  CHECK_FALSE(h.coord->admin().session("B2"));
  CHECK(h.owner_is("B1"));
  CHECK(h.request_as(as("key-B", "B0"), 100).ok());  // a known session: B1 saved, B0 restored
  CHECK(h.request_as(as("key-A", "A0"), 100).ok());  // another credential: its own bucket
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
  h.turn("A", 1000);  // saved when S0 takes the slot
  for (int i = 0; i < 10; ++i) h.turn("S" + std::to_string(i), 0);  // an empty slot each
  CHECK(h.fake->snapshot_tokens(h.file("S0", 'a')) == 0u);  // what an empty save leaves
  std::vector<std::string> known;
  for (const auto& row : h.coord->admin().sessions_page("", 100).sessions) known.push_back(row.hash);
  std::vector<std::string> expected{h.hash("A"), h.hash("S7"), h.hash("S8"), h.hash("S9")};
  std::sort(expected.begin(), expected.end());
  CHECK(known == expected);
  CHECK(h.manifest_on_disk("A"));
  h.fake->clear_calls();
  auto back = h.request("A", 1100);
  CHECK(back.value() == prepare_kind::restored);
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
  h.turn("A", 100);
  h.fake->clear_calls();
  h.turn("B", 100);
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
  CHECK_FALSE(h.known(old));
  CHECK(h.fake->snapshot_tokens(h.file("A", 'a')) == 100u);
  const auto a = h.manifest_on_disk("A");
  REQUIRE(a);
  CHECK(a->bytes == snapshot_of_100);
  CHECK(a->previous_bytes == 0u);
  // A comes back: its snapshot is restored, B's saved; nothing else to evict
  h.fake->clear_calls();
  h.turn("A", 150);
  CHECK(h.fake->calls() == calls{save_call(h.file("B", 'a')), restore_call(h.file("A", 'a'))});
}

TEST_CASE("disk budget: both generations count, and a session a request uses is never overwritten",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  // Room for one 100-token snapshot beside one more: A's two generations do not fit with B's.
  harness h(tmp.path(), disk_budget_options(2 * snapshot_of_100 + 1000));
  h.start();
  h.turn("A", 100);
  h.turn("B", 100);  // A.a saved: A alone fits
  h.turn("A", 100);  // B.a saved; A is the one being restored: kept, over budget
  h.fake->clear_calls();
  h.turn("B", 100);  // A.b saved (A: two generations); B is being restored: kept
  CHECK(h.fake->calls() == calls{save_call(h.file("A", 'b')), restore_call(h.file("B", 'a'))});
  REQUIRE(h.manifest_on_disk("A"));
  CHECK(h.manifest_on_disk("A")->previous_bytes == snapshot_of_100);
  h.fake->clear_calls();
  h.turn("C", 100);  // B.b saved; C is new: A, the oldest clean, is overwritten
  CHECK(h.fake->calls() ==
        calls{save_call(h.file("B", 'b')), erase_call(), save_call(h.file("A", 'a')),
              save_call(h.file("A", 'b')), erase_call()});
  CHECK_FALSE(h.manifest_on_disk("A"));
  CHECK(h.fake->snapshot_tokens(h.file("B", 'b')) == 100u);
  // A comes back: forgotten, so a cold start (no restore of its overwritten files)
  h.fake->clear_calls();
  CHECK(h.request("A", 100).ok());
  CHECK(h.fake->calls() == calls{save_call(h.file("C", 'a')), erase_call(), save_call(h.file("B", 'a')),
                                 save_call(h.file("B", 'b')), erase_call()});
}

TEST_CASE("disk budget: gc overwrites what is over the budget without a save",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);  // 200'000 on disk
  harness h(tmp.path(), disk_budget_options(150'000));
  h.start_quiet();
  const auto report = h.run(h.coord->admin().gc());
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
  CHECK(h.request_as(with_chain("D", chain({1, 2, 3})), 100).ok());
  CHECK(h.request_as(with_chain("X", chain({50, 51})), 100).ok());  // D saved
  std::this_thread::sleep_for(1100ms);                             // updatedAt: 1 s resolution
  CHECK(h.request_as(with_chain("Y", chain({60, 61})), 100).ok());  // X saved, a second later
  std::this_thread::sleep_for(1100ms);
  h.fake->clear_calls();
  CHECK(h.request_as(with_chain("N", chain({1, 2, 9})), 100).ok());  // Y saved; D seeds N
  CHECK(h.fake->calls() == calls{save_call(h.file("Y", 'a')), restore_call(h.file("D", 'a'))});
  h.fake->clear_calls();
  CHECK(h.request_as(with_chain("Z", chain({70, 71})), 100).ok());  // N saved: one must go
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
  h.turn("A", 100);
  kvp::testing::run_for(h.ioc, 300ms);
  CHECK(h.fake->calls() == calls{erase_call(), save_call(h.file("A", 'a')), erase_call(),
                                 save_call(kvp::core::snapshot_filename(old, 'b')),
                                 save_call(kvp::core::snapshot_filename(old, 'a'))});
  CHECK(h.owner_of_slot0().empty());  // its KV is gone from the slot: A restores next
  h.fake->clear_calls();
  CHECK(h.request("A", 150).ok());
  CHECK(h.fake->calls() == calls{restore_call(h.file("A", 'a'))});
}

TEST_CASE("disk budget: with persistence off gc forgets nothing, since it cannot overwrite",
          "[proxy][coordinator][retention][disk_budget]") {
  temp_dir tmp;
  const auto old = write_old_session(tmp.path(), "OLD", 100'000);  // 200'000 on disk
  harness h(tmp.path(), disk_budget_options(150'000));
  h.fake->slot_actions_disabled = true;
  h.start_quiet();
  REQUIRE_FALSE(h.persistence_on());
  const auto report = h.run(h.coord->admin().gc());
  CHECK(report.evicted == 0);
  CHECK(report.remaining_bytes == 200'000u);
  CHECK(h.fake->calls().empty());
  CHECK(std::filesystem::exists(tmp.path() + "/sessions/" + old + ".json"));
}

}  // namespace coordinator_test
