// Tests for core/slot_table.hpp (docs/design.md §14, §20): the layout, the queries, and what
// each whole-server event leaves in every slot.
#include "core/slot_table.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "tests/support/core_strings.hpp"

namespace slot_table_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(1);
const slot_content a_content{content_whose::known, "key-A", "session-A"};

// Three slots, 0 owned by A (dirty, with an idle deadline), 1 being prepared for B, 2 empty.
slot_table three_slots() {
  slot_table t(0, false);
  t.set_ids({0, 1, 2});
  auto& s0 = *t.find(0);
  s0.owner = "A";
  s0.state = slot_state::dirty;
  s0.idle_deadline = t0 + 30s;
  s0.content = a_content;
  t.find(1)->pending_hash = "B";
  t.find(2)->content = {content_whose::empty, {}, {}};
  return t;
}

}  // namespace

TEST_CASE("one slot at first; a new layout starts from scratch, the same one keeps its slots",
          "[core][slot_table]") {
  slot_table t(3, false);
  CHECK(t.ids() == std::vector<int>{3});
  t.find(3)->owner = "A";
  t.set_ids({3});
  CHECK(t.owner(3) == "A");
  t.set_ids({});  // ignored
  CHECK(t.ids() == std::vector<int>{3});
  t.set_ids({0, 1});
  CHECK(t.ids() == std::vector<int>{0, 1});
  CHECK(t.owner(0).empty());
  CHECK(t.state(0) == slot_state::unknown);
  CHECK(t.content(0).whose == content_whose::unknown);
}

TEST_CASE("the reserved auxiliary slot is the highest of several, and sessions contend for the rest",
          "[core][slot_table]") {
  slot_table reserved(0, true);
  CHECK(reserved.aux_slot() == -1);  // one slot cannot be split
  CHECK(reserved.session_slots() == 1);
  reserved.set_ids({0, 1, 2});
  CHECK(reserved.aux_slot() == 2);
  CHECK(reserved.session_slots() == 2);
  slot_table plain(0, false);
  plain.set_ids({0, 1, 2});
  CHECK(plain.aux_slot() == -1);
  CHECK(plain.session_slots() == 3);
}

TEST_CASE("queries: owners, sessions in use, the earliest idle deadline, ids outside the table",
          "[core][slot_table]") {
  auto t = three_slots();
  CHECK(t.slot_of("A") == 0);
  CHECK(t.slot_of("B") == -1);  // being prepared is not owning
  CHECK(t.slot_of("") == -1);
  CHECK(t.in_use("A"));
  CHECK(t.in_use("B"));
  CHECK_FALSE(t.in_use("C"));
  CHECK(t.idle_deadline() == t0 + 30s);
  t.find(2)->idle_deadline = t0 + 10s;
  CHECK(t.idle_deadline() == t0 + 10s);
  CHECK(t.find(7) == nullptr);
  CHECK(t.owner(7).empty());
  CHECK(t.state(7) == slot_state::unknown);
  CHECK(t.content(7).whose == content_whose::unknown);
}

TEST_CASE("touch makes a slot the most recently used", "[core][slot_table]") {
  auto t = three_slots();
  t.touch(*t.find(2));
  t.touch(*t.find(0));
  CHECK(t.find(0)->last_used > t.find(2)->last_used);
  CHECK(t.find(2)->last_used > t.find(1)->last_used);
}

TEST_CASE("forgetting a slot: unknown and unowned; seen emptied: empty; the others untouched",
          "[core][slot_table]") {
  auto t = three_slots();
  t.forget_slot(0);
  CHECK(t.owner(0).empty());
  CHECK(t.state(0) == slot_state::unknown);
  CHECK_FALSE(t.find(0)->idle_deadline);
  CHECK(t.content(0).whose == content_whose::unknown);
  CHECK_FALSE(t.content(0).credential_known);
  auto u = three_slots();
  u.forget_emptied_slot(0);
  CHECK(u.owner(0).empty());
  CHECK(u.content(0).whose == content_whose::empty);
  CHECK(u.find(1)->pending_hash == "B");
  u.forget_slot(9);  // outside the table: nothing
}

TEST_CASE("a new epoch empties every slot; a stall keeps each content's credential, unknown",
          "[core][slot_table]") {
  auto epoch = three_slots();
  epoch.on_epoch_change();
  for (const auto& s : epoch.slots()) {
    CHECK(s.owner.empty());
    CHECK(s.state == slot_state::unknown);
    CHECK_FALSE(s.idle_deadline);
    CHECK(s.content.whose == content_whose::empty);
  }
  auto stall = three_slots();
  stall.find(1)->content = {content_whose::unknown, "key-B", {}, true};
  stall.on_unreachable();
  CHECK(stall.owner(0).empty());
  CHECK(stall.state(0) == slot_state::unknown);
  CHECK_FALSE(stall.find(0)->idle_deadline);
  // Known content: unknown now, still key-A's.
  CHECK(stall.content(0).whose == content_whose::unknown);
  CHECK(stall.content(0).credential == "key-A");
  CHECK(stall.content(0).credential_known);
  CHECK(stall.content(0).session.empty());
  // Unknown content stays as it was; an empty slot becomes unknown of nobody known.
  CHECK(stall.content(1).credential == "key-B");
  CHECK(stall.content(1).credential_known);
  CHECK(stall.content(2).whose == content_whose::unknown);
  CHECK_FALSE(stall.content(2).credential_known);
}

TEST_CASE("an erased server holds nothing, owners untouched; new adapters leave contents unknown",
          "[core][slot_table]") {
  auto erased = three_slots();
  erased.on_server_erased();
  CHECK(erased.owner(0) == "A");
  CHECK(erased.state(0) == slot_state::dirty);
  for (int id : erased.ids()) CHECK(erased.content(id).whose == content_whose::empty);
  auto adapters = three_slots();
  adapters.clear_contents();
  for (int id : adapters.ids()) CHECK(adapters.content(id).whose == content_whose::unknown);
  CHECK(adapters.owner(0) == "A");
}

TEST_CASE("slot states and preparations have names", "[core][slot_table]") {
  CHECK(to_string(slot_state::dirty) == "dirty");
  CHECK(to_string(slot_state::restoring) == "restoring");
  CHECK(to_string(prepare_kind::cold_fallback) == "cold_fallback");
  CHECK(to_string(prepare_kind::auxiliary) == "auxiliary");
}

}  // namespace slot_table_test
