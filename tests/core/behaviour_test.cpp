// Tests for core/behaviour.hpp: comparing probe signatures (docs/design.md §4).
#include "core/behaviour.hpp"

#include <catch2/catch.hpp>

namespace behaviour_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

behaviour_signature sig(std::vector<std::int64_t> ids) { return behaviour_signature{std::move(ids)}; }

}  // namespace

TEST_CASE("signatures of one model match despite reordered tail ranks", "[core][behaviour]") {
  const auto a = sig({876, 20881, 10599, 19006, 30564, 10210, 18655, 25625});
  CHECK(same_behaviour(a, a));
  // The two last ranks swapped and one replaced: a near tie that flipped.
  CHECK(same_behaviour(a, sig({876, 20881, 10599, 19006, 30564, 10210, 25625, 1})));
  // The top two swapped, but most ranks are shared.
  CHECK(same_behaviour(a, sig({20881, 876, 10599, 19006, 30564, 10210, 18655, 25625})));
}

TEST_CASE("signatures of another model do not match", "[core][behaviour]") {
  const auto a = sig({876, 20881, 10599, 19006, 30564, 10210, 18655, 25625});
  CHECK_FALSE(same_behaviour(a, sig({1, 2, 3, 4, 5, 6, 7, 8})));
  // Three shared ranks of eight and another top token: not the same model.
  CHECK_FALSE(same_behaviour(a, sig({5, 20881, 10599, 19006, 6, 7, 8, 9})));
  CHECK_FALSE(same_behaviour(a, sig({})));
  CHECK_FALSE(same_behaviour(sig({}), sig({})));
}

TEST_CASE("a probe belongs to the first known class it matches", "[core][behaviour]") {
  const auto a = sig({10, 11, 12, 13, 14, 15, 16, 17});
  const auto b = sig({20, 21, 22, 23, 24, 25, 26, 27});
  const std::vector<behaviour_signature> known{a, b};
  CHECK(match_behaviour(known, sig({20, 21, 22, 23, 24, 25, 26, 99})) == behaviour_class_id(b));
  CHECK(match_behaviour(known, a) == behaviour_class_id(a));
  CHECK_FALSE(match_behaviour(known, sig({30, 31, 32, 33, 34, 35, 36, 37})));
  CHECK_FALSE(match_behaviour({}, a));
  CHECK(behaviour_class_id(a).size() == 16);
  CHECK(behaviour_class_id(a) != behaviour_class_id(b));
}

}  // namespace behaviour_test
