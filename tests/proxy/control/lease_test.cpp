// Tests for proxy/control/lease.hpp: a request's way onto a coordinator's strand (docs/design.md
// §5) as proxy/data/server.cpp takes it, driven with FakeBackend on an io_context. Each
// outcome of acquire, the one-trip prepare of a pooled request, the wait and what ends it
// (a grant, the queue timeout, the client hanging up), and a lease that is dropped
// unfinished releasing its slot.
#include "proxy/control/lease.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/coordinator_on_fake.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace lease_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::prepare_kind;
using kvp::core::request_identity;
using kvp::net::awaitable;
using kvp::proxy::acquisition;
using kvp::proxy::coordinator;
using kvp::proxy::coordinator_options;
using kvp::proxy::lease;
using kvp::testing::FakeBackend;
using kvp::testing::temp_dir;
using outcome = acquisition::outcome;

coordinator_options lease_options() {
  coordinator_options o;
  o.pool.instance_key = "test";
  o.pool.runtime_key = "qwen7b-f16kv";
  o.pool.idle_checkpoint = 0ms;
  o.epoch_probe_interval = 0ms;  // no background probe loop
  o.max_waiting = 1;
  return o;
}

using kvp::testing::client_leaves_after;
using kvp::testing::client_stays;

struct harness : kvp::testing::coordinator_on_fake {
  int waits = 0;  // on_wait calls: requests that gave their pooled connection back

  explicit harness(const std::string& dir, coordinator_options o = lease_options())
      : coordinator_on_fake(dir, std::move(o)) {}

  template <class T>
  T run(awaitable<T> a) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), std::move(a));
  }
  template <class T>
  std::future<T> spawn(awaitable<T> a) {
    return kvp::testing::spawn(ioc.get_executor(), std::move(a));
  }
  void start() {
    run(coord->on_strand(coord->start()));
    fake->clear_calls();
  }
  awaitable<acquisition> acquire(std::string session, bool pooled,
                                 std::chrono::milliseconds timeout = 5s,
                                 std::function<awaitable<bool>()> gone = client_stays()) {
    const request_identity who{std::move(session), "", {}, ""};
    return kvp::proxy::acquire(*coord, who, false, pooled, timeout, std::move(gone),
                               [this] { ++waits; });
  }
  // Whether a new request for `session` is granted at once: nothing holds the slot.
  bool slot_free(const std::string& session) {
    auto a = run(acquire(session, false));
    const bool free = a.what == outcome::granted && waits == 0;
    if (a.held) run(a.held.release());
    return free;
  }
};

// Prepares and finishes `l` for `session` with `tokens` of inference.
awaitable<prepare_kind> serve(lease& l, std::string session, FakeBackend* fake,
                              std::uint64_t tokens) {
  const request_identity who{std::move(session), "", {}, ""};
  auto pr = co_await l.prepare(who, false);
  if (!pr) co_return prepare_kind::none;
  fake->run_inference(tokens);
  co_await l.finish(true);
  co_return pr.value();
}

}  // namespace

TEST_CASE("acquire on a free slot grants; prepare and finish leave it free", "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto a = h.run(h.acquire("A", false));
  REQUIRE(a.what == outcome::granted);
  REQUIRE(a.held);
  CHECK(h.waits == 0);
  CHECK(h.run(serve(a.held, "A", h.fake, 100)) == prepare_kind::cold);
  CHECK_FALSE(a.held);  // finish gave it back
  CHECK(h.slot_free("B"));
}

TEST_CASE("a pooled request granted at once is prepared in the same trip", "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto a = h.run(h.acquire("A", true));
  REQUIRE(a.what == outcome::granted);
  REQUIRE(a.held);
  const auto first = h.run(a.held.prepare({"A", "", {}, ""}, false));
  REQUIRE(first.ok());
  CHECK(first.value() == prepare_kind::cold);
  h.fake->run_inference(100);
  h.run(a.held.finish(true));
  // B's pooled request: the switch's save of A ran before acquire returned; prepare answers
  // what that trip decided and calls nothing more.
  h.fake->clear_calls();
  auto b = h.run(h.acquire("B", true));
  REQUIRE(b.what == outcome::granted);
  const auto saved_in_admission = h.fake->slot_calls();
  REQUIRE(saved_in_admission.size() == 1);
  CHECK(saved_in_admission[0].action == "save");
  const auto pb = h.run(b.held.prepare({"B", "", {}, ""}, false));
  REQUIRE(pb.ok());
  CHECK(pb.value() == prepare_kind::cold);
  CHECK(h.fake->slot_calls().size() == 1);
  h.fake->run_inference(100);
  h.run(b.held.finish(true));
  // B's next request finds its slot resident, again in one trip, with no management call.
  h.fake->clear_calls();
  auto again = h.run(h.acquire("B", true));
  REQUIRE(again.what == outcome::granted);
  CHECK(h.run(again.held.prepare({"B", "", {}, ""}, false)).value() == prepare_kind::resident);
  CHECK(h.fake->slot_calls().empty());
  h.run(again.held.finish(true));
}

TEST_CASE("a request without a pooled connection is prepared only when it asks",
          "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto a = h.run(h.acquire("A", true));
  CHECK(h.run(serve(a.held, "A", h.fake, 100)) == prepare_kind::cold);
  h.fake->clear_calls();
  auto b = h.run(h.acquire("B", false));
  REQUIRE(b.what == outcome::granted);
  CHECK(h.fake->slot_calls().empty());  // nothing decided before its connection is known
  const auto pb = h.run(b.held.prepare({"B", "", {}, ""}, false));
  REQUIRE(pb.ok());
  CHECK(h.fake->slot_calls().size() == 1);
  h.run(b.held.finish(true));
}

TEST_CASE("a lease dropped unfinished releases its slot", "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  {
    auto a = h.run(h.acquire("A", false));
    REQUIRE(a.held);
  }  // an early return: no finish, no release
  kvp::testing::poll(h.ioc);
  CHECK(h.slot_free("B"));
  // A moved-over lease is released once, by its last holder.
  auto b = h.run(h.acquire("B", false));
  lease moved = std::move(b.held);
  CHECK_FALSE(b.held);
  moved = lease();
  kvp::testing::poll(h.ioc);
  CHECK(h.slot_free("C"));
}

TEST_CASE("a queued request waits, gives its connection back, and is granted in order",
          "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto first = h.run(h.acquire("A", false));
  REQUIRE(first.what == outcome::granted);
  auto second = h.spawn(h.acquire("B", true));
  kvp::testing::drive_until(h.ioc, [&] { return h.waits == 1; });
  CHECK_FALSE(kvp::testing::is_ready(second));
  CHECK(h.run(serve(first.held, "A", h.fake, 100)) == prepare_kind::cold);
  kvp::testing::drive_until(h.ioc, [&] { return kvp::testing::is_ready(second); });
  auto b = second.get();
  REQUIRE(b.what == outcome::granted);  // a queued request prepares on its own trip
  CHECK(h.run(serve(b.held, "B", h.fake, 50)) == prepare_kind::cold);
}

TEST_CASE("the wait ends on the queue timeout or the client leaving, the lease released",
          "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto first = h.run(h.acquire("A", false));
  REQUIRE(first.held);
  auto timed_out = h.run(h.acquire("B", false, 30ms));
  CHECK(timed_out.what == outcome::timed_out);
  CHECK_FALSE(timed_out.held);
  auto gone = h.run(h.acquire("C", false, 5s, client_leaves_after(30ms)));
  CHECK(gone.what == outcome::client_gone);
  CHECK_FALSE(gone.held);
  // Neither left a place in the queue behind: A's slot goes to the next request at once.
  h.run(first.held.release());
  h.waits = 0;
  CHECK(h.slot_free("D"));
}

TEST_CASE("a full queue rejects and the connection goes back", "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());  // max_waiting 1
  h.start();
  auto first = h.run(h.acquire("A", false));
  REQUIRE(first.held);
  auto waiting = h.spawn(h.acquire("B", false));
  kvp::testing::drive_until(h.ioc, [&] { return h.waits == 1; });
  auto rejected = h.run(h.acquire("C", true));
  CHECK(rejected.what == outcome::rejected);
  CHECK_FALSE(rejected.held);
  CHECK(h.waits == 2);
  h.run(first.held.release());
  kvp::testing::drive_until(h.ioc, [&] { return kvp::testing::is_ready(waiting); });
  auto b = waiting.get();
  CHECK(b.what == outcome::granted);
  h.run(b.held.release());
}

TEST_CASE("a failed strict prepare empties the lease and frees the slot", "[proxy][lease]") {
  temp_dir tmp;
  auto o = lease_options();
  o.pool.seed_across_sessions = false;  // a cold start erases
  o.pool.strict = true;
  harness h(tmp.path(), o);
  h.start();
  auto a = h.run(h.acquire("A", false));
  REQUIRE(a.held);
  h.fake->fail_next_erase(kvp::testing::failure::http(500));
  auto pr = h.run(a.held.prepare({"A", "", {}, ""}, false));
  CHECK_FALSE(pr.ok());
  CHECK_FALSE(a.held);  // the coordinator released it
  CHECK(h.slot_free("B"));
}

TEST_CASE("without persistence a request passes through, holding no slot", "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.fake->set_unreachable(true);
  h.start();
  h.fake->set_unreachable(true);
  auto a = h.run(h.acquire("A", true));
  REQUIRE(a.what == outcome::pass_through);
  REQUIRE(a.held);
  CHECK(h.fake->slot_calls().empty());
  h.run(a.held.finish(true));
}

TEST_CASE("one runtime change at a time: a second one is refused while the first holds",
          "[proxy][lease]") {
  temp_dir tmp;
  harness h(tmp.path());
  h.start();
  auto first = h.run(kvp::proxy::begin_runtime_change(*h.coord, 5s, client_stays()));
  REQUIRE(first.what == outcome::granted);
  auto second = h.run(kvp::proxy::begin_runtime_change(*h.coord, 5s, client_stays()));
  CHECK(second.what == outcome::runtime_change_pending);
  CHECK_FALSE(second.held);
  h.run(kvp::proxy::end_runtime_change(std::move(first.held), true));
  auto third = h.run(kvp::proxy::begin_runtime_change(*h.coord, 5s, client_stays()));
  CHECK(third.what == outcome::granted);
  h.run(kvp::proxy::end_runtime_change(std::move(third.held), false));
}

}  // namespace lease_test
