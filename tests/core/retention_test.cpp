// Tests for core/retention.hpp: which sessions a budget forgets, in which order, and that a
// session in use (owning or being prepared on a slot) is never chosen.
#include "core/retention.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace retention_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

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
      {"c", false, now - 10, 0, false, ""}, {"a", false, now - 30, 0, false, ""},
      {"b", false, now - 20, 0, false, ""}, {"d", false, now - 5, 0, false, ""}};
  auto p = plan_retention(all, retention_limits{0, 2, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"a", "b"});
  CHECK(p.evict[0].why == "sessions");
  CHECK(p.remaining_sessions == 2);
}

TEST_CASE("invalid snapshots go before older valid ones; equal times order by hash", "[retention]") {
  std::vector<retention_entry> all = {
      {"y", false, now - 50, 0, false, ""}, {"x", false, now - 50, 0, false, ""},
      {"new-but-invalid", true, now - 1, 0, false, ""}};
  auto p = plan_retention(all, retention_limits{0, 1, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"new-but-invalid", "x"});
}

TEST_CASE("a session in use is never forgotten, even when the budget stays exceeded", "[retention]") {
  std::vector<retention_entry> all = {
      {"resident", false, now - 100, 0, true, ""}, {"pending", false, now - 90, 0, true, ""},
      {"clean", false, now - 10, 0, false, ""}};
  auto p = plan_retention(all, retention_limits{0, 1, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"clean"});
  CHECK(p.remaining_sessions == 2);
}

TEST_CASE("bytes and age limits; no limit set forgets nothing", "[retention]") {
  std::vector<retention_entry> all = {
      {"old", false, now - 9 * 86400, 10, false, ""}, {"mid", false, now - 100, 30, false, ""},
      {"young", false, now - 10, 40, false, ""}};
  CHECK(plan_retention(all, retention_limits{}, now).evict.empty());
  auto by_age = plan_retention(all, retention_limits{0, 0, 7, 0}, now);
  REQUIRE(hashes_of(by_age) == std::vector<std::string>{"old"});
  CHECK(by_age.evict[0].why == "age");
  auto by_bytes = plan_retention(all, retention_limits{50, 0, 0, 0}, now);
  CHECK(hashes_of(by_bytes) == std::vector<std::string>{"old", "mid"});
  CHECK(by_bytes.remaining_bytes == 40);
  CHECK(by_bytes.evict[1].bytes == 30);
}

// Per-credential fairness (docs/design.md §12): a tenant that churns sessions evicts its own.
namespace {

retention_entry of(const std::string& credential, const std::string& hash, std::int64_t age_s,
                   std::uint64_t bytes = 0, bool invalid = false, bool in_use = false) {
  return {hash, invalid, now - age_s, bytes, in_use, credential};
}

}  // namespace

TEST_CASE("the session budget takes from the credential holding the most sessions", "[retention]") {
  // A's two sessions are the oldest; B made five newer ones. A global LRU would forget A's.
  std::vector<retention_entry> all = {of("A", "a1", 900), of("A", "a2", 800)};
  for (int i = 0; i < 5; ++i) all.push_back(of("B", "b" + std::to_string(i), 100 - i));
  auto p = plan_retention(all, retention_limits{0, 5, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"b0", "b1"});
  CHECK(p.evict[0].why == "sessions");
  CHECK(p.remaining_sessions == 5);
}

TEST_CASE("equal counts: the credential whose candidate is older loses one", "[retention]") {
  std::vector<retention_entry> all = {of("A", "a1", 50), of("A", "a2", 40), of("B", "b1", 60),
                                      of("B", "b2", 10), of("C", "c1", 5)};
  // A and B hold two each: B's b1 is older than A's a1; then A holds the most.
  auto p = plan_retention(all, retention_limits{0, 3, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"b1", "a1"});
}

TEST_CASE("fairness: invalid snapshots still go first, sessions in use stay", "[retention]") {
  std::vector<retention_entry> all = {of("A", "a-invalid", 1, 0, true), of("A", "a1", 500),
                                      of("B", "b-resident", 900, 0, false, true),
                                      of("B", "b1", 100), of("B", "b2", 50)};
  auto p = plan_retention(all, retention_limits{0, 2, 0, 0}, now);
  // B holds three (one resident): after A's invalid one, B loses its two evictable ones.
  CHECK(hashes_of(p) == std::vector<std::string>{"a-invalid", "b1", "b2"});
  CHECK(p.remaining_sessions == 2);
}

TEST_CASE("a credential whose sessions are all in use leaves the budget to the next", "[retention]") {
  std::vector<retention_entry> all = {of("B", "b1", 10, 0, false, true),
                                      of("B", "b2", 20, 0, false, true),
                                      of("B", "b3", 30, 0, false, true), of("A", "a1", 5),
                                      of("A", "a2", 1)};
  auto p = plan_retention(all, retention_limits{0, 4, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"a1"});
}

TEST_CASE("the byte budget takes from the credential holding the most bytes", "[retention]") {
  std::vector<retention_entry> all = {of("A", "a1", 900, 100), of("B", "b1", 100, 60),
                                      of("B", "b2", 90, 60), of("B", "b3", 80, 60)};
  auto p = plan_retention(all, retention_limits{250, 0, 0, 0}, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"b1"});
  CHECK(p.evict[0].why == "bytes");
  CHECK(p.remaining_bytes == 220);
}

TEST_CASE("maxSessionsPerCredential: a credential above its cap loses its own oldest",
          "[retention]") {
  std::vector<retention_entry> all = {of("A", "a1", 900), of("A", "a2", 800),
                                      of("B", "b-invalid", 1, 0, true),
                                      of("B", "b-resident", 700, 0, false, true),
                                      of("B", "b1", 300), of("B", "b2", 200), of("B", "b3", 100)};
  retention_limits caps;
  caps.max_sessions_per_credential = 2;
  auto p = plan_retention(all, caps, now);
  // B's invalid one first, then its least recently saved; its resident session counts.
  CHECK(hashes_of(p) == std::vector<std::string>{"b-invalid", "b1", "b2"});
  CHECK(p.evict[0].why == "credential");
  CHECK(p.remaining_sessions == 4);
}

TEST_CASE("maxBytesPerCredential: a credential above its bytes loses its own oldest",
          "[retention]") {
  // A holds 300 bytes, B 500 of which 200 are in use; a cap of 250 each: A loses its oldest
  // (a1) and is then within; B loses b1 and b2, its resident session counting but staying.
  std::vector<retention_entry> all = {of("A", "a1", 900, 100), of("A", "a2", 800, 200),
                                      of("B", "b-resident", 950, 200, false, true),
                                      of("B", "b1", 300, 150), of("B", "b2", 200, 100),
                                      of("B", "b3", 100, 50)};
  retention_limits caps;
  caps.max_bytes_per_credential = 250;
  auto p = plan_retention(all, caps, now);
  CHECK(hashes_of(p) == std::vector<std::string>{"a1", "b1", "b2"});
  for (const auto& e : p.evict) CHECK(e.why == "credential");
  CHECK(p.remaining_bytes == 200 + 200 + 50);

  SECTION("what is in use stays, though it alone is over the cap") {
    caps.max_bytes_per_credential = 150;
    auto q = plan_retention(all, caps, now);
    CHECK(hashes_of(q) == std::vector<std::string>{"a1", "a2", "b1", "b2", "b3"});
    CHECK(q.remaining_bytes == 200);
  }
  SECTION("the caps leave the other credential alone, the total budget then ranks the rest") {
    caps.max_bytes_per_credential = 500;  // B at 500 is within; A at 300 too
    caps.max_total_bytes = 700;           // 800 held: the one holding the most bytes pays
    auto q = plan_retention(all, caps, now);
    CHECK(hashes_of(q) == std::vector<std::string>{"b1"});
    CHECK(q.evict[0].why == "bytes");
  }
}

// The disk budget's room (docs/design.md §12, "Disk budget"): each credential's own.
namespace {

// A snapshot of `file` bytes, saved twice: both generations on disk.
retention_entry saved_twice(const std::string& credential, const std::string& hash,
                            std::int64_t age_s, std::uint64_t file, bool in_use = false) {
  retention_entry e = of(credential, hash, age_s, 2 * file, false, in_use);
  e.last_file_bytes = file;
  return e;
}

}  // namespace

TEST_CASE("a share keeps room for its own credential's next save, never another's",
          "[retention]") {
  // A just saved a 400-byte snapshot (800 with both generations); B holds 3 x 50-byte ones.
  // A cap of 1000 each: A's share keeps 400 for A (A's older a1 goes), B's keeps 50 for B.
  std::vector<retention_entry> all = {saved_twice("A", "a1", 900, 100),
                                      saved_twice("A", "a-saved", 0, 400, true),
                                      saved_twice("B", "b1", 300, 50),
                                      saved_twice("B", "b2", 200, 50),
                                      saved_twice("B", "b3", 100, 50)};
  retention_limits caps;
  caps.max_bytes_per_credential = 1000;
  auto p = plan_retention(all, caps, now, {true, "A"});
  CHECK(hashes_of(p) == std::vector<std::string>{"a1"});
  CHECK(p.evict[0].why == "credential");

  SECTION("B's share: 300 held, room for 50 of its own: a cap of 349 takes one") {
    caps.max_bytes_per_credential = 349;
    CHECK(hashes_of(plan_retention(all, caps, now, {true, "A"})) ==
          std::vector<std::string>{"a1", "b1"});
  }
  SECTION("without room, the same cap keeps B whole and keeps a1 beside A's save") {
    caps.max_bytes_per_credential = 1000;
    CHECK(plan_retention(all, caps, now).evict.empty());
  }
}

TEST_CASE("the whole budget keeps room for the saver's largest snapshot, while it is kept",
          "[retention]") {
  // 1100 bytes held: A's two 400-byte files and B's 50-byte ones, under a budget of 1400.
  std::vector<retention_entry> all = {saved_twice("A", "a1", 900, 400),
                                      saved_twice("B", "b1", 300, 50),
                                      saved_twice("B", "b2", 200, 50, true),
                                      saved_twice("B", "b3", 100, 50)};
  const retention_limits budget{1400, 0, 0, 0};
  // B saves: room for 50 more, 1350 left for what stays: nothing goes.
  CHECK(plan_retention(all, budget, now, {true, "B"}).evict.empty());
  // A saves: room for 400, 1000 left: A, holding the most, loses a1.
  CHECK(hashes_of(plan_retention(all, budget, now, {true, "A"})) ==
        std::vector<std::string>{"a1"});
  // A's large snapshot gone (purged or evicted), A's room is its largest kept one: 420
  // bytes held fit 500 less 60 (not less 400).
  all.front() = saved_twice("A", "a2", 10, 60);
  CHECK(plan_retention(all, retention_limits{500, 0, 0, 0}, now, {true, "A"}).evict.empty());
  // gc names no saver: the whole budget as it is.
  all.front() = saved_twice("A", "a1", 900, 400);
  CHECK(plan_retention(all, budget, now, {true, std::nullopt}).evict.empty());
}

TEST_CASE("one credential: fairness is the plain least recently updated order", "[retention]") {
  std::vector<retention_entry> all = {of("", "c", 10), of("", "a", 30), of("", "b", 20),
                                      of("", "d", 5)};
  CHECK(hashes_of(plan_retention(all, retention_limits{0, 2, 0, 0}, now)) ==
        hashes_of(plan_retention(all, retention_limits{0, 2, 0, 3}, now)));
  CHECK(hashes_of(plan_retention(all, retention_limits{0, 2, 0, 0}, now)) ==
        std::vector<std::string>{"a", "b"});
}

TEST_CASE("parse_utc reads the manifests' timestamps", "[retention]") {
  CHECK(kvp::core::parse_utc("1970-01-02T00:00:01Z") == 86401);
  CHECK(kvp::core::parse_utc("garbage") == 0);
}

}  // namespace retention_test
