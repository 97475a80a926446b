// Tests for core/pool_state.hpp: the parts made from the options, the save of a slot's owner,
// and the seeding and keeping rules under the verdict.
#include "core/pool_state.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/identity.hpp"
#include "tests/support/core_strings.hpp"
#include "tests/support/pool_state.hpp"

namespace pool_state_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

request_identity who(std::string id, std::vector<chain_link> chain) {
  return request_identity{std::move(id), "", std::move(chain), "key-A"};
}

chain_link link(std::uint8_t b) {
  chain_link l{};
  l[0] = b;
  return l;
}

}  // namespace

TEST_CASE("the parts come from the options", "[core][pool_state]") {
  slot_pool_options o;
  o.slot_id = 4;
  o.reserve_aux_slot = true;
  o.seed_within_credential = true;
  o.save_on_switch = false;
  o.max_records_without_snapshot = 1;
  pool_state st(o);
  CHECK(st.table.ids() == std::vector<int>{4});
  CHECK_FALSE(st.enabled);
  CHECK(st.disabled_reason == errc::backend_unavailable);  // not probed yet
  CHECK(st.tenants.door().scope == door_scope::credential);
  CHECK_FALSE(st.checkpoints.saves_on_switch());
  CHECK(st.keys.key("A").empty());  // no runtime yet
  st.table.set_ids({0, 1});
  CHECK(st.table.aux_slot() == 1);
}

TEST_CASE("a save of the owner writes the generation its manifest does not point at",
          "[core][pool_state]") {
  auto st = kvp::testing::enabled_pool_state();
  auto& slot = *st.table.find(0);
  slot.owner = "A";
  slot.state = slot_state::dirty;
  st.records.get("A").dirty_rev = 4;
  auto first = st.save_of(slot);
  CHECK(first.slot == 0);
  CHECK(first.hash == "A");
  CHECK(first.generation == 'a');
  CHECK(first.filename == snapshot_filename("A", 'a'));
  CHECK(first.revision == 4);
  CHECK(slot.state == slot_state::saving);
  manifest m;
  m.session_hash = "A";
  m.generation = 'a';
  st.records.store_manifest(m);
  CHECK(st.save_of(slot).generation == 'b');
}

TEST_CASE("seeding and keeping follow the sharing switches, restores and the verdict",
          "[core][pool_state]") {
  auto st = kvp::testing::enabled_pool_state();
  manifest donor;
  donor.session_hash = "donor";
  donor.runtime_fingerprint = st.fingerprint;
  donor.chain = {link(1), link(2)};
  st.records.add_manifest(donor);
  const auto asks = who("B", {link(1), link(2)});
  CHECK(st.keeps_content());
  CHECK(st.seeds().best_seed(asks, "B", 0));
  st.compatibility = "experimental";
  CHECK_FALSE(st.keeps_content());
  CHECK_FALSE(st.seeds().best_seed(asks, "B", 0));
  st.compatibility = "supported";
  st.opts.restore_enabled = false;
  CHECK_FALSE(st.seeds().best_seed(asks, "B", 0));
  st.opts.restore_enabled = true;
  st.opts.seed_across_sessions = false;
  CHECK_FALSE(st.seeds().best_seed(asks, "B", 0));
}

}  // namespace pool_state_test
