// Tests for core/response_timings.hpp: the reused prompt tokens of a reply in every API family
// llama-server speaks (docs/llama-server.md §12).
#include "core/response_timings.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace response_timings_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

using kvp::core::parse_response_timings;

TEST_CASE("a stream's last timings win", "[core][timings]") {
  const auto t = parse_response_timings(
      R"(data: {"timings":{"cache_n":3,"prompt_n":9}})"
      "\n\n"
      R"(data: {"timings":{"cache_n":1200,"prompt_n":34,"prompt_ms":51.5}})"
      "\n\ndata: [DONE]\n\n");
  CHECK(t.cache_n == 1200);
  CHECK(t.prompt_n == 34);
  CHECK(t.prompt_ms == 51.5);
  CHECK(parse_response_timings("{}").cache_n == -1);
}

TEST_CASE("reuse is read in every API family", "[core][timings]") {
  // Messages, streamed: only message_start says it (the relay keeps the body's first KiB).
  const std::string messages_stream =
      "event: message_start\n"
      R"(data: {"type":"message_start","message":{"id":"msg_1","usage":{"cache_read_input_tokens":21127,"input_tokens":12,"output_tokens":0}}})"
      "\n\nevent: message_delta\n"
      R"(data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":64}})"
      "\n\n";
  CHECK(parse_response_timings(messages_stream).cache_n == 21127);
  CHECK(parse_response_timings(messages_stream).prompt_n == -1);  // not "input_tokens"
  // Messages, whole.
  CHECK(parse_response_timings(
            R"({"type":"message","usage":{"cache_read_input_tokens":5,"input_tokens":7}})")
            .cache_n == 5);
  // Responses and chat completions without timings.
  CHECK(parse_response_timings(
            R"({"usage":{"input_tokens":7001,"input_tokens_details":{"cached_tokens":6975}}})")
            .cache_n == 6975);
  CHECK(parse_response_timings(
            R"({"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}})")
            .cache_n == 8);
  // timings first when both are there.
  CHECK(parse_response_timings(
            R"({"usage":{"prompt_tokens_details":{"cached_tokens":8}},"timings":{"cache_n":9}})")
            .cache_n == 9);
}

TEST_CASE("numbers that are no token counts are ignored", "[core][timings]") {
  CHECK(parse_response_timings(R"({"timings":{"cache_n":-4}})").cache_n == -1);
  CHECK(parse_response_timings(R"({"timings":{"cache_n":1e300}})").cache_n == -1);
  CHECK(parse_response_timings(R"({"timings":{"cache_n":"7"}})").cache_n == -1);
  CHECK(parse_response_timings(R"({"timings":{"cache_n":)").cache_n == -1);
}

TEST_CASE("keys are found wherever the kept bytes end", "[core][timings]") {
  CHECK(parse_response_timings(R"("cache_n":12)").cache_n == 12);  // at the very start
  CHECK(parse_response_timings(R"({"x":"c","p":1,"cache_n")").cache_n == -1);  // at the very end
  CHECK(parse_response_timings("\"").cache_n == -1);
  CHECK(parse_response_timings("").cache_n == -1);
  // each key's own last occurrence, whichever order they come in
  const auto t = parse_response_timings(
      R"({"prompt_ms":2.5,"cache_n":4,"prompt_n":6} {"cache_n":5} {"prompt_n":7,"cached_tokens":1})");
  CHECK(t.cache_n == 5);
  CHECK(t.prompt_n == 7);
  CHECK(t.prompt_ms == 2.5);
}

}  // namespace response_timings_test
