// Tests for the pure helpers of proxy/server.hpp: reading llama-server's timings from the end
// of a body, and the idle checkpoint for a server that sleeps.
#include "proxy/server.hpp"

#include <catch2/catch.hpp>

namespace {

using namespace std::chrono_literals;
using kvp::proxy::checkpoint_before_sleep;
using kvp::proxy::parse_timings;

TEST_CASE("parse_timings reads the last timings of a stream", "[proxy][server]") {
  const auto t = parse_timings(
      R"(data: {"timings":{"cache_n":3,"prompt_n":9}})"
      "\n\n"
      R"(data: {"timings":{"cache_n":1200,"prompt_n":34,"prompt_ms":51.5}})"
      "\n\ndata: [DONE]\n\n");
  CHECK(t.cache_n == 1200);
  CHECK(t.prompt_n == 34);
  CHECK(t.prompt_ms == 51.5);
  CHECK(parse_timings("{}").cache_n == -1);
}

TEST_CASE("the idle checkpoint comes before llama-server sleeps", "[proxy][server]") {
  CHECK(checkpoint_before_sleep(30'000ms, 0s) == 30'000ms);   // a server that never sleeps
  CHECK(checkpoint_before_sleep(0ms, 0s) == 0ms);             // idle checkpoints off
  CHECK(checkpoint_before_sleep(30'000ms, 300s) == 30'000ms);  // already earlier
  CHECK(checkpoint_before_sleep(30'000ms, 20s) == 19'000ms);   // a second before
  CHECK(checkpoint_before_sleep(30'000ms, 1s) == 500ms);       // half of a short period
  CHECK(checkpoint_before_sleep(0ms, 3s) == 2'000ms);          // sleep needs it even when off
}

}  // namespace
