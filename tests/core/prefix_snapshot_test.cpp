// Tests for core/prefix_snapshot.hpp (docs/design.md §3, "Prefix snapshots"): which snapshot a
// seed reads, and when a snapshot of the shared prefix alone is worth making.
#include "core/prefix_snapshot.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "core/retention.hpp"
#include "tests/support/chains.hpp"

namespace prefix_snapshot_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;
using kvp::testing::chain;

}  // namespace

TEST_CASE("a seed reads the fewest bytes among the snapshots sharing most links",
          "[core][prefix_snapshot]") {
  // A donor four times the prefix, and the prefix alone: the same links reused, a quarter read.
  auto s = fewest_bytes_seed({{"donor", 1, 4'000'000}, {"prefix", 1, 1'000'000}});
  REQUIRE(s);
  CHECK(s->hash == "prefix");
  // Sharing more links beats being small: more tokens reused.
  s = fewest_bytes_seed({{"prefix", 1, 1'000'000}, {"longer", 3, 9'000'000}});
  REQUIRE(s);
  CHECK(s->hash == "longer");
  // Equal sizes: the first candidate (the one indexed last) stays.
  s = fewest_bytes_seed({{"B", 2, 500}, {"A", 2, 500}});
  REQUIRE(s);
  CHECK(s->hash == "B");
  CHECK_FALSE(fewest_bytes_seed({}));
}

TEST_CASE("a prefix snapshot is worth it when a seed reused under 80% of what it read",
          "[core][prefix_snapshot]") {
  CHECK(worth_prefix_snapshot(7232, 1808));      // the donor, 4x the prefix
  CHECK(worth_prefix_snapshot(1000, 799));
  CHECK_FALSE(worth_prefix_snapshot(1000, 800));
  CHECK_FALSE(worth_prefix_snapshot(1000, 1000));  // a prefix snapshot's own seed
  CHECK_FALSE(worth_prefix_snapshot(0, 0));        // nothing restored: nothing to save
}

TEST_CASE("prefix session ids name the last shared link", "[core][prefix_snapshot]") {
  const auto c = chain({1, 2});
  const auto id = prefix_session_id(c[1]);
  CHECK(id == "prefix:" + to_hex(c[1]));
  CHECK(is_prefix_session(id));
  CHECK_FALSE(is_prefix_session("content:" + to_hex(c[1])));
  CHECK(prefix_session_id(c[0]) != id);
}

TEST_CASE("a wasteful seed asks for its prefix once per credential and link",
          "[core][prefix_snapshot]") {
  prefix_wishes w;
  const auto request = chain({1, 7, 8});  // shares link 0 with a donor of 4 links
  CHECK(w.note_seed("k1", "donor", 4, 7232, 1808, request, 1));
  CHECK_FALSE(w.note_seed("k1", "other-donor", 6, 9000, 1808, request, 1));  // asked already
  CHECK(w.note_seed("k2", "donor2", 4, 7232, 1808, request, 1));  // another credential's own
  REQUIRE(w.pending() == 2);
  auto first = w.take();
  REQUIRE(first);
  CHECK(first->credential == "k1");
  CHECK(first->donor == "donor");
  CHECK(first->donor_tokens == 7232);
  CHECK(first->links == std::vector<chain_link>{request[0]});
  CHECK(w.take()->credential == "k2");
  CHECK_FALSE(w.take());
  // Made (or dropped after a try): still not asked again.
  CHECK_FALSE(w.note_seed("k1", "donor", 4, 7232, 1808, request, 1));
}

TEST_CASE("no wish for a seed that read little more than it reused, or is the prefix",
          "[core][prefix_snapshot]") {
  prefix_wishes w;
  const auto request = chain({1, 2, 9});
  CHECK_FALSE(w.note_seed("k1", "donor", 3, 1000, 900, request, 2));  // 90% reused
  CHECK_FALSE(w.note_seed("k1", "prefix", 2, 1000, 100, request, 2));  // donor is the prefix
  CHECK_FALSE(w.note_seed("k1", "donor", 3, 1000, 100, request, 0));   // nothing shared
  CHECK_FALSE(w.note_seed("k1", "donor", 9, 1000, 100, request, 4));   // beyond the request
  CHECK(w.empty());
  // A prefix snapshot already on disk (its manifest read at startup) is not asked for.
  w.note_made("k1", request[1]);
  CHECK_FALSE(w.note_seed("k1", "donor", 3, 1000, 100, request, 2));
  CHECK(w.note_seed("k1", "donor", 3, 1000, 100, request, 1));
}

TEST_CASE("pending wishes and known keys are bounded", "[core][prefix_snapshot]") {
  prefix_wishes w(2, 3);
  CHECK(w.note_seed("k", "d", 9, 1000, 10, chain({1}), 1));
  CHECK(w.note_seed("k", "d", 9, 1000, 10, chain({2}), 1));
  CHECK_FALSE(w.note_seed("k", "d", 9, 1000, 10, chain({3}), 1));  // two pending at most
  CHECK(w.pending() == 2);
  w.take();
  w.take();
  CHECK(w.note_seed("k", "d", 9, 1000, 10, chain({3}), 1));
  CHECK(w.note_seed("k", "d", 9, 1000, 10, chain({4}), 1));  // forgets chain({1})'s key
  w.take();
  w.take();
  CHECK(w.note_seed("k", "d", 9, 1000, 10, chain({1}), 1));   // may be asked for once more
  CHECK_FALSE(w.note_seed("k", "d", 9, 1000, 10, chain({4}), 1));
}

TEST_CASE("a forgotten donor's wishes go, and may be asked for again", "[core][prefix_snapshot]") {
  prefix_wishes w;
  const auto request = chain({1, 5});
  CHECK(w.note_seed("k1", "gone", 4, 1000, 100, request, 1));
  CHECK(w.note_seed("k1", "kept", 4, 1000, 100, chain({2, 5}), 1));
  w.drop_donor("gone");
  REQUIRE(w.pending() == 1);
  CHECK(w.take()->donor == "kept");
  CHECK(w.note_seed("k1", "another", 4, 1000, 100, request, 1));
}

// Retention keeps a prefix snapshot while it seeds: proxy/control/retention_keeper.cpp ranks
// every snapshot by its last save or restore, and a seed is a restore of the prefix snapshot.
TEST_CASE("retention keeps a prefix snapshot while it seeds", "[core][prefix_snapshot]") {
  constexpr std::int64_t now = 1'800'000'000;
  // Made long ago, restored a minute ago as a seed: newer than both conversations.
  const std::vector<retention_entry> used = {{"prefix", false, now - 60, 1, false, "k"},
                                            {"a", false, now - 600, 4, false, "k"},
                                            {"b", false, now - 300, 4, false, "k"}};
  auto p = plan_retention(used, retention_limits{0, 2, 0, 0}, now);
  REQUIRE(p.evict.size() == 1);
  CHECK(p.evict[0].hash == "a");
  // Not used since it was made, before the conversations were: it goes first.
  const std::vector<retention_entry> unused = {{"prefix", false, now - 900, 1, false, "k"},
                                              {"a", false, now - 600, 4, false, "k"},
                                              {"b", false, now - 300, 4, false, "k"}};
  p = plan_retention(unused, retention_limits{0, 2, 0, 0}, now);
  REQUIRE(p.evict.size() == 1);
  CHECK(p.evict[0].hash == "prefix");
}

}  // namespace prefix_snapshot_test
