// Tests for core/event_history.hpp: the bounded feed behind GET /kv/events, and that
// core::log records into it independently of the log level.
#include "core/event_history.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "core/log.hpp"

namespace event_history_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

TEST_CASE("event_history keeps the newest entries, numbered in order", "[core][events]") {
  event_history h;
  CHECK(h.since(0).empty());
  CHECK(h.last_seq() == 0);
  for (std::size_t i = 1; i <= event_history::capacity + 5; ++i)
    h.record("kv.e", std::to_string(i));
  auto all = h.since(0);
  REQUIRE(all.size() == event_history::capacity);
  CHECK(all.front().seq == 6);
  CHECK(all.front().json == "6");
  CHECK(all.back().seq == event_history::capacity + 5);
  auto tail = h.since(event_history::capacity + 3);
  REQUIRE(tail.size() == 2);
  CHECK(tail[0].seq == event_history::capacity + 4);
  CHECK(h.since(event_history::capacity + 5).empty());
  CHECK(h.last_seq() == event_history::capacity + 5);
}

TEST_CASE("log() records info and above in the history whatever the level", "[core][events]") {
  set_log_output(nullptr, log_level::error, false);
  auto last = [] {
    auto all = recent_events().since(0);
    return all.empty() ? event_history::entry{} : all.back();
  };
  const auto before = last().seq;
  log(log_level::debug, "kv.test.debug", {{"x", "1"}});
  CHECK(last().seq == before);
  log(log_level::info, "kv.test.saved", {{"session", "0123abcd"}, {"tokens", "42"}});
  const auto e = last();
  CHECK(e.seq == before + 1);
  CHECK(e.event == "kv.test.saved");
  CHECK(e.json.find(R"("event":"kv.test.saved","session":"0123abcd","tokens":"42"})") !=
        std::string::npos);
}

}  // namespace

}  // namespace event_history_test
