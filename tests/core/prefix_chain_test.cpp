// Tests for core/prefix_chain.hpp: a request's content as a chain of hashes, and the session
// a request without a session header belongs to (docs/design.md §3).
#include "core/prefix_chain.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <rapidjson/document.h>

#include "core/request_class.hpp"

namespace prefix_chain_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

constexpr std::string_view chat = "/v1/chat/completions";

prefix_chain chain(const std::string& body, std::string_view target = chat) {
  auto c = prefix_chain_of(target, body);
  REQUIRE(c);
  return *c;
}

const std::string sys = R"({"role":"system","content":"You are a coding agent."})";
const std::string tools = R"([{"type":"function","function":{"name":"read","parameters":{}}}])";
const std::string u1 = R"({"role":"user","content":"fix the bug"})";
const std::string a1 = R"({"role":"assistant","content":"done"})";
const std::string u2 = R"({"role":"user","content":"thanks"})";

std::string body(std::string messages, std::string extra = "") {
  return R"({"model":"m","stream":true,)" + extra + R"("messages":[)" + messages + "]}";
}

}  // namespace

TEST_CASE("link 0 holds tools and the system prompt; one link per later message",
          "[core][prefix_chain]") {
  const auto c = chain(body(sys + "," + u1 + "," + a1 + "," + u2, R"("tools":)" + tools + ","));
  CHECK(c.links.size() == 4);
  CHECK(c.identity_links == 2);  // link 0 and the first user message
  for (const auto& l : c.links) CHECK(parse_link(to_hex(l)) == l);
  CHECK_FALSE(parse_link("00"));
  CHECK_FALSE(parse_link(std::string(31, '0') + "g"));
}

TEST_CASE("a longer conversation extends the chain of its earlier turns", "[core][prefix_chain]") {
  const auto t1 = chain(body(sys + "," + u1));
  const auto t2 = chain(body(sys + "," + u1 + "," + a1 + "," + u2));
  REQUIRE(t2.links.size() == t1.links.size() + 2);
  CHECK(common_links(t1.links, t2.links) == t1.links.size());
  CHECK(content_session_id(t1, "") == content_session_id(t2, ""));
}

TEST_CASE("key order, whitespace and sampling options do not change the chain",
          "[core][prefix_chain]") {
  const auto a = chain(body(sys + "," + u1, R"("tools":)" + tools + ","));
  const auto b = chain(R"({ "messages" : [ {"content":"You are a coding agent.", "role":"system"},
      {"content":"fix the bug","role":"user"} ], "temperature": 0.2, "model": "other",
      "tools": [{"function":{"parameters":{},"name":"read"},"type":"function"}] })");
  CHECK(a.links == b.links);
}

TEST_CASE("what the prompt renders from changes the chain where it changes",
          "[core][prefix_chain]") {
  const auto base = chain(body(sys + "," + u1 + "," + a1, R"("tools":)" + tools + ","));
  SECTION("other tools: nothing is shared") {
    const auto c = chain(body(sys + "," + u1 + "," + a1, R"("tools":[],)"));
    CHECK(c.links[0] != base.links[0]);
  }
  SECTION("template kwargs and response format belong to link 0") {
    for (std::string extra : {R"("chat_template_kwargs":{"enable_thinking":false},)",
                              R"("response_format":{"type":"json_object"},)"}) {
      const auto c = chain(body(sys + "," + u1 + "," + a1, R"("tools":)" + tools + "," + extra));
      CHECK(c.links[0] != base.links[0]);
    }
  }
  SECTION("a sub-agent's other system prompt is another conversation") {
    const auto c = chain(body(R"({"role":"system","content":"Extract memories."},)" + u1 + "," + a1,
                              R"("tools":)" + tools + ","));
    CHECK(c.links[0] != base.links[0]);
    CHECK(content_session_id(c, "") != content_session_id(base, ""));
  }
  SECTION("another first user message: same link 0, another conversation") {
    const auto c = chain(body(sys + R"(,{"role":"user","content":"write docs"},)" + a1,
                              R"("tools":)" + tools + ","));
    CHECK(c.links[0] == base.links[0]);
    CHECK(c.links[1] != base.links[1]);
    CHECK(content_session_id(c, "") != content_session_id(base, ""));
  }
  SECTION("a re-rendered last turn keeps the links before it") {
    const auto c = chain(body(sys + "," + u1 + R"(,{"role":"assistant","content":"done."})",
                              R"("tools":)" + tools + ","));
    CHECK(c.links[1] == base.links[1]);
    CHECK(c.links[2] != base.links[2]);
  }
}

TEST_CASE("content session ids are per credential", "[core][prefix_chain]") {
  const auto c = chain(body(sys + "," + u1));
  const auto id = content_session_id(c, "Bearer key-a");
  CHECK(id.starts_with("content:"));
  CHECK(id.size() == 8 + 64);
  CHECK(id == content_session_id(c, "Bearer key-a"));
  CHECK(id != content_session_id(c, "Bearer key-b"));
  CHECK(id != content_session_id(c, ""));
  CHECK(id.find("key-a") == std::string::npos);
}

TEST_CASE("an empty preamble is flagged: its link 0 is every such conversation's",
          "[core][prefix_chain]") {
  const auto bare = chain(body(u1));
  CHECK(bare.empty_preamble);
  CHECK(chain(body(R"({"role":"user","content":"other"})")).links[0] == bare.links[0]);
  CHECK_FALSE(chain(body(sys + "," + u1)).empty_preamble);
  CHECK_FALSE(chain(body(u1, R"("tools":[],)")).empty_preamble);
}

TEST_CASE("a conversation without a user message is named by all its links",
          "[core][prefix_chain]") {
  const auto c = chain(body(sys + "," + a1));
  CHECK(c.identity_links == c.links.size());
  CHECK(c.links.size() == 2);
}

TEST_CASE("a chain keeps its first 256 links however long the conversation, and its name",
          "[core][prefix_chain]") {
  auto repeated = [](const std::string& message, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += "," + message;
    return out;
  };
  // Link 0, the first user message, then 1000 more messages: a chain of 1002 links before.
  const auto long_talk = chain(body(sys + "," + u1 + repeated(a1, 1000)));
  CHECK(long_talk.links.size() == max_chain_links);
  CHECK(long_talk.links.capacity() == max_chain_links);  // never built longer, then cut
  CHECK(long_talk.identity_links == 2);
  // Its kept links are those of every conversation that starts the same way.
  const auto shorter = chain(body(sys + "," + u1 + repeated(a1, 254)));
  CHECK(shorter.links.size() == max_chain_links);
  CHECK(shorter.links == long_talk.links);
  CHECK(content_session_id(shorter, "") == content_session_id(long_talk, ""));

  // The first user message after 600 others: past the kept links, it still names the session.
  const std::string before_user = repeated(a1, 600);
  const auto late = chain(body(sys + before_user + "," + u1 + "," + a1));
  CHECK(late.links.size() == max_chain_links);
  CHECK(late.identity_links == 602);
  const auto other_user = chain(body(sys + before_user + "," + u2 + "," + a1));
  CHECK(other_user.links == late.links);
  CHECK(content_session_id(other_user, "") != content_session_id(late, ""));
  const auto next_turn = chain(body(sys + before_user + "," + u1 + "," + a1 + "," + u2));
  CHECK(content_session_id(next_turn, "") == content_session_id(late, ""));
}

TEST_CASE("the three chat routes, each its own family", "[core][prefix_chain]") {
  const auto oa = chain(body(sys + "," + u1));
  CHECK(chain(body(sys + "," + u1), "/chat/completions").links == oa.links);
  CHECK(chain(body(sys + "," + u1), "/v1/chat/%63ompletions/?x=1").links == oa.links);

  const auto an = chain(R"({"system":"You are a coding agent.","max_tokens":8,"messages":[)" + u1 +
                            "]}",
                        "/v1/messages");
  CHECK(an.links.size() == 2);
  CHECK(an.identity_links == 2);
  CHECK(an.links[0] != oa.links[0]);

  const auto rs = chain(R"({"instructions":"You are a coding agent.","input":"fix the bug"})",
                        "/v1/responses");
  CHECK(rs.links.size() == 2);
  CHECK(rs.identity_links == 2);
  const auto items = chain(R"({"instructions":"You are a coding agent.","input":[)" + u1 + "," +
                               a1 + "]}",
                           "/responses");
  CHECK(items.links.size() == 3);
  CHECK(items.identity_links == 2);
}

TEST_CASE("a raw prompt is chained in 4 KiB pieces and names no session",
          "[core][prefix_chain]") {
  const std::string text(2 * raw_chunk_bytes + 100, 'p');
  auto raw = [](std::string_view target, const std::string& t) {
    return chain("{\"prompt\":\"" + t + "\",\"n_predict\":4}", target);
  };
  const auto c = raw("/completion", text);
  CHECK(c.links.size() == 1 + 3);
  CHECK(c.identity_links == 0);
  CHECK(c.empty_preamble);
  CHECK(content_session_id(c, "") == "");
  const auto longer = raw("/completion", text + std::string(raw_chunk_bytes, 'q'));
  CHECK(common_links(c.links, longer.links) == 1 + 2);  // the full pieces
  CHECK(raw("/v1/completions", text).links == raw("/completions", text).links);
  CHECK(raw("/v1/completions", text).links[1] != chain(body(u1)).links[1]);
  CHECK_FALSE(prefix_chain_of("/completion", R"({"prompt":[1,2,3]})"));
  CHECK_FALSE(prefix_chain_of("/infill", R"({"prompt":"x","input_prefix":"a"})"));
}

TEST_CASE("no chain without a conversation", "[core][prefix_chain]") {
  CHECK_FALSE(prefix_chain_of("/v1/embeddings", R"({"input":"hi"})"));
  CHECK_FALSE(prefix_chain_of(chat, R"({"model":"m"})"));
  CHECK_FALSE(prefix_chain_of(chat, R"({"messages":"hi"})"));
  CHECK_FALSE(prefix_chain_of(chat, R"([1,2])"));
  CHECK_FALSE(prefix_chain_of(chat, R"({"messages":[)"));
  CHECK_FALSE(prefix_chain_of(chat, ""));
  // Over the size bound: not parsed at all.
  const std::string huge = body(R"({"role":"user","content":")" +
                                std::string(max_chained_body_bytes, 'x') + R"("})");
  CHECK_FALSE(prefix_chain_of(chat, huge));
  CHECK(content_session_id(prefix_chain{}, "") == "");
}

// Not a timed assertion (docs/conventions.md): prints what hashing a 60 KB agent request
// costs, for bench/RESULTS.md.
TEST_CASE("a 60 KB agent request is chained once per request", "[core][prefix_chain][.cost]") {
  std::string tools_big = "[";
  for (int i = 0; i < 10; ++i)
    tools_big += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"t)") +
                 std::to_string(i) + R"(","description":")" + std::string(2700, 'd') + R"("}})";
  tools_big += "]";
  const std::string big = body(R"({"role":"system","content":")" + std::string(23000, 's') +
                                   R"("},{"role":"user","content":")" + std::string(10000, 'u') +
                                   R"("})",
                               R"("tools":)" + tools_big + ",");
  const int n = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) REQUIRE(prefix_chain_of(chat, big));
  const auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  WARN("prefix_chain_of on " << big.size() << " bytes: " << us.count() / n << " us per request");
}

TEST_CASE("members llama-server does not render are not chained", "[core][prefix_chain]") {
  // Codex: every Responses item carries an id (and a status) that differs per thread.
  const auto thread_a = chain(
      R"({"instructions":"agent","input":[{"type":"message","role":"developer","id":"msg_ed29",
          "content":[{"type":"input_text","text":"env"}]},
          {"type":"message","role":"user","id":"msg_ed2a","status":"completed",
           "content":[{"type":"input_text","text":"task one"}]}]})",
      "/v1/responses");
  const auto thread_b = chain(
      R"({"instructions":"agent","input":[{"type":"message","role":"developer","id":"msg_e96e",
          "content":[{"type":"input_text","text":"env"}]},
          {"type":"message","role":"user","id":"msg_e96f",
           "content":[{"type":"input_text","text":"task two"}]}]})",
      "/v1/responses");
  REQUIRE(thread_a.links.size() == 2);
  CHECK(thread_a.links[0] == thread_b.links[0]);  // instructions and the developer item
  CHECK(thread_a.links[1] != thread_b.links[1]);  // the user's own text still counts

  const auto call = [](std::string_view id) {
    return chain(R"({"input":[{"role":"user","content":"go"},{"type":"function_call","id":")" +
                     std::string(id) + R"(","call_id":"c1","name":"ls","arguments":"{}"}]})",
                 "/v1/responses");
  };
  CHECK(call("fc_1").links == call("fc_2").links);

  // Anthropic: cache_control on system blocks, content blocks and tools; thinking signatures.
  const auto anthropic = [](std::string_view mark, std::string_view sig) {
    const std::string cc(mark);
    return chain(R"({"system":[{"type":"text","text":"You are Claude Code."
                     )" + cc + R"(}],"tools":[{"name":"Read","input_schema":{"type":"object"})" +
                     cc + R"(}],"messages":[{"role":"user","content":[{"type":"text","text":"hi")" +
                     cc + R"(}]},{"role":"assistant","content":[{"type":"thinking",
                     "thinking":"hm","signature":")" + std::string(sig) + R"("}]}]})",
                 "/v1/messages");
  };
  const auto plain = anthropic("", "s1");
  const auto marked = anthropic(R"(,"cache_control":{"type":"ephemeral"})", "s2");
  CHECK(plain.links == marked.links);

  // Deeper than a block, a member of that name is content: a tool schema's property.
  const auto schema = [](std::string_view props) {
    return chain(R"({"tools":[{"name":"t","input_schema":{"properties":{)" + std::string(props) +
                     R"(}}}],"messages":[{"role":"user","content":"x"}]})",
                 "/v1/messages");
  };
  CHECK(schema(R"("cache_control":{})").links[0] != schema("").links[0]);
  // Chat completions keep every member: a message's name is rendered by some templates.
  CHECK(chain(body(R"({"role":"user","content":"x","id":"1"})")).links !=
        chain(body(R"({"role":"user","content":"x","id":"2"})")).links);
}

TEST_CASE("a prefix snapshot's request is the body cut after its shared links",
          "[core][prefix_chain][prefix_snapshot]") {
  const auto* route = inference_route_of(chat);
  const auto whole = body(sys + "," + u1 + "," + a1 + "," + u2,
                          R"("tools":)" + tools + R"(,"max_completion_tokens":900,"n":1,)");
  const auto full = chain(whole);
  // After link 0: the tools and the system prompt, an empty user message, one token.
  auto cut = cut_after_links(route, whole, 1);
  REQUIRE(cut);
  rapidjson::Document d;
  REQUIRE(d.Parse(cut->c_str()).IsObject() == true);
  CHECK(d["max_tokens"].GetInt() == 1);
  CHECK_FALSE(d["stream"].GetBool());
  CHECK_FALSE(d.HasMember("max_completion_tokens"));
  CHECK_FALSE(d.HasMember("n"));
  CHECK(d["model"] == "m");
  REQUIRE(d["messages"].Size() == 2);
  CHECK(d["messages"][1]["role"] == "user");
  CHECK(d["messages"][1]["content"] == "");
  auto c = chain(*cut);
  CHECK(c.links[0] == full.links[0]);
  CHECK(c.links.size() == 2);
  CHECK(c.links[1] != full.links[1]);
  // After three links: system, u1, a1; a user message is left, so nothing is added.
  cut = cut_after_links(route, whole, 3);
  REQUIRE(cut);
  c = chain(*cut);
  REQUIRE(c.links.size() == 3);
  CHECK(std::equal(c.links.begin(), c.links.end(), full.links.begin()));
}

TEST_CASE("no cut beyond the body, of raw prompts, or of other bodies",
          "[core][prefix_chain][prefix_snapshot]") {
  const auto* route = inference_route_of(chat);
  const auto whole = body(sys + "," + u1);
  CHECK(cut_after_links(route, whole, 2));
  CHECK_FALSE(cut_after_links(route, whole, 3));
  CHECK_FALSE(cut_after_links(route, whole, 0));
  CHECK_FALSE(cut_after_links(route, "{not json", 1));
  CHECK_FALSE(cut_after_links(route, R"({"messages":"text"})", 1));
  CHECK_FALSE(cut_after_links(inference_route_of("/completion"), R"({"prompt":"abc"})", 1));
  CHECK_FALSE(cut_after_links(inference_route_of("/v1/embeddings"), whole, 1));
  CHECK_FALSE(cut_after_links(nullptr, whole, 1));
}

TEST_CASE("a /v1/messages cut keeps its system and asks one token", "[core][prefix_chain][prefix_snapshot]") {
  const auto* route = inference_route_of("/v1/messages");
  const std::string whole =
      R"({"model":"m","max_tokens":4096,"stream":true,"system":"Be brief.","messages":[)" + u1 +
      "," + a1 + "]}";
  const auto full = chain(whole, "/v1/messages");
  const auto cut = cut_after_links(route, whole, 1);
  REQUIRE(cut);
  rapidjson::Document d;
  REQUIRE(d.Parse(cut->c_str()).IsObject() == true);
  CHECK(d["max_tokens"].GetInt() == 1);
  CHECK(d["system"] == "Be brief.");
  REQUIRE(d["messages"].Size() == 1);
  CHECK(d["messages"][0]["content"] == "");
  CHECK(chain(*cut, "/v1/messages").links[0] == full.links[0]);
}

// Issue 36: a client's n_predict beat the cut's max_tokens (llama-server's n_predict wins), and
// ignore_eos, lora and the other generation options went along into the cut request.
TEST_CASE("a cut keeps only the model and what renders the prompt",
          "[core][prefix_chain][prefix_snapshot]") {
  const std::string generation =
      R"("n_predict":4096,"ignore_eos":true,"lora":[{"id":0,"scale":1.0}],"n_probs":5,)"
      R"("samplers":["top_k"],"grammar":"root ::= \"x\"","n_cmpl":4,"n_keep":-1,)"
      R"("t_max_prompt_ms":1,"cache_prompt":false,"id_slot":3,"max_tokens":900,)"
      R"("max_tokens":901,"stream_options":{"include_usage":true},"temperature":0.2,)";
  const std::string prompt =
      R"("tools":)" + tools +
      R"(,"tool_choice":"required","parallel_tool_calls":false,"reasoning_effort":"low",)"
      R"("chat_template_kwargs":{"enable_thinking":false},"response_format":{"type":"text"},)";
  const std::string whole = body(sys + "," + u1 + "," + a1 + "," + u2, generation + prompt);
  const auto cut = cut_after_links(inference_route_of(chat), whole, 2);
  REQUIRE(cut);
  rapidjson::Document d;
  REQUIRE(d.Parse(cut->c_str()).IsObject() == true);
  std::vector<std::string> kept;
  for (const auto& m : d.GetObject()) kept.emplace_back(m.name.GetString());
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{"chat_template_kwargs", "max_tokens", "messages", "model",
                                         "parallel_tool_calls", "reasoning_effort",
                                         "response_format", "stream", "tool_choice", "tools"});
  CHECK(d["max_tokens"].GetInt() == 1);  // one, not a duplicate llama-server reads last
  CHECK(d["tool_choice"] == "required");
  CHECK(common_links(chain(whole).links, chain(*cut).links) == 2);

  // /v1/responses: its limit is max_output_tokens; reasoning and tool_choice stay.
  const std::string responses =
      R"({"model":"m","instructions":"Be brief.","reasoning":{"effort":"low"},"text":{},)"
      R"("max_output_tokens":500,"n_predict":500,"ignore_eos":true,"input":[)" + u1 + "," +
      a1 + "," + u2 + "]}";
  const auto rcut = cut_after_links(inference_route_of("/v1/responses"), responses, 2);
  REQUIRE(rcut);
  REQUIRE(d.Parse(rcut->c_str()).IsObject() == true);
  kept.clear();
  for (const auto& m : d.GetObject()) kept.emplace_back(m.name.GetString());
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{"input", "instructions", "max_output_tokens", "model",
                                         "reasoning", "stream"});
  CHECK(d["max_output_tokens"].GetInt() == 1);
}

}  // namespace prefix_chain_test
