// Tests for proxy/control/new_session_gate.hpp (README "Security"): limits.newSessionsPerMinute
// per credential; known sessions and requests without one always go on; the refusal carries the
// time to retry, is logged when a credential starts being refused, and is counted.
#include "proxy/control/new_session_gate.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <string_view>

#include "core/manifest.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/runtime.hpp"

namespace new_session_gate_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::proxy::new_session_gate;

// A pool that knows session "known" (its manifest was loaded); the gate allows 2 a minute.
struct harness {
  kvp::core::slot_pool pool{kvp::testing::control_pool_options()};
  new_session_gate gate{2, pool};
  kvp::testing::log_capture logged;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  harness() {
    pool.set_runtime(kvp::testing::qwen7b_runtime());  // session hashes need persistence on
    REQUIRE_FALSE(hash("A0").empty());
    kvp::core::manifest m;
    m.session_hash = hash("known");
    m.session_id = "known";
    m.credential = "key-A";
    pool.add_manifest(m);
    REQUIRE(pool.listing().session(hash("known")));
  }
  std::string hash(const std::string& id) const { return pool.hash_for(std::string_view(id)); }
  bool allowed(const std::string& id, const std::string& credential,
               std::chrono::seconds after = 0s) {
    return !gate.refusal(hash(id), credential, t0 + after).has_value();
  }
};

TEST_CASE("new_session_gate: a credential's new sessions beyond the rate are refused with the "
          "time to retry",
          "[proxy][new_session_gate]") {
  harness h;
  CHECK(h.allowed("A0", "key-A"));
  CHECK(h.allowed("A1", "key-A"));
  const auto refused = h.gate.refusal(h.hash("A2"), "key-A", h.t0);
  REQUIRE(refused);
  CHECK(refused->code == kvp::core::errc::session_rate);
  CHECK(refused->retry_after_s == 30);  // a token every 30 s at 2 a minute
  CHECK(refused->message.find("at most 2 a minute") != std::string::npos);
  CHECK(h.gate.refused() == 1);
  CHECK_FALSE(h.allowed("A3", "key-A"));
  CHECK(h.gate.refused() == 2);
  // Logged when the credential starts being refused, not at every refusal.
  CHECK(h.logged.of("kv.session.rate_limited").size() == 1);

  CHECK(h.allowed("B0", "key-B"));          // another credential: its own bucket
  CHECK(h.allowed("A4", "key-A", 30s));     // a token back after 30 s
}

TEST_CASE("new_session_gate: known sessions and requests without a session always go on",
          "[proxy][new_session_gate]") {
  harness h;
  CHECK(h.allowed("A0", "key-A"));
  CHECK(h.allowed("A1", "key-A"));
  REQUIRE_FALSE(h.allowed("A2", "key-A"));  // the bucket is empty
  CHECK(h.allowed("known", "key-A"));
  CHECK_FALSE(h.gate.refusal("", "key-A", h.t0).has_value());
  CHECK(h.gate.refused() == 1);
}

TEST_CASE("new_session_gate: no limit configured refuses nothing", "[proxy][new_session_gate]") {
  kvp::core::slot_pool pool{kvp::testing::control_pool_options()};
  pool.set_runtime(kvp::testing::qwen7b_runtime());
  new_session_gate gate{0, pool};
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i)
    CHECK_FALSE(gate.refusal(pool.hash_for(std::string_view("S" + std::to_string(i))), "key", now));
  CHECK(gate.refused() == 0);
}

}  // namespace

}  // namespace new_session_gate_test
