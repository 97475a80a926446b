// Slot-pool policy of core/slot_pool.hpp in managed multi-slot mode (docs/design.md §14, §6):
// choose_slot's selection order (owned, empty, least recently used clean, least recently used
// dirty after a save), the reserved auxiliary slot, fairness under contention (expressed
// through choose_slot and the free list a lease queue would pass), and epoch changes.
// Driven the way proxy/control/coordinator drives it: choose_slot over the free slots, then
// prepare/on_*/start_inference/end_inference on the chosen slot. Fake clock, no I/O.
#include "core/slot_pool.hpp"

#include <catch2/catch.hpp>

#include "core/request_rewrite.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/core_strings.hpp"

namespace slot_pool_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(24);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

runtime_info pool_runtime(int slots) {
  runtime_info rt;
  rt.model_path = "/models/qwen2.5-7b-instruct-q4_k_m.gguf";
  rt.build_info = "b6123-80fb11a";
  rt.n_ctx = 8192;
  rt.total_slots = slots;
  rt.media_marker = "<__media_1__>";
  return rt;
}

slot_pool_options pool_options(bool reserve_aux = false) {
  slot_pool_options o;
  o.instance_key = "pool-instance";
  o.runtime_key = "pool-runtime";
  o.idle_checkpoint = 0ms;  // timers are not the point here
  o.reserve_aux_slot = reserve_aux;
  return o;
}

std::vector<int> ids(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

slot_pool make_pool(int slots, bool reserve_aux = false) {
  slot_pool c(pool_options(reserve_aux));
  c.table().set_ids(ids(slots));
  c.set_runtime(pool_runtime(slots));
  return c;
}

request_identity session(std::string id) { return request_identity{std::move(id), "", {}, ""}; }
request_identity aux(std::string purpose = "session-title", std::string id = "") {
  return request_identity{std::move(id), std::move(purpose), {}, ""};
}

result<slot_saved> saved(std::uint64_t tokens) { return slot_saved{tokens, 24 + tokens * 1024, 2.5}; }
result<slot_restored> restored(std::uint64_t tokens) {
  return slot_restored{tokens, 24 + tokens * 1024, 1.5};
}
result<slot_erased> erased() { return slot_erased{0}; }

// What one request made the coordinator do, as the proxy would have carried it out.
struct outcome {
  int slot = -1;
  prepare_kind kind = prepare_kind::none;
  std::vector<std::string> calls;  // "save:<slot>:<owner>", "restore:<slot>", "erase:<slot>"
  std::optional<save_step> save;   // the save step the plan carried
};

std::string save_call(const save_step& s) { return "save:" + std::to_string(s.slot) + ":" + s.hash; }

// Runs every planned step successfully (saves report `tokens`).
outcome run_on(slot_pool& c, const request_identity& who, int slot, steady_time now,
               std::uint64_t tokens = 500) {
  outcome o;
  o.slot = slot;
  auto plan = c.plans().prepare(who, slot, now, wall);
  REQUIRE_FALSE(plan.fail);
  CHECK(plan.slot == slot);
  for (const auto& m : plan.manifest_writes) c.outcomes().store_manifest(m);
  if (plan.save) {
    o.save = plan.save;
    o.calls.push_back(save_call(*plan.save));
    auto d = c.outcomes().on_save(*plan.save, saved(tokens), now, wall);
    REQUIRE(d.ok());
    c.outcomes().store_manifest(d.value());
  }
  bool erase = plan.erase;
  if (plan.restore) {
    CHECK(plan.restore->slot == slot);
    o.calls.push_back("restore:" + std::to_string(slot));
    auto d =
        c.outcomes().on_restore(*plan.restore, restored(plan.restore->expected_tokens), now, wall);
    REQUIRE(d.restored);
    erase = erase || d.need_erase;
  }
  if (erase) {
    o.calls.push_back("erase:" + std::to_string(slot));
    REQUIRE(c.outcomes().on_erase(slot, erased(), now));
  }
  o.kind = c.outcomes().start_inference(who, slot);
  CHECK_FALSE(c.outcomes().end_inference(slot, true, now));
  return o;
}

// choose_slot over `free`, then the request on that slot. REQUIRES a slot to be chosen.
outcome request(slot_pool& c, const request_identity& who, steady_time now,
                std::vector<int> free = {}) {
  if (free.empty()) free = c.table().ids();
  auto slot = c.choose_slot(who, free);
  REQUIRE(slot);
  return run_on(c, who, *slot, now);
}

// Saves the owner of `slot` (makes it clean).
void clean(slot_pool& c, int slot, steady_time now) {
  auto s = c.plans().checkpoint_slot(slot, now);
  REQUIRE(s);
  auto d = c.outcomes().on_save(*s, saved(500), now, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
  REQUIRE_FALSE(c.records().dirty(c.table().owner(slot)));
}

std::vector<int> without(std::vector<int> v, int x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
  return v;
}

}  // namespace

TEST_CASE("the pool is every slot the server has, and the aux slot is the highest one",
          "[core][slot_pool]") {
  CHECK(make_pool(3).table().ids() == ids(3));
  CHECK(make_pool(3).table().aux_slot() == -1);
  CHECK(make_pool(3, true).table().aux_slot() == 2);
  // One slot cannot be split: no reservation, or sessions would have nowhere to go.
  CHECK(make_pool(1, true).table().aux_slot() == -1);
  // set_slots with the same layout keeps ownership; a new layout starts from scratch.
  auto c = make_pool(2);
  auto a = request(c, session("A"), t0);
  c.table().set_ids(ids(2));
  CHECK(c.table().slot_of(c.hash_for("A")) == a.slot);
  c.table().set_ids(ids(3));
  CHECK(c.table().slot_of(c.hash_for("A")) == -1);
  CHECK(c.table().ids() == ids(3));
}

TEST_CASE("selection: a session returns to the slot it owns even when others are free",
          "[core][slot_pool]") {
  auto c = make_pool(3);
  auto a = request(c, session("A"), t0);
  auto b = request(c, session("B"), t0 + 1s);
  CHECK(a.slot != b.slot);
  CHECK(a.calls == std::vector<std::string>{"erase:" + std::to_string(a.slot)});
  CHECK(b.calls == std::vector<std::string>{"erase:" + std::to_string(b.slot)});
  // Slot 2 is empty and A's slot is the least recently used: neither attracts A away.
  for (int i = 0; i < 3; ++i) {
    CHECK(c.choose_slot(session("A"), c.table().ids()) == a.slot);
    auto again = request(c, session("A"), t0 + 2s + i * 1s);
    CHECK(again.slot == a.slot);
    CHECK(again.kind == prepare_kind::resident);
    CHECK(again.calls.empty());
  }
  CHECK(c.choose_slot(session("B"), c.table().ids()) == b.slot);
  // The owned slot wins even when it is the only dirty one and an empty one is listed first.
  CHECK(c.choose_slot(session("B"), {2, 1, 0}) == b.slot);
}

TEST_CASE("selection: a busy owned slot means wait, even when other slots are free",
          "[core][slot_pool]") {
  auto c = make_pool(3);
  auto a = request(c, session("A"), t0);
  // A's slot is leased (a request of A is streaming): A's next request must queue behind it,
  // not start a second copy of the conversation on another slot.
  CHECK_FALSE(c.choose_slot(session("A"), without(c.table().ids(), a.slot)));
  CHECK_FALSE(c.choose_slot(session("A"), {}));
  // Other sessions are not held up by it.
  auto other = c.choose_slot(session("B"), without(c.table().ids(), a.slot));
  REQUIRE(other);
  CHECK(*other != a.slot);
}

TEST_CASE("selection: empty slots first, lowest id first among equals", "[core][slot_pool]") {
  auto c = make_pool(3);
  auto a = request(c, session("A"), t0);
  CHECK(a.slot == 0);
  clean(c, a.slot, t0 + 1s);  // A is clean now: still an owned slot, ranked after empty ones
  auto b = request(c, session("B"), t0 + 2s);
  CHECK(b.slot == 1);
  auto x = c.choose_slot(session("C"), c.table().ids());
  CHECK(x == 2);
  // Not listed as free: the next best (the clean LRU slot, A's) is taken instead.
  CHECK(c.choose_slot(session("C"), {0, 1}) == 0);
  // Auxiliary calls without a reserved slot follow the same order.
  CHECK(c.choose_slot(aux(), c.table().ids()) == 2);
  CHECK(c.choose_slot(aux("compaction", "A"), c.table().ids()) == 2);
}

TEST_CASE("selection: the least recently used clean slot goes before any dirty one",
          "[core][slot_pool]") {
  auto c = make_pool(3);
  auto a = request(c, session("A"), t0);       // slot 0, dirty, least recently used
  auto b = request(c, session("B"), t0 + 1s);  // slot 1
  auto cc = request(c, session("C"), t0 + 2s); // slot 2
  REQUIRE(a.slot == 0);
  REQUIRE(b.slot == 1);
  REQUIRE(cc.slot == 2);
  clean(c, b.slot, t0 + 3s);
  clean(c, cc.slot, t0 + 3s);
  // B (clean, used before C) is evicted without a save, although A's dirty slot is older.
  CHECK(c.choose_slot(session("D"), c.table().ids()) == b.slot);
  auto d = request(c, session("D"), t0 + 4s);
  CHECK(d.slot == b.slot);
  CHECK(d.calls.empty());  // B's clean content is kept for D (docs/design.md §20)
  CHECK(c.table().slot_of(c.hash_for("B")) == -1);
  CHECK(c.table().slot_of(c.hash_for("A")) == 0);
  CHECK(c.records().dirty(c.table().owner(0)));
  // C's next turn is resident and makes it dirty: now every slot is dirty and the least
  // recently used one (A's, untouched since t0) is evicted, with A saved first.
  request(c, session("C"), t0 + 5s);
  for (int s : c.table().ids()) REQUIRE(c.records().dirty(c.table().owner(s)));
  auto e = request(c, session("E"), t0 + 6s);
  CHECK(e.slot == 0);
  REQUIRE(e.save);
  CHECK(e.save->hash == c.hash_for("A"));
}

TEST_CASE("selection: with every slot dirty the least recently used one is evicted, its owner saved first",
          "[core][slot_pool]") {
  auto c = make_pool(3);
  request(c, session("A"), t0);
  request(c, session("B"), t0 + 1s);
  request(c, session("C"), t0 + 2s);
  request(c, session("A"), t0 + 3s);  // A is now the most recent: B is the LRU
  for (int s : c.table().ids()) REQUIRE(c.records().dirty(c.table().owner(s)));
  const int b_slot = c.table().slot_of(c.hash_for("B"));
  CHECK(c.choose_slot(session("D"), c.table().ids()) == b_slot);

  auto plan = c.plans().prepare(session("D"), b_slot, t0 + 4s, wall);
  REQUIRE(plan.save);
  CHECK(plan.save->slot == b_slot);
  CHECK(plan.save->hash == c.hash_for("B"));
  CHECK(plan.save->filename == c.hash_for("B") + ".a.bin");
  CHECK(plan.kept);  // D has no snapshot: it runs on B's content, saved first
  CHECK_FALSE(plan.erase);
  CHECK_FALSE(plan.restore);
  auto d = c.outcomes().on_save(*plan.save, saved(700), t0 + 4s, wall);
  REQUIRE(d.ok());
  c.outcomes().store_manifest(d.value());
  CHECK(c.outcomes().start_inference(session("D"), b_slot) == prepare_kind::cold);
  c.outcomes().end_inference(b_slot, true, t0 + 4s);
  CHECK(c.records().find_manifest(c.hash_for("B"))->tokens == 700);
  // The other owners were not touched.
  CHECK(c.table().slot_of(c.hash_for("A")) >= 0);
  CHECK(c.table().slot_of(c.hash_for("C")) >= 0);
  CHECK(c.records().dirty(c.table().owner(c.table().slot_of(c.hash_for("A")))));

  // B comes back: it takes the LRU dirty slot (C's), saving C and restoring B there.
  auto b2 = request(c, session("B"), t0 + 5s);
  CHECK(b2.slot == c.table().slot_of(c.hash_for("B")));
  REQUIRE(b2.save);
  CHECK(b2.save->hash == c.hash_for("C"));
  CHECK(b2.calls.size() == 2);
  CHECK(b2.calls[1] == "restore:" + std::to_string(b2.slot));
  CHECK(b2.kind == prepare_kind::restored);
}

TEST_CASE("N sessions on N slots rotate without calls; N+1 evict the LRU with one save each",
          "[core][slot_pool]") {
  const int n = GENERATE(2, 3, 4);
  auto c = make_pool(n);
  std::vector<std::string> sessions;
  for (int i = 0; i < n; ++i) sessions.push_back("S" + std::to_string(i));
  auto now = t0;
  // First round: one erase each, every session on its own slot.
  std::map<std::string, int> home;
  for (const auto& s : sessions) {
    auto o = request(c, session(s), now += 1s);
    CHECK(o.calls == std::vector<std::string>{"erase:" + std::to_string(o.slot)});
    home[s] = o.slot;
  }
  // Rounds 2..4: resident, no calls, same slot.
  for (int round = 0; round < 3; ++round)
    for (const auto& s : sessions) {
      auto o = request(c, session(s), now += 1s);
      CHECK(o.kind == prepare_kind::resident);
      CHECK(o.calls.empty());
      CHECK(o.slot == home[s]);
    }
  CHECK(c.stats().saves == 0);
  CHECK(c.stats().switches == 0);

  // One more session: cyclic access over N+1 sessions is LRU's worst case, so from here on
  // every request evicts exactly one owner, the least recently used, and saves it first.
  sessions.insert(sessions.begin(), "S" + std::to_string(n));  // cycle: Sn, S0, S1, ...
  std::map<std::string, steady_time> last_use;
  for (const auto& s : sessions) last_use[s] = t0;  // S0..Sn-1 were used in order above
  for (int round = 0; round < 3; ++round)
    for (const auto& s : sessions) {
      // Who should be evicted: the owner with the oldest use among those holding a slot.
      std::string lru;
      int lru_slot = -1;
      steady_time oldest = steady_time::max();
      for (int slot : c.table().ids()) {
        for (const auto& [name, t] : last_use) {
          if (c.table().owner(slot) == c.hash_for(name) && t < oldest) {
            oldest = t;
            lru = name;
            lru_slot = slot;
          }
        }
      }
      REQUIRE(lru_slot >= 0);
      REQUIRE(c.table().slot_of(c.hash_for(s)) ==
              -1);  // the cycle never finds its session resident
      auto o = request(c, session(s), now += 1s);
      CHECK(o.slot == lru_slot);
      REQUIRE(o.save);
      CHECK(o.save->hash == c.hash_for(lru));
      // One save, then a restore; on its first visit the slot is kept (docs/design.md §20).
      CHECK(o.calls.size() == (o.kind == prepare_kind::restored ? 2u : 1u));
      last_use[s] = now;
    }
  CHECK(c.stats().saves == static_cast<std::uint64_t>(3 * (n + 1)));
}

TEST_CASE("the reserved auxiliary slot: aux calls only there, sessions never",
          "[core][slot_pool][aux]") {
  auto c = make_pool(3, true);
  REQUIRE(c.table().aux_slot() == 2);
  // Sessions fill 0 and 1, then evict among them; slot 2 stays free for aux calls although
  // it is empty and would rank first.
  auto a = request(c, session("A"), t0);
  auto b = request(c, session("B"), t0 + 1s);
  CHECK(a.slot == 0);
  CHECK(b.slot == 1);
  CHECK(c.choose_slot(session("C"), c.table().ids()) == 0);  // LRU dirty, not the empty aux slot
  CHECK_FALSE(c.choose_slot(session("C"), {2}));          // the aux slot alone: wait

  // Aux calls (a purpose, or no session at all) take only slot 2 and plan no calls there:
  // with one credential nothing there can be another tenant's (docs/design.md §20).
  for (const auto& who : {aux("session-title"), aux("compaction", "A"), request_identity{}}) {
    CHECK(c.choose_slot(who, c.table().ids()) == 2);
    CHECK_FALSE(c.choose_slot(who, {0, 1}));  // aux slot busy: wait, never evict a session
    auto o = run_on(c, who, 2, t0 + 2s);
    CHECK(o.kind == prepare_kind::auxiliary);
    CHECK(o.calls.empty());
    CHECK(c.table().owner(2).empty());
  }
  // Every owned slot is untouched: A and B resident, still dirty, same slots.
  CHECK(c.table().slot_of(c.hash_for("A")) == 0);
  CHECK(c.table().slot_of(c.hash_for("B")) == 1);
  CHECK(c.records().dirty(c.table().owner(0)));
  CHECK(c.records().dirty(c.table().owner(1)));
  CHECK(c.stats().saves == 0);
  auto a2 = request(c, session("A"), t0 + 3s);
  CHECK(a2.kind == prepare_kind::resident);
  CHECK(a2.calls.empty());
}

TEST_CASE("without a reservation an aux call evicts like a session and leaves the slot unowned",
          "[core][slot_pool][aux]") {
  auto c = make_pool(2);
  request(c, session("A"), t0);
  request(c, session("B"), t0 + 1s);
  auto o = request(c, aux(), t0 + 2s);
  CHECK(o.slot == 0);  // A's, the LRU dirty slot
  REQUIRE(o.save);
  CHECK(o.save->hash == c.hash_for("A"));
  CHECK(o.calls.size() == 1);  // the save; nothing is restored for an aux call
  CHECK(c.table().owner(0).empty());
  // The emptied slot is the first choice of the next newcomer; A restores there.
  auto a = request(c, session("A"), t0 + 3s);
  CHECK(a.slot == 0);
  CHECK(a.kind == prepare_kind::restored);
  CHECK(a.calls == std::vector<std::string>{"restore:0"});
}

TEST_CASE("fairness under contention: FIFO waiters take the slots that free up",
          "[core][slot_pool][fairness]") {
  // A lease queue grants in FIFO order, offering each waiter the slots not leased. The core
  // must make that fair: a session never takes a second slot, a newcomer takes what is free
  // (the LRU one when several are), and a waiter bound to a busy slot does not block others.
  auto c = make_pool(2);
  auto a = request(c, session("A"), t0);  // slot 0
  auto b = request(c, session("B"), t0 + 1s);  // slot 1
  REQUIRE(a.slot == 0);
  REQUIRE(b.slot == 1);

  // Both slots leased (A and B streaming). Queue: A#2, C, B#2.
  std::vector<int> free;
  CHECK_FALSE(c.choose_slot(session("A"), free));
  CHECK_FALSE(c.choose_slot(session("C"), free));
  CHECK_FALSE(c.choose_slot(session("B"), free));

  // B's stream ends first: slot 1 frees. A#2 cannot use it (A is on 0), C can.
  free = {1};
  CHECK_FALSE(c.choose_slot(session("A"), free));
  CHECK(c.choose_slot(session("C"), free) == 1);
  // ... and B#2, queued behind C, now waits for C (its slot was given away).
  auto cr = run_on(c, session("C"), 1, t0 + 2s);
  REQUIRE(cr.save);
  CHECK(cr.save->hash == c.hash_for("B"));  // B was saved before C took the slot
  free = {};
  CHECK_FALSE(c.choose_slot(session("B"), free));
  // A's stream ends: slot 0 frees. A#2 is resident there; B#2 must not jump ahead onto it.
  free = {0};
  CHECK(c.choose_slot(session("A"), free) == 0);
  auto a2 = run_on(c, session("A"), 0, t0 + 3s);
  CHECK(a2.kind == prepare_kind::resident);
  // Both free again: B restores onto the LRU slot. That is C's (used at t0+2s) as long as A
  // was used more recently, so the most active session keeps its slot.
  free = {0, 1};
  CHECK(c.choose_slot(session("B"), free) == 1);
  auto b2 = run_on(c, session("B"), 1, t0 + 4s);
  CHECK(b2.kind == prepare_kind::restored);
  REQUIRE(b2.save);
  CHECK(b2.save->hash == c.hash_for("C"));
}

TEST_CASE("fairness: a busy session cannot starve a newcomer, and a newcomer cannot steal a busy slot",
          "[core][slot_pool][fairness]") {
  auto c = make_pool(3);
  request(c, session("A"), t0);  // 0
  request(c, session("B"), t0 + 1s);  // 1
  // A hammers its slot: each of its requests ends, then the next starts. Meanwhile C arrives;
  // whichever moment it is offered the free list, it gets the empty slot 2, never A's.
  for (int i = 0; i < 5; ++i) {
    CHECK(c.choose_slot(session("C"), {1, 2}) == 2);
    CHECK(c.choose_slot(session("C"), {2}) == 2);
    request(c, session("A"), t0 + 2s + i * 1s, {0, 1, 2});
  }
  // When only A's slot is free, a newcomer evicts A rather than waiting forever (A's state is
  // saved first); the policy never keeps a slot for a session that is not waiting for it.
  auto x = c.choose_slot(session("C"), {0});
  CHECK(x == 0);
}

TEST_CASE("an epoch change (server restart) clears every slot of the pool", "[core][slot_pool]") {
  auto c = make_pool(3, true);
  request(c, session("A"), t0);
  request(c, session("B"), t0 + 1s);
  clean(c, 0, t0 + 2s);
  clean(c, 1, t0 + 2s);
  c.table().on_epoch_change();
  for (int s : c.table().ids()) {
    CHECK(c.table().owner(s).empty());
    CHECK(c.table().state(s) == slot_state::unknown);
  }
  CHECK(c.table().slot_of(c.hash_for("A")) == -1);
  CHECK(c.table().slot_of(c.hash_for("B")) == -1);
  CHECK_FALSE(c.table().idle_deadline());
  // Nobody is resident: each session restores (on whichever non-aux slot it gets).
  auto a = request(c, session("A"), t0 + 3s);
  CHECK(a.kind == prepare_kind::restored);
  CHECK(a.slot != 2);
  CHECK_FALSE(a.save);
  auto b = request(c, session("B"), t0 + 4s);
  CHECK(b.kind == prepare_kind::restored);
  CHECK(b.slot != a.slot);
  CHECK(b.slot != 2);
  // A new model (set_runtime with another model_path) is an epoch too.
  auto rt = pool_runtime(3);
  rt.model_path = "/models/other.gguf";
  c.set_runtime(rt);
  for (int s : c.table().ids()) CHECK(c.table().owner(s).empty());
}

TEST_CASE("a dirty owner saved on eviction keeps its revision; a clean owner is not saved again",
          "[core][slot_pool]") {
  auto c = make_pool(2);
  request(c, session("A"), t0);
  request(c, session("B"), t0 + 1s);
  clean(c, 0, t0 + 2s);  // A clean at revision 1
  auto d = request(c, session("D"), t0 + 3s);  // evicts A (LRU clean): no save
  CHECK(d.slot == 0);
  CHECK_FALSE(d.save);
  auto e = request(c, session("E"), t0 + 4s);  // evicts B (LRU, dirty): one save
  CHECK(e.slot == 1);
  REQUIRE(e.save);
  CHECK(e.save->hash == c.hash_for("B"));
  CHECK(e.save->revision == 1);
  CHECK(c.records().find_manifest(c.hash_for("A"))->revision == 1);
  CHECK(c.records().find_manifest(c.hash_for("B"))->revision == 1);
}

// docs/design.md §14: "a session's requests stay in order". The session's first request on a slot
// is prepared (its save/restore/erase are in flight) before start_inference makes it the
// owner; during that window a second request of the same session must wait too.
TEST_CASE("a session whose request is being prepared on one slot is not given a second slot",
          "[core][slot_pool]") {
  auto c = make_pool(3);
  auto plan =
      c.plans().prepare(session("A"), 0, t0, wall);  // A#1 holds slot 0, its erase in flight
  REQUIRE(plan.erase);
  // A#2 arrives; the lease queue offers it the free slots 1 and 2.
  CHECK_FALSE(c.choose_slot(session("A"), {1, 2}));
  // Same while the first request restores a snapshot of A (a longer window).
  REQUIRE(c.outcomes().on_erase(0, erased(), t0));
  c.outcomes().start_inference(session("A"), 0);
  c.outcomes().end_inference(0, true, t0);
  auto b = request(c, session("B"), t0 + 1s);
  auto x = request(c, session("X"), t0 + 2s);
  (void)b;
  (void)x;
  request(c, session("Y"), t0 + 3s);  // evicts A (LRU dirty) after saving it
  REQUIRE(c.table().slot_of(c.hash_for("A")) == -1);
  const int target = *c.choose_slot(session("A"), c.table().ids());
  auto p2 = c.plans().prepare(session("A"), target, t0 + 4s, wall);
  REQUIRE(p2.restore);
  CHECK_FALSE(c.choose_slot(session("A"), without(c.table().ids(), target)));
}

// The body rewrite that pins a request to the chosen slot (core/request_rewrite.hpp), as an
// optional: nullopt when it refuses the body.
namespace {
std::optional<std::string> pinned(std::string_view body, int slot) {
  auto r = pin_request_body(body, slot);
  return r ? std::optional<std::string>(r.value()) : std::nullopt;
}
}  // namespace

TEST_CASE("pin_request_body keeps the client's bytes and appends id_slot and cache_prompt",
          "[core][slot_pool][pin]") {
  const std::string body = "{ \"model\" : \"m\",\n  \"messages\": [{\"content\": \"caf\xc3\xa9 \\u00e9\"}],"
                           " \"temperature\": 0.70 }\n  ";
  auto out = pinned(body, 2);
  REQUIRE(out);
  const auto brace = body.rfind('}');
  CHECK(*out == body.substr(0, brace) + ",\"id_slot\":2,\"cache_prompt\":true" + body.substr(brace));
  CHECK(pinned("{}", 0) == std::optional<std::string>("{\"id_slot\":0,\"cache_prompt\":true}"));
  CHECK(pinned(" { } ", 1) == std::optional<std::string>(" { \"id_slot\":1,\"cache_prompt\":true} "));
}

TEST_CASE("pin_request_body overrides a client's id_slot by appending", "[core][slot_pool][pin]") {
  // llama-server's JSON parser keeps the last of duplicate keys: ours come last, and the
  // client's bytes are kept as they were.
  for (const std::string body : {R"({"id_slot":7,"model":"m"})", R"({"model":"m","cache_prompt":true})",
                                 R"({"cache_prompt":false,"id_slot":-1,"model":"m","cache_prompt":1})"}) {
    auto out = pinned(body, 1);
    REQUIRE(out);
    CHECK(*out == body.substr(0, body.size() - 1) + R"(,"id_slot":1,"cache_prompt":true})");
  }
}

TEST_CASE("pin_request_body keeps a client's cache_prompt: false", "[core][slot_pool][pin]") {
  // The last of duplicate keys is the one llama-server reads, so only that one decides.
  for (const std::string body : {R"({"model":"m","cache_prompt":false})",
                                 R"({"cache_prompt":true,"id_slot":-1,"cache_prompt":false})"}) {
    auto out = pinned(body, 2);
    REQUIRE(out);
    CHECK(*out == body.substr(0, body.size() - 1) + R"(,"id_slot":2})");
  }
}

TEST_CASE("pin_request_body leaves what is not a JSON object alone", "[core][slot_pool][pin]") {
  for (const char* body : {"[1,2]", "\"s\"", "", "   ", "{\"a\":", "{\"a\":1} {\"b\":2}", "null"})
    CHECK_FALSE(pinned(body, 0));
  CHECK(request_model(R"({"model":"qwen-7b","messages":[]})") == "qwen-7b");
  CHECK(request_model(R"({"model":7})").empty());
  CHECK(request_model("not json").empty());
  // Duplicate keys: the last wins, as in llama-server's parser.
  CHECK(request_model(R"({"model":"a","messages":[],"model":"b"})") == "b");
  CHECK(request_model(R"({"model":"a","model":null})").empty());
}

TEST_CASE("pin_request_body and request_model refuse a body nested deeper than json_max_depth",
          "[core][slot_pool][pin]") {
  // 300 KB of '[' inside an object: RapidJSON's recursive parse used to overflow the stack.
  const std::string deep = R"({"model":"x","a":)" + std::string(300'000, '[');
  auto r = pin_request_body(deep, 0);
  REQUIRE_FALSE(r);
  CHECK(r.err().message == "JSON nested deeper than 128 levels");
  CHECK(request_model(deep).empty());
  // At the limit (the object is level 1): still pinned and routed.
  const std::string at_limit = R"({"model":"x","a":)" + std::string(127, '[') + std::string(127, ']') + "}";
  CHECK(pinned(at_limit, 3) == at_limit.substr(0, at_limit.size() - 1) + R"(,"id_slot":3,"cache_prompt":true})");
  CHECK(request_model(at_limit) == "x");
}

namespace {

// A request on `slot` whose plan's save comes back empty (n_saved 0: llama-server refused the
// request before it, or cleared the slot): nothing of the previous owner is kept.
void request_saving_nothing(slot_pool& c, const request_identity& who, int slot) {
  auto plan = c.plans().prepare(who, slot, t0, wall);
  REQUIRE_FALSE(plan.fail);
  if (plan.save) CHECK_FALSE(c.outcomes().on_save(*plan.save, saved(0), t0, wall).ok());
  if (plan.erase) REQUIRE(c.outcomes().on_erase(slot, erased(), t0));
  c.outcomes().start_inference(who, slot);
  CHECK_FALSE(c.outcomes().end_inference(slot, true, t0));
}

std::set<std::string> known_sessions(const slot_pool& c) {
  std::set<std::string> out;
  for (const auto& v : c.listing().sessions()) out.insert(v.hash);
  return out;
}

}  // namespace

// docs/design.md §12: records without a snapshot are bounded, least recently used first.
TEST_CASE("records without a snapshot beyond the bound: the least recently used one goes",
          "[core][slot_pool][records]") {
  auto o = pool_options();
  o.max_records_without_snapshot = 3;
  slot_pool c(o);
  c.set_runtime(pool_runtime(1));
  // A's turns are saved when S0 takes the slot: a snapshot, retention's to forget, not this.
  run_on(c, session("A"), 0, t0);
  run_on(c, session("S0"), 0, t0);
  REQUIRE(c.records().find_manifest(c.hash_for("A")));
  for (const char* s : {"S1", "S2", "S3", "S4", "S5"}) request_saving_nothing(c, session(s), 0);
  CHECK(known_sessions(c) ==
        std::set<std::string>{c.hash_for("A"), c.hash_for("S3"), c.hash_for("S4"),
                              c.hash_for("S5")});
  std::set<std::string> forgotten;
  for (const auto& h : c.records().take_forgotten()) forgotten.insert(h);
  CHECK(forgotten == std::set<std::string>{c.hash_for("S0"), c.hash_for("S1"), c.hash_for("S2")});
  CHECK(c.records().take_forgotten().empty());

  // S4 and then S3 are used again: S5 is now the least recently used, and goes for S6.
  request_saving_nothing(c, session("S4"), 0);
  request_saving_nothing(c, session("S3"), 0);
  request_saving_nothing(c, session("S6"), 0);
  CHECK(known_sessions(c) ==
        std::set<std::string>{c.hash_for("A"), c.hash_for("S3"), c.hash_for("S4"),
                              c.hash_for("S6")});
  CHECK(c.records().take_forgotten() == std::vector<std::string>{c.hash_for("S5")});
}

TEST_CASE("a record a slot holds or a request is prepared for is never forgotten",
          "[core][slot_pool][records]") {
  auto o = pool_options();
  o.max_records_without_snapshot = 1;
  slot_pool c(o);
  c.table().set_ids(ids(3));
  c.set_runtime(pool_runtime(3));
  request(c, session("A"), t0);
  request(c, session("B"), t0);
  request(c, session("C"), t0);
  // Three owners over a bound of one: each holds its slot.
  CHECK(known_sessions(c) ==
        std::set<std::string>{c.hash_for("A"), c.hash_for("B"), c.hash_for("C")});
  // D is prepared on A's slot: A (still the owner, saved first) and D both stay.
  const auto slot = c.choose_slot(session("D"), c.table().ids());
  REQUIRE(slot);
  auto plan = c.plans().prepare(session("D"), *slot, t0, wall);
  CHECK(c.records().take_forgotten().empty());
  CHECK(known_sessions(c).size() == 4);
  REQUIRE(plan.save);
  CHECK_FALSE(
      c.outcomes().on_save(*plan.save, saved(0), t0, wall).ok());  // an empty save: no snapshot
  c.outcomes().start_inference(session("D"), *slot);
  CHECK_FALSE(c.outcomes().end_inference(*slot, true, t0));
  // The next new session finds the departed owner idle, without a snapshot: it goes.
  const auto e_slot = c.choose_slot(session("E"), c.table().ids());
  REQUIRE(e_slot);
  auto e_plan = c.plans().prepare(session("E"), *e_slot, t0, wall);
  (void)e_plan;
  CHECK(c.records().take_forgotten() == std::vector<std::string>{c.hash_for("A")});
  CHECK(known_sessions(c) == std::set<std::string>{c.hash_for("B"), c.hash_for("C"),
                                                   c.hash_for("D"), c.hash_for("E")});
  c.outcomes().abort_prepare(*e_slot);
}

}  // namespace slot_pool_test
