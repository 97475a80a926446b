// Tests for core/chain_index.hpp: finding the snapshot whose chain shares the longest start
// with a request's (docs/design.md §3, "Seeding").
#include "core/chain_index.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tests/support/chains.hpp"

namespace chain_index_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

using kvp::testing::chain;

const auto any = [](const std::string&) { return true; };

}  // namespace

TEST_CASE("the longest common start wins", "[core][chain_index]") {
  chain_index ix;
  ix.put("A", chain({1, 2, 3, 4}));
  ix.put("B", chain({1, 2, 9}));
  ix.put("C", chain({5, 6}));
  auto m = ix.longest(chain({1, 2, 3, 7, 8}), 1, any);
  REQUIRE(m);
  CHECK(m->hash == "A");
  CHECK(m->common == 3);
  m = ix.longest(chain({1, 2, 9, 9}), 1, any);
  REQUIRE(m);
  CHECK(m->hash == "B");
  CHECK(m->common == 3);
  CHECK_FALSE(ix.longest(chain({7}), 1, any));
  CHECK_FALSE(ix.longest(chain({1, 2, 3}), 4, any));  // below the minimum
  CHECK_FALSE(ix.longest({}, 1, any));
}

TEST_CASE("rejected candidates give way to shorter matches", "[core][chain_index]") {
  chain_index ix;
  ix.put("A", chain({1, 2, 3}));
  ix.put("B", chain({1, 2}));
  auto m = ix.longest(chain({1, 2, 3}), 1, [](const std::string& h) { return h != "A"; });
  REQUIRE(m);
  CHECK(m->hash == "B");
  CHECK(m->common == 2);
  // Equals: the one indexed last.
  ix.put("C", chain({1, 2}));
  CHECK(ix.longest(chain({1, 2}), 1, any)->hash == "C");
}

TEST_CASE("all_longest gives the chains ending there first, then a bounded few others",
          "[core][chain_index]") {
  chain_index ix;
  ix.put("prefix", chain({1}));
  for (int s = 0; s < 10; ++s) ix.put("s" + std::to_string(s), chain({1, 100 + s}));
  ix.put("deeper", chain({1, 2, 3}));
  auto all = ix.all_longest(chain({1, 50}), 1, any, 3);
  REQUIRE(all.size() == 4);
  CHECK(all[0].hash == "prefix");  // indexed first, yet not cut by the bound
  CHECK(all[1].hash == "deeper");  // then the others, the one indexed last first
  CHECK(all[2].hash == "s9");
  CHECK(all[3].hash == "s8");
  for (const auto& m : all) CHECK(m.common == 1);
  // Only the longest match counts; rejected ones give way to shorter matches.
  all = ix.all_longest(chain({1, 2, 3, 4}), 1, any);
  REQUIRE(all.size() == 1);
  CHECK(all[0].hash == "deeper");
  CHECK(all[0].common == 3);
  all = ix.all_longest(chain({1, 2}), 1, [](const std::string& h) { return h != "deeper"; });
  CHECK(all.size() == 11);
  CHECK(all[0].hash == "prefix");
  CHECK(ix.all_longest(chain({1, 2}), 3, any).empty());
  // Erased: no longer an ender.
  ix.erase("prefix");
  CHECK(ix.all_longest(chain({1, 50}), 1, any, 1).front().hash == "deeper");
  ix.put("deeper", chain({1}));  // replaced by a shorter chain: now it ends at link 0
  CHECK(ix.all_longest(chain({1, 50}), 1, any, 0).front().hash == "deeper");
}

TEST_CASE("put replaces and erase removes a session's links", "[core][chain_index]") {
  chain_index ix;
  ix.put("A", chain({1, 2, 3}));
  ix.put("A", chain({1, 4}));
  CHECK(ix.longest(chain({1, 2, 3}), 1, any)->common == 1);
  CHECK(ix.longest(chain({1, 4}), 1, any)->common == 2);
  ix.erase("A");
  CHECK_FALSE(ix.longest(chain({1, 4}), 1, any));
  CHECK(ix.sessions() == 0);
  ix.erase("never indexed");
  ix.put("E", {});
  CHECK(ix.sessions() == 0);
}

TEST_CASE("a chain keeps its first max_chain_links links", "[core][chain_index]") {
  std::vector<chain_link> long_chain;
  for (std::size_t i = 0; i < max_chain_links + 50; ++i) {
    chain_link l{};
    l[0] = static_cast<std::uint8_t>(i);
    l[1] = static_cast<std::uint8_t>(i >> 8);
    long_chain.push_back(l);
  }
  chain_index ix;
  ix.put("A", long_chain);
  const auto m = ix.longest(long_chain, 1, any);
  REQUIRE(m);
  CHECK(m->common == max_chain_links);
}

// Not a timed assertion: prints the lookup cost with 10,000 indexed sessions of 40 links
// that all share their first link (one harness's system prompt), for bench/RESULTS.md.
TEST_CASE("lookups among 10,000 snapshots", "[core][chain_index][.cost]") {
  chain_index ix;
  auto make = [](int session, int links) {
    std::vector<chain_link> c;
    for (int i = 0; i < links; ++i) {
      chain_link l{};
      const int owner = i == 0 ? 0 : session;  // link 0 shared by all
      for (int b = 0; b < 4; ++b) l[b] = static_cast<std::uint8_t>(owner >> (8 * b));
      l[4] = static_cast<std::uint8_t>(i);
      l[5] = 1;
      c.push_back(l);
    }
    return c;
  };
  for (int s = 0; s < 10000; ++s) ix.put("session-" + std::to_string(s), make(s, 40));
  const auto probe = make(123456, 60);  // a new session: shares link 0 only
  const int n = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) REQUIRE(ix.longest(probe, 1, any)->common == 1);
  const auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  const auto own = make(777, 41);
  REQUIRE(ix.longest(own, 1, any)->common == 40);
  WARN("chain_index::longest with 10000 sessions: " << us.count() / n << " us per lookup");
  ix.put("prefix", make(0, 1));  // the shared preamble alone
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) REQUIRE(ix.all_longest(probe, 1, any).front().hash == "prefix");
  const auto all_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1);
  WARN("chain_index::all_longest with 10000 sessions: " << all_us.count() / n
                                                        << " us per lookup");
}

}  // namespace chain_index_test
