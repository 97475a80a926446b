// core/resumable_stream.hpp: conversation ids reach llama-server namespaced per credential, on
// every route that names one, and lookup replies come back as the client named them.
#include "core/resumable_stream.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <string_view>

#include "core/request_class.hpp"

namespace resumable_stream_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

// The stream route of a request as the request path classifies it (request_class.hpp).
stream_route classify_stream_route(std::string_view method, std::string_view target) {
  return classify(method, target).stream;
}

TEST_CASE("resumable-stream routes are told apart by method and routed path", "[stream]") {
  CHECK(classify_stream_route("GET", "/v1/stream?conv_id=a") == stream_route::replay);
  CHECK(classify_stream_route("DELETE", "/v1/stream?conv_id=a") == stream_route::stop);
  CHECK(classify_stream_route("POST", "/v1/streams/lookup") == stream_route::lookup);
  // decoded as llama-server routes it, so an escape is no way around the namespacing
  CHECK(classify_stream_route("GET", "/v1/%73tream?conv_id=a") == stream_route::replay);
  CHECK(classify_stream_route("GET", "/v1/stream/?conv_id=a") == stream_route::replay);
  CHECK(classify_stream_route("POST", "/v1/stream") == stream_route::none);
  CHECK(classify_stream_route("GET", "/v1/streams/lookup") == stream_route::none);
  CHECK(classify_stream_route("POST", "/v1/chat/completions") == stream_route::none);
}

TEST_CASE("an upstream conversation id depends on the credential and the id", "[stream]") {
  const auto a = upstream_conversation_id("k1", "conv");
  CHECK(a.size() == 36);
  CHECK(a.rfind("kvp-", 0) == 0);
  CHECK(a == upstream_conversation_id("k1", "conv"));
  CHECK(a != upstream_conversation_id("k2", "conv"));
  CHECK(a != upstream_conversation_id("", "conv"));
  CHECK(a != upstream_conversation_id("k1", "conv2"));
  // length-prefixed: moving bytes between credential and id changes the result
  CHECK(upstream_conversation_id("k1c", "onv") != upstream_conversation_id("k1", "conv"));
}

TEST_CASE("every conv_id parameter is namespaced, the rest kept byte for byte; the first is named", "[stream]") {
  const auto up = upstream_conversation_id("k", "my conv");
  CHECK(namespace_stream_target("/v1/stream?conv_id=my+conv&from=12", "k").target ==
        "/v1/stream?conv_id=" + up + "&from=12");
  CHECK(namespace_stream_target("/v1/stream?from=12&conv_id=my%20conv", "k").target ==
        "/v1/stream?from=12&conv_id=" + up);
  // a second conv_id (llama-server reads one of them) is namespaced too
  const auto other = upstream_conversation_id("k", "x");
  CHECK(namespace_stream_target("/v1/stream?conv_id=my+conv&conv_id=x", "k").target ==
        "/v1/stream?conv_id=" + up + "&conv_id=" + other);
  // an escaped parameter name is still conv_id to llama-server
  CHECK(namespace_stream_target("/v1/stream?conv%5Fid=x", "k").target == "/v1/stream?conv_id=" + other);
  CHECK(namespace_stream_target("/v1/stream?conv_id=", "k").target ==
        "/v1/stream?conv_id=" + upstream_conversation_id("k", ""));
  CHECK(namespace_stream_target("/v1/stream", "k").target == "/v1/stream");
  CHECK(namespace_stream_target("/v1/stream", "k").conversation.empty());
  CHECK(namespace_stream_target("/v1/stream?from=1&conv_id=x&conv_id=y", "k").conversation == other);
}

TEST_CASE("a lookup asks for namespaced ids and answers with the client's", "[stream]") {
  const auto l = namespace_lookup(R"({"conversation_ids":["a","","b"]})", "k");
  REQUIRE(l);
  const auto ua = upstream_conversation_id("k", "a"), ub = upstream_conversation_id("k", "b");
  CHECK(l->body == R"({"conversation_ids":[")" + ua + R"(",")" + ub + R"("]})");
  const std::string reply = R"([{"conversation_id":")" + ub + R"(::m1","is_done":true,"total_bytes":7},)" +
                            R"({"conversation_id":"kvp-someone-else","is_done":false},)" +
                            R"({"conversation_id":")" + ua + R"(","is_done":false}])";
  const auto back = client_lookup_reply(reply, *l);
  REQUIRE(back);
  CHECK(*back == R"([{"conversation_id":"b::m1","is_done":true,"total_bytes":7},)"
                 R"({"conversation_id":"a","is_done":false}])");
}

TEST_CASE("a lookup body or reply of another shape is refused", "[stream]") {
  CHECK_FALSE(namespace_lookup("[]", "k"));
  CHECK_FALSE(namespace_lookup(R"({"conversation_ids":"a"})", "k"));
  CHECK_FALSE(namespace_lookup(R"({"conversation_ids":[1]})", "k"));
  CHECK_FALSE(namespace_lookup(R"({"conversation_ids":["a","b","c"]})", "k", 2));
  CHECK_FALSE(namespace_lookup("{", "k"));
  const auto l = namespace_lookup(R"({"conversation_ids":["a"]})", "k");
  REQUIRE(l);
  CHECK_FALSE(client_lookup_reply("{}", *l));
  CHECK_FALSE(client_lookup_reply("[1]", *l));
  CHECK(client_lookup_reply("[]", *l) == std::string("[]"));
}

}  // namespace

}  // namespace resumable_stream_test
