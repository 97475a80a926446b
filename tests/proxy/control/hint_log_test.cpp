// Tests for proxy/control/hint_log.hpp: a hint's requests are counted, its first sighting in the
// process is logged once and recorded in hints.json, and the counts reach /kv/status and
// /metrics.
#include "proxy/control/hint_log.hpp"

#include <rapidjson/document.h>

#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/control_parts.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/run.hpp"

namespace hint_log_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::hint_id;
// A hint_log over the parts a coordinator gives it; log lines captured while it lives.
struct harness : kvp::testing::control_parts {
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::hint_log hints{"default", ioc.get_executor(), store, actions};
  kvp::testing::log_capture logged;

  harness() { REQUIRE(store.open().ok()); }

  // Lets the recording the notes started finish (it runs on the file pool).
  void settle() { kvp::testing::run_for(ioc, std::chrono::milliseconds(100)); }

  rapidjson::Document status() const {
    rapidjson::StringBuffer sb;
    kvp::core::json_writer w(sb);
    hints.write_status(w);
    rapidjson::Document d;
    d.Parse(sb.GetString());
    return d;
  }
};

TEST_CASE("hint_log: nothing seen, nothing told", "[proxy][hint_log]") {
  harness h;
  h.settle();
  CHECK(h.status().GetArray().Size() == 0);
  CHECK(h.store.read_hints().empty());
  kvp::core::prom_writer w;
  h.hints.write_metrics(w, "server=\"default\"");
  CHECK(w.text().find(
            "kvpersist_hint_requests_total{server=\"default\",hint=\"attribution_header\"} 0") !=
        std::string::npos);
}

TEST_CASE("hint_log: the first sighting is logged once and recorded in hints.json; every request "
          "counts",
          "[proxy][hint_log]") {
  harness h;
  h.hints.note(hint_id::attribution_header);
  h.hints.note(hint_id::attribution_header);
  h.settle();
  h.hints.note(hint_id::attribution_header);
  h.settle();

  const auto lines = h.logged.of("kv.hint.attribution_header");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("server=default") != std::string::npos);

  const auto recorded = h.store.read_hints();
  REQUIRE(recorded.size() == 1);
  CHECK(recorded[0].hint == hint_id::attribution_header);
  CHECK_FALSE(recorded[0].first_seen_at.empty());

  const auto d = h.status();
  REQUIRE(d.IsArray());
  REQUIRE(d.GetArray().Size() == 1);
  const auto& row = d[0u];
  CHECK(std::string(row["hint"].GetString()) == "attribution_header");
  CHECK(row["requests"].GetUint64() == 3);
  CHECK(std::string(row["firstSeenAt"].GetString()) == recorded[0].first_seen_at);
  CHECK_FALSE(std::string(row["effect"].GetString()).empty());
  CHECK_FALSE(std::string(row["fix"].GetString()).empty());

  kvp::core::prom_writer w;
  h.hints.write_metrics(w, "server=\"default\"");
  CHECK(w.text().find(
            "kvpersist_hint_requests_total{server=\"default\",hint=\"attribution_header\"} 3") !=
        std::string::npos);
}

TEST_CASE("hint_log: notes from other threads are all counted, the sighting recorded once",
          "[proxy][hint_log]") {
  harness h;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&h] {
      for (int j = 0; j < 250; ++j) h.hints.note(hint_id::attribution_header);
    });
  for (auto& t : threads) t.join();
  h.settle();
  CHECK(h.logged.of("kv.hint.attribution_header").size() == 1);
  CHECK(h.store.read_hints().size() == 1);
  CHECK(h.status()[0u]["requests"].GetUint64() == 1000);
}

}  // namespace

}  // namespace hint_log_test
