// Tests for proxy/control/lease_queue.hpp: each rule of the lease queue on a pool of plain slot
// ids (the first free slot is chosen), with the wakeups recorded instead of posted. No
// coordinator, no backend; the io_context only gives the tickets an executor and never runs.
#include "proxy/control/lease_queue.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lease_queue_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::proxy::lease_queue;
using kvp::proxy::lease_ticket;
using kvp::proxy::slot_chooser;
using ticket = lease_queue::ticket;

struct queue_on_slots {
  kvp::net::io_context ioc;
  std::vector<int> slots;
  bool pins = false;
  std::vector<std::uint64_t> woken;  // ticket ids, in the order they were woken
  lease_queue q;

  explicit queue_on_slots(std::vector<int> ids, std::size_t max_waiting = 8)
      : slots(std::move(ids)), q(max_waiting, chooser(), [this](const ticket& t) {
          woken.push_back(t->id);
        }) {}

  slot_chooser chooser() {
    slot_chooser c;
    c.slot_ids = [this] { return slots; };
    c.choose_slot = [](const kvp::core::request_identity&,
                       const std::vector<int>& free) -> std::optional<int> {
      if (free.empty()) return std::nullopt;
      return free.front();
    };
    c.session_key = [](const kvp::core::request_identity& who) { return who.session_id; };
    c.pins_requests = [this] { return pins; };
    c.places_requests = [] { return false; };
    return c;
  }

  ticket make(const std::string& session, bool exclusive = false) {
    auto t = std::make_shared<lease_ticket>(ioc.get_executor());
    t->who = {session, "", {}, ""};
    t->exclusive = exclusive;
    return t;
  }
  // A ticket that the queue accepted.
  ticket enqueued(const std::string& session, bool exclusive = false) {
    auto t = make(session, exclusive);
    REQUIRE(q.enqueue(t));
    return t;
  }
  void release(const ticket& t) {
    q.release(t);
    q.grant_waiting();
  }
};

}  // namespace

TEST_CASE("lease queue: FIFO on one slot, each waiter woken when granted", "[proxy][lease_queue]") {
  queue_on_slots s({0});
  auto a = s.enqueued("A");
  CHECK(a->granted);
  CHECK(a->slot == 0);
  CHECK(s.woken.empty());  // its own enqueue reports the grant: no wakeup
  auto b = s.enqueued("B");
  auto c = s.enqueued("C");
  auto d = s.enqueued("D");
  CHECK(s.q.waiting() == 3);
  CHECK_FALSE(b->granted);
  s.release(a);
  CHECK(b->granted);
  CHECK_FALSE(c->granted);
  s.release(b);
  s.release(c);
  CHECK(d->granted);
  CHECK(s.woken == std::vector<std::uint64_t>{b->id, c->id, d->id});
  CHECK(a->id < b->id);
  CHECK(b->id < c->id);
  CHECK(s.q.waiting() == 0);
}

TEST_CASE("lease queue: a session's second request waits for its first, others go by",
          "[proxy][lease_queue]") {
  queue_on_slots s({0, 1});
  auto a1 = s.enqueued("A");
  auto a2 = s.enqueued("A");
  CHECK_FALSE(a2->granted);  // slot 1 is free, but A's requests stay in order on one slot
  auto b = s.enqueued("B");
  CHECK(b->granted);  // another session is not held up by A's
  CHECK(b->slot == 1);
  auto a3 = s.enqueued("A");
  s.release(b);
  CHECK_FALSE(a3->granted);  // not before A's second
  s.release(a1);
  CHECK(a2->granted);
  CHECK_FALSE(a3->granted);
  s.release(a2);
  CHECK(a3->granted);
  // Auxiliary requests (a purpose, or no session) are not ordered by session.
  auto aux = s.make("A");
  aux->who.purpose = "session-title";
  REQUIRE(s.q.enqueue(aux));
  CHECK(aux->granted);
}

TEST_CASE("lease queue: nothing overtakes an exclusive waiter", "[proxy][lease_queue]") {
  queue_on_slots s({0, 1});
  auto a = s.enqueued("A");
  auto x = s.enqueued("", true);
  CHECK_FALSE(x->granted);
  auto b = s.enqueued("B");
  CHECK_FALSE(b->granted);  // slot 1 is free, but the exclusive waiter came first
  s.release(a);
  CHECK(x->granted);
  CHECK(x->slot == -1);
  CHECK(s.q.is_leased(0));
  CHECK(s.q.is_leased(1));
  CHECK_FALSE(b->granted);
  s.release(x);
  CHECK(b->granted);
  CHECK(s.woken == std::vector<std::uint64_t>{x->id, b->id});
}

TEST_CASE("lease queue: an exclusive waiter that gives up lets the others go",
          "[proxy][lease_queue]") {
  queue_on_slots s({0, 1});
  auto a = s.enqueued("A");
  auto x = s.enqueued("", true);
  auto b = s.enqueued("B");
  CHECK_FALSE(s.q.settle(x));
  CHECK(b->granted);
  CHECK(s.q.holds(a));
}

TEST_CASE("lease queue: at most max_waiting wait; kvpersist's own work is never refused",
          "[proxy][lease_queue]") {
  queue_on_slots s({0}, 2);
  auto a = s.enqueued("A");
  auto b = s.enqueued("B");
  auto c = s.enqueued("C");
  auto d = s.make("D");
  CHECK_FALSE(s.q.enqueue(d));
  CHECK_FALSE(d->granted);
  CHECK(s.q.waiting() == 2);
  auto own = s.make("", true);
  s.q.enqueue_unbounded(own);
  CHECK(s.q.waiting() == 3);
  s.release(a);
  s.release(b);
  s.release(c);
  CHECK(own->granted);
  CHECK_FALSE(d->granted);  // refused: it took no place in the queue
}

TEST_CASE("lease queue: passing through blocks every grant until the last one ends",
          "[proxy][lease_queue]") {
  queue_on_slots s({0, 1});
  CHECK(s.q.idle());
  auto p1 = s.make("P1"), p2 = s.make("P2");
  s.q.begin_pass_through(p1);
  s.q.begin_pass_through(p2);
  CHECK(s.q.passing_through() == 2);
  auto a = s.enqueued("A");
  CHECK_FALSE(a->granted);
  CHECK_FALSE(s.q.idle());
  CHECK_FALSE(s.q.end_pass_through(p1));
  CHECK_FALSE(s.q.end_pass_through(p1));  // a second end counts once
  CHECK_FALSE(a->granted);
  CHECK(s.q.end_pass_through(p2));
  CHECK(a->granted);
  CHECK(s.woken == std::vector<std::uint64_t>{a->id});
  CHECK(s.q.passing_through() == 0);
  CHECK_FALSE(s.q.end_pass_through(s.make("N")));  // never passed through: ignored
}

TEST_CASE("lease queue: settle after a timeout leaves the queue, never the slot",
          "[proxy][lease_queue]") {
  queue_on_slots s({0});
  auto a = s.enqueued("A");
  CHECK(s.q.settle(a));  // granted: holds
  auto b = s.enqueued("B");
  CHECK_FALSE(s.q.settle(b));
  CHECK(s.q.waiting() == 0);
  CHECK(s.q.holds(a));
  s.release(a);
  CHECK_FALSE(b->granted);
  CHECK(s.woken.empty());
  CHECK(s.q.nothing_leased());
  auto c = s.enqueued("C");
  CHECK(c->granted);
}

TEST_CASE("lease queue: one runtime change pending at a time", "[proxy][lease_queue]") {
  queue_on_slots s({0}, 1);
  auto runtime_change = [&] {
    auto t = s.make("", true);
    t->runtime_change = true;
    return t;
  };
  CHECK(s.q.admit_runtime_change(s.make("A")));  // not a runtime change: always admitted
  auto a = s.enqueued("A");
  auto r1 = runtime_change();
  REQUIRE(s.q.admit_runtime_change(r1));
  REQUIRE(s.q.enqueue(r1));
  CHECK_FALSE(s.q.admit_runtime_change(runtime_change()));
  CHECK_FALSE(s.q.settle(r1));  // it gave up waiting: no longer pending
  auto r2 = runtime_change();
  REQUIRE(s.q.admit_runtime_change(r2));
  auto b = s.enqueued("B");  // fills the queue
  CHECK_FALSE(s.q.enqueue(r2));  // refused by the bound: no longer pending
  auto r3 = runtime_change();
  REQUIRE(s.q.admit_runtime_change(r3));
  REQUIRE(s.q.settle(b) == false);
  REQUIRE(s.q.enqueue(r3));
  s.release(a);
  REQUIRE(r3->granted);
  CHECK_FALSE(s.q.admit_runtime_change(runtime_change()));  // holding: still pending
  s.release(r3);
  CHECK(s.q.admit_runtime_change(runtime_change()));
}

TEST_CASE("lease queue: managed mode pins requests and makes unpinnable ones exclusive",
          "[proxy][lease_queue]") {
  queue_on_slots s({0, 1});
  s.pins = true;
  auto a = s.enqueued("A");
  CHECK(a->pinned);
  auto u = s.make("U");
  u->unpinnable = true;
  REQUIRE(s.q.enqueue(u));
  CHECK(u->exclusive);
  CHECK_FALSE(u->granted);  // it needs every slot
  s.release(a);
  CHECK(u->granted);
  CHECK(u->slot == -1);
}

TEST_CASE("lease queue: the idle checkpoint's hold keeps a slot from the queue",
          "[proxy][lease_queue]") {
  queue_on_slots s({0});
  auto self = s.make("");
  s.q.hold_slot(0, self);
  CHECK(s.q.is_leased(0));
  auto a = s.enqueued("A");
  CHECK_FALSE(a->granted);
  s.release(self);
  CHECK(a->granted);
  CHECK(a->slot == 0);
}

}  // namespace lease_queue_test
