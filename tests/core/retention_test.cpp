// Tests for core/retention.hpp: which sessions a budget forgets, in which order, and that a
// session in use (owning or being prepared on a slot) is never chosen.
#include "core/retention.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace {

using kvp::core::plan_retention;
using kvp::core::retention_entry;
using kvp::core::retention_limits;

constexpr std::int64_t now = 1'800'000'000;

std::vector<std::string> hashes_of(const kvp::core::retention_plan& p) {
  std::vector<std::string> out;
  for (const auto& e : p.evict) out.push_back(e.hash);
  return out;
}

}  // namespace

TEST_CASE("the session budget forgets the least recently updated first", "[retention]") {
  std::vector<retention_entry> all = {
      {"c", false, now - 10, 0, false}, {"a", false, now - 30, 0, false},
      {"b", false, now - 20, 0, false}, {"d", false, now - 5, 0, false}};
  auto p = plan_retention(all, retention_limits{0, 2, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"a", "b"});
  CHECK(p.evict[0].why == "sessions");
  CHECK(p.remaining_sessions == 2);
}

TEST_CASE("invalid snapshots go before older valid ones; equal times order by hash", "[retention]") {
  std::vector<retention_entry> all = {
      {"y", false, now - 50, 0, false}, {"x", false, now - 50, 0, false},
      {"new-but-invalid", true, now - 1, 0, false}};
  auto p = plan_retention(all, retention_limits{0, 1, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"new-but-invalid", "x"});
}

TEST_CASE("a session in use is never forgotten, even when the budget stays exceeded", "[retention]") {
  std::vector<retention_entry> all = {
      {"resident", false, now - 100, 0, true}, {"pending", false, now - 90, 0, true},
      {"clean", false, now - 10, 0, false}};
  auto p = plan_retention(all, retention_limits{0, 1, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"clean"});
  CHECK(p.remaining_sessions == 2);
}

TEST_CASE("bytes and age limits; no limit set forgets nothing", "[retention]") {
  std::vector<retention_entry> all = {
      {"old", false, now - 9 * 86400, 10, false}, {"mid", false, now - 100, 30, false},
      {"young", false, now - 10, 40, false}};
  CHECK(plan_retention(all, retention_limits{}, now).evict.empty());
  auto by_age = plan_retention(all, retention_limits{0, 0, 7}, now);
  REQUIRE(hashes_of(by_age) == std::vector<std::string>{"old"});
  CHECK(by_age.evict[0].why == "age");
  auto by_bytes = plan_retention(all, retention_limits{50, 0, 0}, now);
  CHECK(hashes_of(by_bytes) == std::vector<std::string>{"old", "mid"});
  CHECK(by_bytes.remaining_bytes == 40);
  CHECK(by_bytes.evict[1].bytes == 30);
}

TEST_CASE("parse_utc reads the manifests' timestamps", "[retention]") {
  CHECK(kvp::core::parse_utc("1970-01-02T00:00:01Z") == 86401);
  CHECK(kvp::core::parse_utc("garbage") == 0);
}
