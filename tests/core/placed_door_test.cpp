// Tests for core/placed_door.hpp (docs/design.md §14, §20, §24): the erases before a request
// llama-server places itself, and what it leaves afterwards, with persistence on or off.
#include "core/placed_door.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "tests/support/core_strings.hpp"
#include "tests/support/pool_state.hpp"

namespace placed_door_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;
using kvp::testing::add_ready_snapshot;
using kvp::testing::enabled_pool_state;

// Three slots under `sharing: credential`: 0 holds key-A's session, 1 key-B's auxiliary
// output, 2 is empty.
pool_state three_tenants() {
  slot_pool_options o;
  o.seed_within_credential = true;
  auto st = enabled_pool_state(3, o);
  st.table.find(0)->owner = "A";
  st.table.find(0)->state = slot_state::ready;
  st.table.find(0)->content = {content_whose::known, "key-A", "A"};
  st.table.find(1)->content = {content_whose::known, "key-B", ""};
  st.table.find(2)->content = {content_whose::empty, {}, {}};
  st.tenants.note_credential("key-A");
  st.tenants.note_credential("key-B");
  return st;
}

request_identity messages_of(std::string credential) {
  return request_identity{"S", "", {}, std::move(credential)};
}

const auto now = std::chrono::steady_clock::now();

}  // namespace

TEST_CASE("before an unpinnable request: every slot it may not run on, as an auxiliary call",
          "[core][placed_door]") {
  auto st = three_tenants();
  const auto erases = placed_door(st).erases_before_unpinned(messages_of("key-A"));
  REQUIRE(erases.size() == 1);
  CHECK(erases[0].slot == 1);
  CHECK(erases[0].required);
  // Under `instance` nothing is another tenant's.
  auto shared = enabled_pool_state(3);
  shared.table.find(1)->content = {content_whose::known, "key-B", ""};
  CHECK(placed_door(shared).erases_before_unpinned(messages_of("key-A")).empty());
}

TEST_CASE("the slot an unpinnable request ran on holds its credential's content of no session",
          "[core][placed_door]") {
  auto st = three_tenants();
  placed_door(st).note_unpinned_ran(0, "key-C");
  CHECK(st.table.owner(0).empty());
  CHECK(st.table.state(0) == slot_state::unknown);
  CHECK(st.table.content(0).whose == content_whose::known);
  CHECK(st.table.content(0).credential == "key-C");
  CHECK(st.table.content(0).session.empty());
  CHECK(st.table.content(1).credential == "key-B");  // the others untouched
}

TEST_CASE("a pass-through: nobody owns a slot, and what may be anyone's but its credential's is unknown",
          "[core][placed_door]") {
  auto st = three_tenants();
  placed_door(st).note_pass_through("key-A");
  CHECK(st.table.owner(0).empty());
  for (int id : {0, 2}) {
    CHECK(st.table.state(id) == slot_state::unknown);
    CHECK(st.table.content(id).whose == content_whose::unknown);
    CHECK(st.table.content(id).credential == "key-A");
    CHECK(st.table.content(id).credential_known);
  }
  // key-B's content, with key-A's requests possibly on top: nobody's known.
  CHECK(st.table.content(1).whose == content_whose::unknown);
  CHECK_FALSE(st.table.content(1).credential_known);
}

TEST_CASE("placed: a session restores only when no slot holds it and a snapshot is ready",
          "[core][placed_door]") {
  auto st = enabled_pool_state(3);
  const request_identity a{"A", "", {}, ""};
  const auto hash = st.keys.key(a);
  placed_door door(st);
  CHECK_FALSE(door.wants_restore(a, hash));  // no snapshot
  add_ready_snapshot(st, a);
  CHECK(door.wants_restore(a, hash));
  st.table.find(1)->owner = hash;  // resident
  CHECK_FALSE(door.wants_restore(a, hash));
  CHECK_FALSE(door.wants_restore(a, ""));
}

TEST_CASE("placed: a new session restores a seed, unless a slot holds as long a prefix",
          "[core][placed_door]") {
  slot_pool_options o;
  o.seed_across_sessions = true;
  auto st = enabled_pool_state(3, o);
  auto link = [](std::uint8_t b) {
    chain_link l{};
    l[0] = b;
    return l;
  };
  const request_identity donor{"D", "", {link(1), link(2), link(3)}, ""};
  const request_identity fresh{"N", "", {link(1), link(2), link(4)}, ""};
  const manifest m = add_ready_snapshot(st, donor);
  const auto hash = st.keys.key(fresh);
  CHECK(placed_door(st).wants_restore(fresh, hash));
  // The donor's content is still in slot 0: llama-server places the new session there.
  auto& s0 = *st.table.find(0);
  s0.owner = m.session_hash;
  s0.state = slot_state::ready;
  s0.content = {content_whose::known, "", m.session_hash};
  st.records.get(m.session_hash).chain = donor.chain;
  CHECK_FALSE(placed_door(st).wants_restore(fresh, hash));
}

TEST_CASE("placed: a request continues its session when one chain starts the other; in managed "
          "mode only such a request is adopted",
          "[core][placed_door]") {
  auto st = enabled_pool_state(3);
  auto link = [](std::uint8_t b) {
    chain_link l{};
    l[0] = b;
    return l;
  };
  const request_identity first{"A", "", {link(1), link(2)}, ""};
  const request_identity next{"A", "", {link(1), link(2), link(3)}, ""};
  const request_identity side{"A", "", {link(7)}, ""};
  const auto hash = st.keys.key(first);
  placed_door door(st);
  CHECK_FALSE(door.continues(first, hash));  // nothing ran yet
  (void)door.note_session_ran(first, placed_run{.ran = 0}, false, now);
  CHECK(door.continues(next, hash));
  CHECK(door.continues(first, hash));
  CHECK_FALSE(door.continues(side, hash));
  // Managed mode: the side conversation is nobody's; mode auto: the session follows it.
  (void)door.note_session_ran(side, placed_run{.held = 0, .ran = 1}, false, now, false);
  CHECK(st.table.owner(0) == hash);
  CHECK(st.table.owner(1).empty());
  (void)door.note_session_ran(side, placed_run{.held = 0, .ran = 1}, false, now, true);
  CHECK(st.table.owner(1) == hash);
  CHECK(st.table.owner(0).empty());
}

TEST_CASE("placed: the restore goes to an empty slot, else the least recently used one",
          "[core][placed_door]") {
  auto st = enabled_pool_state(3);
  for (int id : {0, 1, 2}) {
    st.table.find(id)->content = {content_whose::known, "", "x"};
    st.table.touch(*st.table.find(id));
  }
  CHECK(placed_door(st).restore_target() == 0);  // least recently used
  st.table.find(2)->content = {content_whose::empty, {}, {}};
  CHECK(placed_door(st).restore_target() == 2);  // empty first
}

TEST_CASE("placed: the slot that ran a session's request is that session's, dirty; its old slot "
          "and a restored slot it did not run on are forgotten",
          "[core][placed_door]") {
  auto st = enabled_pool_state(3);
  const request_identity a{"A", "", {}, "key-A"};
  const auto hash = st.keys.key(a);
  placed_door door(st);
  // A new session: it ran on slot 1 (llama-server's choice).
  CHECK_FALSE(door.note_session_ran(a, placed_run{.ran = 1}, false, now));
  CHECK(st.table.owner(1) == hash);
  CHECK(st.table.state(1) == slot_state::dirty);
  CHECK(st.table.content(1).session == hash);
  CHECK(st.table.content(1).credential == "key-A");
  CHECK(st.records.get(hash).dirty_rev == 1);
  // Again, but llama-server put it on slot 2 this time: slot 1 is no longer A's.
  CHECK_FALSE(door.note_session_ran(a, placed_run{.held = 1, .ran = 2}, false, now));
  CHECK(st.table.owner(2) == hash);
  CHECK(st.table.owner(1).empty());
  CHECK(st.table.slot_of(hash) == 2);
  CHECK(st.records.get(hash).dirty_rev == 2);
  // An auxiliary call or a request of no session leaves nobody's content.
  const request_identity title{"A", "session-title", {}, "key-A"};
  const request_identity nobody{"", "", {}, "key-A"};
  CHECK_FALSE(door.note_session_ran(title, placed_run{.ran = 0}, false, now));
  CHECK_FALSE(door.note_session_ran(nobody, placed_run{.ran = 0}, false, now));
  CHECK(st.table.owner(0).empty());
  // Unknown where it ran: nobody is recorded there.
  CHECK_FALSE(door.note_session_ran(a, placed_run{.held = 2, .ran = -1}, false, now));
  CHECK(st.table.owner(2) == hash);
}

TEST_CASE("placed: a session's turn end is checkpointed early as soon as another session took a "
          "turn, whatever the slot count (the next task may clear its slot)",
          "[core][placed_door]") {
  slot_pool_options o;
  o.early_checkpoint = std::chrono::milliseconds(1000);
  auto st = enabled_pool_state(4, o);
  st.checkpoints.set_idle_checkpoint(std::chrono::milliseconds(30'000));
  placed_door door(st);
  const request_identity a{"A", "", {}, ""}, b{"B", "", {}, ""};
  (void)door.note_session_ran(a, placed_run{.ran = 0}, true, now);
  CHECK(*st.table.find(0)->idle_deadline == now + std::chrono::milliseconds(30'000));  // alone
  (void)door.note_session_ran(b, placed_run{.ran = 1}, true, now);
  CHECK(*st.table.find(1)->idle_deadline == now + std::chrono::milliseconds(1000));  // 2 > 1 slot
  (void)door.note_session_ran(b, placed_run{.held = 1, .ran = 1}, false, now);  // a tool step
  CHECK(*st.table.find(1)->idle_deadline == now + std::chrono::milliseconds(30'000));
}

TEST_CASE("placed: an owned slot seen empty forgets its owner; an unowned one stays as it is",
          "[core][placed_door]") {
  auto st = three_tenants();
  placed_door(st).note_emptied(0);
  CHECK(st.table.owner(0).empty());
  CHECK(st.table.content(0).whose == content_whose::empty);
  placed_door(st).note_emptied(1);
  CHECK(st.table.content(1).credential == "key-B");
}

}  // namespace placed_door_test
