// Tests for core/seed_choice.hpp (docs/design.md §3, §20): which ready snapshot seeds a
// request, and how many links the slot's current content offers it.
#include "core/seed_choice.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace seed_choice_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

const slot_door instance_door{door_scope::instance, false};

chain_link link(std::uint8_t b) {
  chain_link l{};
  l[0] = b;
  return l;
}

std::vector<chain_link> chain(std::initializer_list<std::uint8_t> bytes) {
  std::vector<chain_link> c;
  for (auto b : bytes) c.push_back(link(b));
  return c;
}

manifest snapshot(std::string hash, std::vector<chain_link> links, std::uint64_t bytes,
                  std::string credential = "key-A", std::string fingerprint = "fp") {
  manifest m;
  m.session_hash = std::move(hash);
  m.chain = std::move(links);
  m.bytes = bytes;
  m.credential = std::move(credential);
  m.runtime_fingerprint = std::move(fingerprint);
  return m;
}

request_identity request(std::vector<chain_link> links, std::string credential = "key-A") {
  return request_identity{"R", "", std::move(links), std::move(credential)};
}

seed_rules rules(bool allowed = true, bool within_credential = false,
                 slot_door door = instance_door) {
  return {allowed, within_credential, "fp", door};
}

}  // namespace

TEST_CASE("the best seed shares the most links, and reads the fewest bytes among equals",
          "[core][seed_choice]") {
  session_records r(10);
  r.add_manifest(snapshot("whole", chain({1, 2, 3, 9}), 9000));
  r.add_manifest(snapshot("prefix", chain({1, 2, 3}), 3000));
  r.add_manifest(snapshot("short", chain({1, 2}), 100));
  const seed_choice seeds(r, rules());
  auto best = seeds.best_seed(request(chain({1, 2, 3, 4})), "R", 0);
  REQUIRE(best);
  CHECK(best->hash == "prefix");
  CHECK(best->common == 3);
  // Not better than what the caller already has: none.
  CHECK_FALSE(seeds.best_seed(request(chain({1, 2, 3, 4})), "R", 3));
  // Never the session's own snapshot.
  CHECK(seeds.best_seed(request(chain({1, 2, 3, 4})), "prefix", 0)->hash == "whole");
  // A request without a chain, or seeding not allowed: none.
  CHECK_FALSE(seeds.best_seed(request({}), "R", 0));
  CHECK_FALSE(seed_choice(r, rules(false)).best_seed(request(chain({1, 2, 3})), "R", 0));
}

TEST_CASE("no seed from another runtime, an invalid snapshot, or another credential when scoped",
          "[core][seed_choice]") {
  session_records r(10);
  r.add_manifest(snapshot("other-runtime", chain({1, 2}), 10, "key-A", "another fp"));
  auto invalid = snapshot("invalid", chain({1, 2}), 10);
  invalid.state = snapshot_state::invalid;
  r.add_manifest(invalid);
  r.add_manifest(snapshot("key-B", chain({1, 2}), 10, "key-B"));
  CHECK_FALSE(seed_choice(r, rules(true, true)).best_seed(request(chain({1, 2})), "R", 0));
  CHECK(seed_choice(r, rules(true, false)).best_seed(request(chain({1, 2})), "R", 0)->hash ==
        "key-B");
  // A request whose first link is an empty preamble needs two links in common.
  auto two = request(chain({1, 5}));
  two.min_shared_links = 2;
  CHECK_FALSE(seed_choice(r, rules()).best_seed(two, "R", 0));
}

TEST_CASE("the slot's content counts when it is another session's, ready or dirty, within scope",
          "[core][seed_choice]") {
  session_records r(10);
  r.touch("owner", "o", [](const std::string&) { return false; }).chain = chain({1, 2, 3});
  table_slot s;
  s.owner = "owner";
  s.pending_hash = "R";
  s.state = slot_state::dirty;
  s.content = {content_whose::known, "key-A", "owner"};
  const auto who = request(chain({1, 2, 7}));
  CHECK(seed_choice(r, rules()).shared_with_slot(s, who) == 2);
  s.state = slot_state::ready;
  CHECK(seed_choice(r, rules()).shared_with_slot(s, who) == 2);
  // Outside the scope (another credential's content under `credential`): nothing.
  CHECK(seed_choice(r, rules(true, true, {door_scope::credential, true}))
            .shared_with_slot(s, request(chain({1, 2}), "key-B")) == 0);
  CHECK(seed_choice(r, rules(true, true, {door_scope::credential, true})).shared_with_slot(s, who) ==
        2);
  // Seeding off, a state whose content is unsure, the session's own slot, an auxiliary call.
  CHECK(seed_choice(r, rules(false)).shared_with_slot(s, who) == 0);
  auto saving = s;
  saving.state = slot_state::saving;
  CHECK(seed_choice(r, rules()).shared_with_slot(saving, who) == 0);
  auto own = s;
  own.pending_hash = "owner";
  CHECK(seed_choice(r, rules()).shared_with_slot(own, who) == 0);
  auto aux = s;
  aux.pending_aux = true;
  CHECK(seed_choice(r, rules()).shared_with_slot(aux, who) == 0);
  // Fewer links than the request needs.
  auto needs_three = who;
  needs_three.min_shared_links = 3;
  CHECK(seed_choice(r, rules()).shared_with_slot(s, needs_three) == 0);
}

TEST_CASE("model kinds judged experimental or broken reuse no foreign prefix", "[core][seed_choice]") {
  CHECK(reuses_foreign_prefix("supported"));
  CHECK(reuses_foreign_prefix("unknown"));
  CHECK_FALSE(reuses_foreign_prefix("experimental"));
  CHECK_FALSE(reuses_foreign_prefix("broken"));
}

}  // namespace seed_choice_test
