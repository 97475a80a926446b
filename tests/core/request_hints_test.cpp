// core/request_hints.hpp: Claude Code's per-conversation attribution block is told apart from
// every other request (README "Harnesses").
#include "core/request_hints.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "core/prefix_chain.hpp"

namespace request_hints_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::has_attribution_header;

constexpr std::string_view messages = "/v1/messages";

std::string body_with_system(const std::string& system) {
  return R"({"model":"claude","max_tokens":8,"system":)" + system +
         R"(,"messages":[{"role":"user","content":"hi"}]})";
}

const std::string billing_block =
    R"({"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=9f3e1;"})";

}  // namespace

TEST_CASE("the attribution block first in system is found", "[core][hints]") {
  const auto body = body_with_system(
      "[" + billing_block + R"(,{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}])");
  CHECK(has_attribution_header(messages, body));
  CHECK(has_attribution_header("/v1/messages?beta=true", body));  // Claude Code's own query
  CHECK(has_attribution_header("/v1/%6Dessages", body));  // the path llama-server routes
  // the system member after the messages, as key order is the client's
  CHECK(has_attribution_header(messages,
                               R"({"messages":[{"role":"user","content":"x-anthropic-billing-header: no"}],"system":[)" +
                                   billing_block + "]}"));
}

TEST_CASE("a system string that starts with the header counts", "[core][hints]") {
  CHECK(has_attribution_header(messages,
                               body_with_system(R"("x-anthropic-billing-header: cc_version=1; You are helpful.")")));
  CHECK_FALSE(has_attribution_header(messages, body_with_system(R"("You are helpful.")")));
}

TEST_CASE("anything else is no attribution block", "[core][hints]") {
  SECTION("the header is not first") {
    CHECK_FALSE(has_attribution_header(
        messages, body_with_system(R"([{"type":"text","text":"You are Claude Code."},)" + billing_block + "]")));
  }
  SECTION("only a message mentions it") {
    CHECK_FALSE(has_attribution_header(
        messages, R"({"system":"You are helpful.","messages":[{"role":"user","content":"x-anthropic-billing-header: cc_version=1;"}]})"));
  }
  SECTION("no system at all, or an empty one") {
    CHECK_FALSE(has_attribution_header(messages, R"({"messages":[{"role":"user","content":"hi"}]})"));
    CHECK_FALSE(has_attribution_header(messages, body_with_system("[]")));
    CHECK_FALSE(has_attribution_header(messages, body_with_system("null")));
  }
  SECTION("another route, even with the same body") {
    const auto body = body_with_system("[" + billing_block + "]");
    CHECK_FALSE(has_attribution_header("/v1/chat/completions", body));
    CHECK_FALSE(has_attribution_header("/v1/messages/count_tokens", body));
  }
  SECTION("the text elsewhere in the first block") {
    CHECK_FALSE(has_attribution_header(
        messages, body_with_system(R"([{"type":"text","text":"hi","note":"x-anthropic-billing-header: x"}])")));
    CHECK_FALSE(has_attribution_header(messages, body_with_system(R"(["x-anthropic-billing-header: x"])")));
  }
}

TEST_CASE("a malformed body is no attribution block", "[core][hints]") {
  const auto whole = body_with_system("[" + billing_block + "]");
  CHECK_FALSE(has_attribution_header(messages, whole.substr(0, whole.size() - 1)));  // truncated
  CHECK_FALSE(has_attribution_header(messages, "[" + whole + "]"));  // not an object
  CHECK_FALSE(has_attribution_header(messages, whole + "x"));         // trailing bytes
  CHECK_FALSE(has_attribution_header(messages, ""));
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  CHECK_FALSE(has_attribution_header(
      messages, R"({"system":[)" + billing_block + R"(],"x":)" + deep + "}"));  // nests too deep
  std::string huge = body_with_system("[" + billing_block + "]");
  huge.insert(huge.size() - 1, R"(,"pad":")" + std::string(kvp::core::max_chained_body_bytes, 'a') + "\"");
  CHECK_FALSE(has_attribution_header(messages, huge));  // too large to parse
}

TEST_CASE("hints are found by their id", "[core][hints]") {
  using kvp::core::hint_id;
  const auto h = kvp::core::find_request_hint("attribution_header");
  REQUIRE(h);
  CHECK(*h == hint_id::attribution_header);
  CHECK(kvp::core::hint_text(*h).fix.find("CLAUDE_CODE_ATTRIBUTION_HEADER=0") != std::string_view::npos);
  CHECK_FALSE(kvp::core::find_request_hint("nope"));
}

TEST_CASE("a chained /v1/messages body carries the attribution check, parsed once",
          "[core][request_hints]") {
  const std::string with =
      R"({"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1.a;"}],)"
      R"("messages":[{"role":"user","content":"hi"}]})";
  const std::string without =
      R"({"system":"You are helpful.","messages":[{"role":"user","content":"hi"}]})";
  const auto a = kvp::core::prefix_chain_of("/v1/messages", with);
  const auto b = kvp::core::prefix_chain_of("/v1/messages", without);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->attribution_block == has_attribution_header("/v1/messages", with));
  CHECK(a->attribution_block);
  CHECK_FALSE(b->attribution_block);
  // Another route's body that happens to hold the text is no Messages request.
  const auto c = kvp::core::prefix_chain_of(
      "/v1/chat/completions",
      R"({"messages":[{"role":"system","content":"x-anthropic-billing-header: x"}]})");
  REQUIRE(c);
  CHECK_FALSE(c->attribution_block);
}

}  // namespace request_hints_test
