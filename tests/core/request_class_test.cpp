// Tests for core/request_class.hpp: which request targets take the slot lease, which are
// kvpersist's own (/slots, refused to clients) and which pass through untouched.
#include "core/request_class.hpp"

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <string_view>

#include "tests/support/core_strings.hpp"

namespace request_class_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {
using kind = kvp::core::endpoint_kind;

// The kind a POST to `target` is classified as.
kind kind_of(std::string_view target) { return kvp::core::classify("POST", target).kind; }

// Requires every one of `paths` to be classified as `expected`.
void check_class(kind expected, std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    CAPTURE(path);
    CHECK(kind_of(path) == expected);
  }
}
}  // namespace

TEST_CASE("every llama-server route that runs on a slot is inference", "[core][request_class]") {
  check_class(kind::inference,
              {"/completion", "/completions", "/v1/completions", "/chat/completions",
               "/v1/chat/completions", "/responses", "/v1/responses", "/infill", "/v1/infill",
               "/v1/messages", "/embedding", "/embeddings", "/v1/embeddings", "/rerank",
               "/reranking", "/v1/rerank", "/v1/reranking", "/api/chat", "/api/generate",
               "/audio/transcriptions", "/v1/audio/transcriptions"});
}

TEST_CASE("query strings, fragments and trailing slashes do not change the class",
          "[core][request_class]") {
  check_class(kind::inference, {"/v1/chat/completions?stream=true", "/v1/chat/completions#x",
                                "/v1/chat/completions/", "/v1/chat/completions//",
                                "/v1/chat/completions/?a=/slots"});
  check_class(kind::passthrough, {"/health?x=/v1/chat/completions"});
}

TEST_CASE("/slots and everything under it belongs to kvpersist", "[core][request_class]") {
  check_class(kind::slots, {"/slots", "/slots/", "/slots?fail_on_no_slot=1", "/slots/0?action=save",
                            "/slots/0?action=restore", "/slots/0?action=erase", "/slots/17"});
}

TEST_CASE("everything else passes through without a lease", "[core][request_class]") {
  check_class(kind::passthrough,
              {"/", "/health", "/v1/health", "/props", "/v1/models", "/models", "/metrics",
               "/tokenize", "/detokenize", "/apply-template", "/lora-adapters",
               "/v1/chat/completions/x", "/slotsx", "/v1/slots", "/V1/CHAT/COMPLETIONS", ""});
}

// llama-server's HTTP layer (cpp-httplib) percent-decodes the path before routing
// (Server::parse_request_line: req.path = detail::decode_url(path, false)), so
// "/%73lots/0?action=erase" reaches the slot API unless kvpersist decodes too.
TEST_CASE("percent-encoded paths are classified as llama-server will route them",
          "[core][request_class]") {
  check_class(kind::slots, {"/%73lots/0?action=erase", "/slots%2F0?action=save"});
  check_class(kind::inference, {"/v1/chat/%63ompletions", "/v1/chat/completions%2F"});
  check_class(kind::passthrough, {"/%68ealth"});
  // Malformed escapes stay as they are (httplib keeps them too).
  check_class(kind::passthrough, {"/slots%", "/slots%2", "/%zzslots"});
}

TEST_CASE("decode_path decodes every valid escape once", "[core][request_class]") {
  using kvp::core::decode_path;
  CHECK(decode_path("/a%20b") == "/a b");
  CHECK(decode_path("/%2f%2F") == "///");
  CHECK(decode_path("/%252F") == "/%2F");  // one level only
  CHECK(decode_path("/%") == "/%");
  CHECK(decode_path("/%4") == "/%4");
  CHECK(decode_path("/%g1") == "/%g1");
  CHECK(decode_path("") == "");
}

// cpp-httplib's path decoding (decode_url, and decode_path_component in the versions
// llama.cpp vendors) also accepts the non-standard "%uXXXX" form and turns it into UTF-8,
// so "/%u0073lots/0?action=erase" is routed to the slot API just like "/slots/0".
TEST_CASE("%uXXXX escapes are decoded as llama-server's HTTP library does",
          "[core][request_class]") {
  CHECK(kvp::core::decode_path("/%u0073lots") == "/slots");
  CHECK(kind_of("/%u0073lots/0?action=erase") == kind::slots);
  CHECK(kind_of("/v1/chat/%u0063ompletions") == kind::inference);
}

// The router picks a GET's model by ?model= as llama-server reads its query (docs/llama-server.md
// §9, §14): keys are decoded like values, '+' is a space, the fragment is not part of it, the
// last of repeated keys counts. A key kvpersist compared raw let "?%6Dodel=beta" load beta
// with nothing saved (issue 36, hole 2).
TEST_CASE("query_param reads a query as llama-server's get_param does", "[core][request_class]") {
  using kvp::core::query_param;
  CHECK(query_param("/props?model=beta", "model") == "beta");
  CHECK(query_param("/props?%6Dodel=beta", "model") == "beta");
  CHECK(query_param("/props?%6d%6F%64%65%6c=beta", "model") == "beta");
  CHECK(query_param("/props?model=be%74a", "model") == "beta");
  CHECK(query_param("/props?model=my+model%2Bx", "model") == "my model+x");
  CHECK(query_param("/props?model=beta%", "model") == "beta%");  // malformed: kept
  CHECK(query_param("/props?model=%zzbeta", "model") == "%zzbeta");
  // No %uXXXX form in a query (cpp-httplib's decode_query_component), unlike in a path.
  CHECK(query_param("/props?%u006Dodel=beta", "model") == std::nullopt);
  CHECK(query_param("/props?model=beta#frag", "model") == "beta");
  CHECK(query_param("/props?x=1#&model=beta", "model") == std::nullopt);
  CHECK(query_param("/props?model", "model") == "");  // no '=': an empty value
  CHECK(query_param("/props?model=", "model") == "");
  CHECK(query_param("/props?&&model=beta&", "model") == "beta");
  CHECK(query_param("/props?mode=beta&models=x", "model") == std::nullopt);
  CHECK(query_param("/props", "model") == std::nullopt);
  CHECK(query_param("/props?a=%3D&model=x%3Dy", "model") == "x=y");
  // get_params copies the parsed pairs into a map: the last of repeated keys, however each
  // is spelled, wins; a pair repeated verbatim was parsed once, at its first place.
  CHECK(query_param("/props?model=alpha&%6Dodel=beta", "model") == "beta");
  CHECK(query_param("/props?%6Dodel=alpha&model=beta", "model") == "beta");
  CHECK(query_param("/props?model=alpha&model=beta&model=alpha", "model") == "beta");
  CHECK(query_param("/props?model=alpha&model=beta&%6Dodel=alpha", "model") == "alpha");
}

TEST_CASE("only POST on an inference path needs the slot", "[core][request_class]") {
  const auto needs_slot = [](std::string_view method, std::string_view target) {
    return kvp::core::classify(method, target).needs_slot;
  };
  CHECK(needs_slot("POST", "/v1/chat/completions"));
  CHECK(needs_slot("POST", "/v1/chat/%63ompletions/"));
  // llama-server answers a CORS preflight itself and has no GET/HEAD route there.
  CHECK_FALSE(needs_slot("OPTIONS", "/v1/chat/completions"));
  CHECK_FALSE(needs_slot("GET", "/v1/chat/completions"));
  CHECK_FALSE(needs_slot("HEAD", "/completion"));
  CHECK_FALSE(needs_slot("PUT", "/completion"));
  CHECK_FALSE(needs_slot("post", "/completion"));  // methods are case-sensitive
  CHECK_FALSE(needs_slot("POST", "/tokenize"));
  CHECK_FALSE(needs_slot("POST", "/slots/0?action=save"));
}

TEST_CASE("only POST /lora-adapters changes the runtime, however it is spelled",
          "[core][request_class]") {
  CHECK(kvp::core::classify("POST", "/lora-adapters").changes_runtime);
  CHECK(kvp::core::classify("POST", "/%6Cora-adapters/?x=1").changes_runtime);
  CHECK_FALSE(kvp::core::classify("GET", "/lora-adapters").changes_runtime);
  CHECK_FALSE(kvp::core::classify("POST", "/lora-adapters/0").changes_runtime);
  CHECK_FALSE(kvp::core::classify("POST", "/v1/chat/completions").changes_runtime);
}

TEST_CASE("the prediction route is matched as llama-server routes it", "[core][request_class]") {
  struct row {
    std::string_view target, route;
    bool match;
  };
  for (const auto& r : {row{"/predict", "/predict", true}, row{"/%70redict?x=1", "/predict", true},
                        row{"/predict/", "/predict", true},
                        row{"/vertex/predict", "/vertex/predict", true},
                        row{"/predict", "/vertex/predict", false},
                        row{"/predictions", "/predict", false}, row{"/", "", false},
                        row{"", "", false}}) {
    INFO(r.target << " vs " << r.route);
    CHECK(kvp::core::classify("POST", r.target).is_prediction(r.route) == r.match);
  }
}

// llama-server's middleware_validate_api_key (tools/server/server-http.cpp).
TEST_CASE("client API keys are checked as llama-server checks them", "[core][request_class]") {
  using kvp::core::client_key_matches;
  const std::string key = "k3y";
  CHECK(client_key_matches("Bearer k3y", "", key));
  CHECK(client_key_matches("k3y", "", key));              // the prefix is optional
  CHECK(client_key_matches("", "k3y", key));              // X-Api-Key when no Authorization
  CHECK(client_key_matches("", "Bearer k3y", key));       // ... with the same prefix rule
  CHECK_FALSE(client_key_matches("", "", key));
  CHECK_FALSE(client_key_matches("bearer k3y", "", key)); // exact spelling only
  CHECK_FALSE(client_key_matches("Bearer  k3y", "", key));
  CHECK_FALSE(client_key_matches("Bearer k3", "", key));
  CHECK_FALSE(client_key_matches("Bearer k3yy", "", key));
  CHECK_FALSE(client_key_matches("Bearer wrong", "k3y", key));  // Authorization wins
  CHECK_FALSE(client_key_matches("Bearer ", "", key));
}

TEST_CASE("one route table: kind, pinning and body format of each inference route",
          "[core][request_class]") {
  using kvp::core::body_format;
  using kvp::core::inference_route_of;
  const auto* chat = inference_route_of("/v1/chat/%63ompletions?x=1");
  REQUIRE(chat != nullptr);
  CHECK(chat->path == "/v1/chat/completions");
  CHECK(chat->pinnable);
  CHECK(chat->format == body_format::chat);
  CHECK(inference_route_of("/v1/messages")->format == body_format::messages);
  CHECK_FALSE(inference_route_of("/v1/messages")->pinnable);
  CHECK(inference_route_of("/completions/")->format == body_format::prompt);
  CHECK(inference_route_of("/responses")->format == body_format::responses);
  CHECK(inference_route_of("/api/chat")->format == body_format::chat);
  CHECK_FALSE(inference_route_of("/api/chat")->pinnable);
  CHECK(inference_route_of("/v1/infill")->format == body_format::none);
  CHECK(inference_route_of("/health") == nullptr);
  CHECK(inference_route_of("/slots/0") == nullptr);
  // classify reads the table: an inference route is exactly one it calls inference, and
  // unpinnable() is its pinnable column.
  for (std::string_view path : {"/completion", "/v1/chat/completions", "/v1/embeddings",
                                "/v1/rerank", "/audio/transcriptions", "/api/generate", "/props"}) {
    CAPTURE(path);
    const auto* route = inference_route_of(path);
    const auto rc = kvp::core::classify("POST", path);
    CHECK((rc.kind == kvp::core::endpoint_kind::inference) == (route != nullptr));
    CHECK(rc.route == route);
    CHECK(rc.unpinnable() == (route && !route->pinnable));
  }
}

}  // namespace request_class_test
