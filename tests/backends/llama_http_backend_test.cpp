// Tests for the reply parsers of backends/llama_http_backend.hpp, on bodies llama-server
// actually sends (docs/llama-server.md §1.3, §2, §7).
#include "backends/llama_http_backend.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <string>

namespace llama_http_backend_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::backends;
using kvp::core::errc;

// GET /props of a single-model llama-server (abridged: chat_template and params trimmed).
constexpr std::string_view props_body = R"({
  "default_generation_settings": {
    "id": 0, "id_task": -1, "n_ctx": 8192, "speculative": false, "is_processing": false,
    "params": {"n_predict": -1, "seed": 4294967295, "temperature": 0.8, "top_k": 40}
  },
  "total_slots": 1,
  "model_alias": "qwen2.5-7b-instruct",
  "model_path": "/models/qwen2.5-7b-instruct-q4_k_m.gguf",
  "modalities": {"vision": false, "audio": false},
  "media_marker": "<__media_Zx81Qa__>",
  "endpoint_slots": true, "endpoint_props": false, "endpoint_metrics": false,
  "webui": true,
  "chat_template": "{%- for message in messages %}{{ message.content }}{%- endfor %}",
  "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
  "build_info": "b6123-80fb11a",
  "is_sleeping": false
})";

}  // namespace

TEST_CASE("parse_props reads the runtime identity from /props", "[backends][llama_http]") {
  auto r = parse_props(props_body);
  REQUIRE(r.ok());
  CHECK(r->model_path == "/models/qwen2.5-7b-instruct-q4_k_m.gguf");
  CHECK(r->build_info == "b6123-80fb11a");
  CHECK(r->n_ctx == 8192);
  CHECK(r->total_slots == 1);
  CHECK(r->media_marker == "<__media_Zx81Qa__>");
  CHECK(r->runtime_key.empty());  // the operator's, never the server's
}

TEST_CASE("parse_props refuses bodies without total_slots", "[backends][llama_http]") {
  SECTION("router mode") {
    auto r = parse_props(
        R"({"role":"router","max_instances":4,"models_autoload":true,"build_info":"b6123-80fb11a"})");
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::backend_unsupported);
    CHECK(r.err().message.find("total_slots") != std::string::npos);
  }
  SECTION("zero slots") {
    auto r = parse_props(R"({"total_slots":0,"model_path":"/m.gguf"})");
    REQUIRE_FALSE(r.ok());
  }
  SECTION("mistyped") {
    auto r = parse_props(R"({"total_slots":"1","model_path":"/m.gguf"})");
    REQUIRE_FALSE(r.ok());
  }
  SECTION("not an object") {
    CHECK_FALSE(parse_props("[]").ok());
    CHECK_FALSE(parse_props("<html>502 Bad Gateway</html>").ok());
    CHECK_FALSE(parse_props("").ok());
  }
}

TEST_CASE("parse_save_reply reads n_saved, n_written and save_ms", "[backends][llama_http]") {
  auto r = parse_save_reply(
      R"({"id_slot":0,"filename":"p2k.bin","n_saved":2124,"n_written":4384076,"timings":{"save_ms":1.011}})");
  REQUIRE(r.ok());
  CHECK(r->n_saved == 2124);
  CHECK(r->n_written == 4384076);
  CHECK(r->save_ms == Approx(1.011));

  SECTION("an empty slot saves 0 tokens, which is not a parse error") {
    auto e = parse_save_reply(
        R"({"id_slot":0,"filename":"e.bin","n_saved":0,"n_written":24,"timings":{"save_ms":0.2}})");
    REQUIRE(e.ok());
    CHECK(e->n_saved == 0);
    CHECK(e->n_written == 24);
  }
  SECTION("no timings") {
    auto e = parse_save_reply(R"({"n_saved":5,"n_written":10})");
    REQUIRE(e.ok());
    CHECK(e->save_ms == 0);
  }
  SECTION("an error body is not a save") {
    auto e = parse_save_reply(
        R"({"error":{"code":500,"message":"Unable to save slot","type":"server_error"}})");
    REQUIRE_FALSE(e.ok());
    CHECK(e.err().code == errc::backend_unsupported);
  }
  SECTION("garbage") {
    CHECK_FALSE(parse_save_reply("").ok());
    CHECK_FALSE(parse_save_reply("{\"n_saved\":").ok());
  }
}

TEST_CASE("parse_restore_reply reads n_restored, n_read and restore_ms", "[backends][llama_http]") {
  auto r = parse_restore_reply(
      R"({"id_slot":0,"filename":"p2k.bin","n_restored":2124,"n_read":4384076,"timings":{"restore_ms":0.913}})");
  REQUIRE(r.ok());
  CHECK(r->n_restored == 2124);
  CHECK(r->n_read == 4384076);
  CHECK(r->restore_ms == Approx(0.913));

  auto e = parse_restore_reply(
      R"({"error":{"code":400,"message":"Unable to restore slot: No available space in KV cache or invalid slot save file","type":"invalid_request_error"}})");
  REQUIRE_FALSE(e.ok());
  CHECK_FALSE(parse_restore_reply("[]").ok());
}

TEST_CASE("parse_erase_reply reads n_erased", "[backends][llama_http]") {
  auto r = parse_erase_reply(R"({"id_slot":0,"n_erased":2124})");
  REQUIRE(r.ok());
  CHECK(r->n_erased == 2124);
  CHECK_FALSE(parse_erase_reply("nope").ok());
}

TEST_CASE("error_message extracts llama-server's message", "[backends][llama_http]") {
  CHECK(
      error_message(
          R"({"error":{"code":400,"message":"Unable to restore slot: No available space in KV cache or invalid slot save file","type":"invalid_request_error"}})") ==
      "Unable to restore slot: No available space in KV cache or invalid slot save file");
  CHECK(
      error_message(
          R"({"error":{"code":501,"message":"This server does not support slots action. Start it with `--slot-save-path`","type":"not_supported_error"}})") ==
      "This server does not support slots action. Start it with `--slot-save-path`");
  SECTION("other bodies come back as they are, truncated to 200 bytes") {
    CHECK(error_message("Bad Gateway") == "Bad Gateway");
    CHECK(error_message(R"({"error":"plain string"})") == R"({"error":"plain string"})");
    const std::string long_body(1000, 'x');
    CHECK(error_message(long_body) == std::string(200, 'x'));
    CHECK(error_message("").empty());
  }
}

TEST_CASE("the fingerprint's extra fields are canonical", "[backends][llama_http]") {
  const auto a = parse_model_meta(
      R"({"data":[{"id":"m","meta":{"n_vocab":32000,"size":39068672,"ftype":"F16","vocab_type":true}}]})");
  const auto b = parse_model_meta(
      R"({"object":"list","data":[{"meta":{"vocab_type":true,"ftype":"F16","size":39068672,"n_vocab":32000}}]})");
  REQUIRE(a);
  CHECK(a.value() == "ftype=F16;n_vocab=32000;size=39068672;vocab_type=true;");
  CHECK(b.value() == a.value());  // key order does not matter
  CHECK(parse_model_meta(R"({"data":[]})").value().empty());
  CHECK_FALSE(parse_model_meta("[[[["));  // not JSON: the probe fails, never a guess

  const auto lora = parse_lora_adapters(R"([{"id":0,"path":"/m/l.gguf","scale":0.5}])");
  REQUIRE(lora);
  CHECK(lora.value() == "0,/m/l.gguf,0.5;");
  CHECK(parse_lora_adapters("[]").value().empty());
  CHECK_FALSE(parse_lora_adapters(R"({"id":0})"));

  auto props = [](const char* tmpl) {
    return fmt::format(R"({{"total_slots":1,"chat_template":"{}","bos_token":"<s>"}})", tmpl);
  };
  const auto p1 = parse_props(props("A")), p2 = parse_props(props("B"));
  REQUIRE(p1);
  REQUIRE(p2);
  CHECK(p1->prompt_format.size() == 64);
  CHECK(p1->prompt_format != p2->prompt_format);
  CHECK(parse_props(props("A"))->prompt_format == p1->prompt_format);
}

TEST_CASE("slot_action_error names an invalid slot id KV_SLOT_NOT_FOUND", "[backends][llama_http]") {
  const auto invalid_slot =
      R"({"error":{"code":400,"message":"Invalid slot ID","type":"invalid_request_error"}})";
  auto e = slot_action_error(errc::restore_failed, 400, invalid_slot);
  CHECK(e.code == errc::slot_not_found);
  CHECK(e.http_status == 400);
  CHECK(e.message == "Invalid slot ID");
  const auto bad_file =
      R"({"error":{"code":400,"message":"Unable to restore slot","type":"invalid_request_error"}})";
  CHECK(slot_action_error(errc::restore_failed, 400, bad_file).code ==
        errc::restore_failed);
  CHECK(slot_action_error(errc::save_failed, 500, invalid_slot).code ==
        errc::save_failed);
}

TEST_CASE("parse_slots reads GET /slots", "[backends][llama_http]") {
  auto r = parse_slots(R"([
    {"id":0,"id_task":42,"n_ctx":8192,"speculative":false,"is_processing":false,
     "n_prompt_tokens":2124,"n_prompt_tokens_processed":0,"n_prompt_tokens_cache":0,
     "params":{"n_predict":-1},"next_token":[{"has_next_token":false,"has_new_line":false,"n_remain":-1,"n_decoded":12}]},
    {"id":1,"n_ctx":8192,"speculative":false,"is_processing":true}
  ])");
  REQUIRE(r.ok());
  const auto& slots = r.value();
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].id == 0);
  CHECK(slots[0].n_ctx == 8192);
  CHECK_FALSE(slots[0].is_processing);
  CHECK(slots[0].n_prompt_tokens == 2124);
  CHECK(slots[1].id == 1);
  CHECK(slots[1].is_processing);
  CHECK(slots[1].n_prompt_tokens == -1);  // never-used slot: the field is absent

  SECTION("an error object is not a slot list") {
    auto e = parse_slots(
        R"({"error":{"code":501,"message":"This server does not support slots endpoint. Start it with `--slots`","type":"not_supported_error"}})");
    REQUIRE_FALSE(e.ok());
    CHECK(e.err().code == errc::backend_unsupported);
  }
  SECTION("an empty list") {
    auto e = parse_slots("[]");
    REQUIRE(e.ok());
    CHECK(e->empty());
  }
}

// llama-server's replies are untrusted input too: deep JSON and out-of-range numbers are
// refused as bad replies (backend_unsupported), never a crash or a huge allocation.
TEST_CASE("reply parsers refuse JSON nested deeper than json_max_depth", "[backends][llama_http]") {
  const std::string deep = R"({"total_slots":1,"n_saved":1,"n_restored":1,"x":)" +
                           std::string(300'000, '[') + std::string(300'000, ']') + "}";
  for (auto r : {parse_props(deep).ok(), parse_save_reply(deep).ok(),
                 parse_restore_reply(deep).ok(), parse_erase_reply(deep).ok(),
                 parse_slots("[" + deep + "]").ok()})
    CHECK_FALSE(r);
  auto p = parse_props(deep);
  REQUIRE_FALSE(p.ok());
  CHECK(p.err().code == errc::backend_unsupported);
  CHECK(p.err().message.find("nested deeper than 128") != std::string::npos);
  CHECK(error_message(deep) == deep.substr(0, 200));
}

TEST_CASE("parse_props refuses a total_slots above max_total_slots", "[backends][llama_http]") {
  CHECK(parse_props(R"({"total_slots":1024,"model_path":"/m.gguf"})").ok());
  for (const char* n : {"1025", "9223372036854775807", "4611686018427387904"}) {
    auto r = parse_props(std::string(R"({"model_path":"/m.gguf","total_slots":)") + n + "}");
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::backend_unsupported);
    CHECK(r.err().message.find("more than the 1024") != std::string::npos);
  }
}

TEST_CASE("save, restore and erase replies with counts above 2^53 are refused",
          "[backends][llama_http]") {
  constexpr const char* huge = "18446744073709551615";
  CHECK_FALSE(parse_save_reply(fmt::format(R"({{"n_saved":{},"n_written":10}})", huge)).ok());
  CHECK_FALSE(parse_save_reply(fmt::format(R"({{"n_saved":10,"n_written":{}}})", huge)).ok());
  CHECK_FALSE(parse_save_reply(R"({"n_saved":10,"n_written":-1})").ok());
  CHECK_FALSE(parse_restore_reply(fmt::format(R"({{"n_restored":{},"n_read":1}})", huge)).ok());
  CHECK_FALSE(parse_restore_reply(fmt::format(R"({{"n_restored":1,"n_read":{}}})", huge)).ok());
  CHECK_FALSE(parse_erase_reply(fmt::format(R"({{"n_erased":{}}})", huge)).ok());
  auto ok = parse_save_reply(R"({"n_saved":9007199254740992,"n_written":9007199254740992})");
  REQUIRE(ok.ok());
  CHECK(ok->n_saved == 9007199254740992u);
}

TEST_CASE("parse_slots skips slot ids kvpersist cannot manage", "[backends][llama_http]") {
  auto r = parse_slots(R"([{"id":-1},{"id":4294967297},{"id":1024},{"id":3},{"n_ctx":5}])");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK(r->front().id == 3);
}

TEST_CASE("the behaviour probe asks one greedy token with ranks, uncached, on its slot",
          "[backends][llama_http]") {
  CHECK(behaviour_probe_body(3) ==
        fmt::format(R"({{"prompt":"{}","n_predict":1,"n_probs":8,"temperature":0.0,)"
                    R"("cache_prompt":false,"id_slot":3}})",
                    kvp::core::behaviour_prompt));
}

TEST_CASE("parse_behaviour_reply reads the ranked ids llama-server returns", "[backends][llama_http]") {
  // POST /completion with n_probs 8 (this build, abridged to three ranks).
  constexpr std::string_view body = R"json({"index":0,"content":"))","tokens_predicted":1,
    "completion_probabilities":[{"id":876,"token":"))","bytes":[41,41],"logprob":-9.16,
      "top_logprobs":[{"id":876,"token":"))","bytes":[41,41],"logprob":-9.16},
                      {"id":20881,"token":" obs","bytes":[32,111,98,115],"logprob":-9.22},
                      {"id":10599,"token":"engine","bytes":[101],"logprob":-9.24}]}]})json";
  auto s = parse_behaviour_reply(body);
  REQUIRE(s);
  CHECK(s->top == std::vector<std::int64_t>{876, 20881, 10599});
  SECTION("post-sampling probabilities are named top_probs") {
    auto p = parse_behaviour_reply(
        R"({"completion_probabilities":[{"id":5,"top_probs":[{"id":5,"prob":0.9},{"id":7,"prob":0.1}]}]})");
    REQUIRE(p);
    CHECK(p->top == std::vector<std::int64_t>{5, 7});
  }
  SECTION("a server without probabilities cannot tell: empty, not an error") {
    auto p = parse_behaviour_reply(R"({"content":"x","tokens_predicted":1})");
    REQUIRE(p);
    CHECK(p->top.empty());
  }
  SECTION("more ranks than asked are cut; a rank without an id is refused") {
    std::string many = R"({"completion_probabilities":[{"top_logprobs":[)";
    for (int i = 0; i < 20; ++i) many += fmt::format("{}{{\"id\":{}}}", i ? "," : "", i);
    many += "]}]}";
    auto p = parse_behaviour_reply(many);
    REQUIRE(p);
    CHECK(p->top.size() == kvp::core::behaviour_ranks);
    auto bad = parse_behaviour_reply(R"({"completion_probabilities":[{"top_logprobs":[{"token":"x"}]}]})");
    REQUIRE_FALSE(bad);
    CHECK(bad.err().code == errc::backend_unsupported);
  }
}

}  // namespace llama_http_backend_test
