// Tests for backends/llama_router.hpp and the router parts of llama_http_backend.hpp, on
// bodies a llama-server router sends (docs/llama-server.md §14).
#include "backends/llama_router.hpp"

#include <catch2/catch.hpp>

#include "backends/llama_http_backend.hpp"

namespace llama_router_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::backends;

// GET /props of `llama-server --models-dir D --models-max 1` (this build, verbatim).
constexpr std::string_view router_props =
    R"({"role":"router","max_instances":1,"models_autoload":true,"model_alias":"llama-server",)"
    R"("model_path":"none","default_generation_settings":{"params":null,"n_ctx":0},)"
    R"("ui_settings":{},"build_info":"b1-80fb11a","cors_proxy_enabled":false})";

// GET /v1/models of the same router (abridged: args and presets trimmed).
constexpr std::string_view router_models_body = R"({"data":[
  {"id":"alpha","aliases":[],"tags":[],"object":"model","owned_by":"llamacpp",
   "status":{"value":"loaded","args":["llama-server","--model","/m/alpha.gguf"]}},
  {"id":"beta","aliases":["b","second"],"object":"model",
   "status":{"value":"unloaded","args":[],"exit_code":1,"failed":true}},
  {"id":"gamma","status":{"value":"sleeping"}},
  {"aliases":["no id"]},
  "not an object"
],"object":"list"})";

}  // namespace

TEST_CASE("parse_router_props tells a router from a plain llama-server", "[backends][router]") {
  auto r = parse_router_props(router_props);
  REQUIRE(r.ok());
  REQUIRE(r.value().has_value());
  CHECK(r.value()->max_instances == 1);
  CHECK(r.value()->autoload);
  auto plain = parse_router_props(R"({"total_slots":1,"model_path":"/m/a.gguf"})");
  REQUIRE(plain.ok());
  CHECK_FALSE(plain.value().has_value());
  CHECK_FALSE(parse_router_props(R"({"role":"router","max_instances":-1})").ok());
  CHECK_FALSE(parse_router_props("{").ok());
}

TEST_CASE("parse_router_models reads ids, aliases and status; skips entries without an id",
          "[backends][router]") {
  auto r = parse_router_models(router_models_body);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK(r->at(0).id == "alpha");
  CHECK(r->at(0).running());
  CHECK(r->at(1).aliases == std::vector<std::string>{"b", "second"});
  CHECK_FALSE(r->at(1).running());
  CHECK(r->at(2).running());  // a sleeping child still counts toward --models-max
  CHECK_FALSE(parse_router_models(R"({"object":"list"})").ok());
}

TEST_CASE("parse_router_models reads at most max_router_models entries", "[backends][router]") {
  std::string body = R"({"data":[)";
  for (std::size_t i = 0; i < max_router_models + 10; ++i)
    body += (i ? "," : "") + std::string(R"({"id":"m)") + std::to_string(i) + R"("})";
  body += "]}";
  auto r = parse_router_models(body);
  REQUIRE(r.ok());
  CHECK(r->size() == max_router_models);
}

TEST_CASE("a router model's management calls name it and never load it", "[backends][router]") {
  CHECK(router_target("/props", "") == "/props");
  CHECK(router_target("/props", "alpha") == "/props?model=alpha&autoload=false");
  CHECK(router_target("/slots/0?action=save", "org/model:Q4 K") ==
        "/slots/0?action=save&model=org%2Fmodel%3AQ4%20K&autoload=false");
  CHECK(slot_action_body("", "") == "");
  CHECK(slot_action_body("f.bin", "") == R"({"filename":"f.bin"})");
  // erase and the probe action: the router parses every POST body for its "model"
  CHECK(slot_action_body("", "alpha") == R"({"model":"alpha"})");
  CHECK(slot_action_body("f.bin", "alpha") == R"({"filename":"f.bin","model":"alpha"})");
  CHECK(behaviour_probe_body(0, "alpha").find(R"("model":"alpha")") != std::string::npos);
}

}  // namespace llama_router_test
