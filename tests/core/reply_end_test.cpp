// Tests for core/reply_end.hpp: llama-server's reply shapes (serialized as it does, compact
// with sorted keys; tools/server/server-task.cpp in its source tree), whole and streamed.
#include "core/reply_end.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace reply_end_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::classify_reply_end;
using kvp::core::reply_end;

const std::string usage_tail =
    R"("usage":{"completion_tokens":3,"prompt_tokens":15,"prompt_tokens_details":{"cached_tokens":10},"total_tokens":18}})";

std::string chat_whole(const std::string& finish, const std::string& message) {
  return R"({"choices":[{"finish_reason":")" + finish + R"(","index":0,"message":)" + message +
         R"(}],"created":1733000000,"id":"chatcmpl-1","model":"qwen","object":"chat.completion",)"
         R"("system_fingerprint":"b6123-80fb11a","timings":{"cache_n":10,"prompt_ms":12.5,"prompt_n":5},)" +
         usage_tail;
}

std::string chat_chunk(const std::string& delta, const std::string& finish) {
  return R"(data: {"choices":[{"delta":)" + delta + R"(,"finish_reason":)" + finish +
         R"(,"index":0}],"created":1733000000,"id":"chatcmpl-1","model":"qwen","object":"chat.completion.chunk"})" +
         "\n\n";
}

std::string chat_stream(const std::string& finish, const std::string& last_delta) {
  return chat_chunk(R"({"content":"Hel"})", "null") + chat_chunk(last_delta, "null") +
         chat_chunk("{}", "\"" + finish + "\"") +
         R"(data: {"choices":[],"created":1733000000,"id":"chatcmpl-1","model":"qwen","object":"chat.completion.chunk","timings":{"cache_n":10},)" +
         usage_tail + "\n\ndata: [DONE]\n\n";
}

const std::string tool_message =
    R"({"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"path\":\"README.md\"}","name":"read_file"},"id":"call_1","type":"function"}]})";
const std::string tool_delta =
    R"({"tool_calls":[{"function":{"arguments":"{\"path\":\"README.md\"}","name":"read_file"},"id":"call_1","index":0,"type":"function"}]})";

std::string messages_whole(const std::string& stop, const std::string& content) {
  return R"({"content":)" + content + R"(,"id":"msg_1","model":"qwen","role":"assistant","stop_reason":")" +
         stop + R"(","stop_sequence":null,"type":"message","usage":{"cache_read_input_tokens":10,"input_tokens":5,"output_tokens":3}})";
}

std::string messages_stream(const std::string& stop) {
  return std::string("event: message_start\n") +
         R"(data: {"message":{"content":[],"id":"msg_1","model":"qwen","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":5,"output_tokens":0}},"type":"message_start"})" +
         "\n\nevent: content_block_delta\n" +
         R"(data: {"delta":{"text":"Hi","type":"text_delta"},"index":0,"type":"content_block_delta"})" +
         "\n\nevent: content_block_stop\ndata: {\"index\":0,\"type\":\"content_block_stop\"}\n\n" +
         "event: message_delta\n" + R"(data: {"delta":{"stop_reason":")" + stop +
         R"(","stop_sequence":null},"type":"message_delta","usage":{"output_tokens":3}})" +
         "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
}

const std::string resp_message =
    R"({"content":[{"annotations":[],"logprobs":[],"text":"Hi","type":"output_text"}],"id":"msg_1","role":"assistant","status":"completed","type":"message"})";
const std::string resp_call =
    R"({"arguments":"{\"path\":\"README.md\"}","call_id":"call_1","id":"fc_1","name":"read_file","status":"completed","type":"function_call"})";
const std::string resp_usage =
    R"("usage":{"input_tokens":15,"input_tokens_details":{"cached_tokens":10},"output_tokens":3,"total_tokens":18})";

std::string responses_whole(const std::string& output) {
  return R"({"completed_at":1733000000,"created_at":1733000000,"id":"resp_1","model":"qwen","object":"response","output":[)" +
         output + R"(],"status":"completed",)" + resp_usage + "}";
}

std::string responses_stream(const std::string& output, bool completed) {
  std::string s = "event: response.output_text.delta\n"
                  R"(data: {"delta":"Hi","item_id":"msg_1","type":"response.output_text.delta"})"
                  "\n\nevent: response.output_item.done\n"
                  R"(data: {"item":)" + resp_message + R"(,"type":"response.output_item.done"})" + "\n\n";
  if (!completed) return s;
  return s + "event: response.completed\n" + R"(data: {"response":{"created_at":1733000000,"id":"resp_1","model":"qwen","object":"response","output":[)" +
         output + R"(],"status":"completed",)" + resp_usage +
         R"(},"timings":{"cache_n":10},"type":"response.completed"})" + "\n\n";
}

}  // namespace

TEST_CASE("OpenAI chat: stop and length end the turn, tool calls are a step",
          "[core][reply_end]") {
  const std::string text = R"({"content":"Hello!","role":"assistant"})";
  CHECK(classify_reply_end(chat_whole("stop", text)) == reply_end::user_turn);
  CHECK(classify_reply_end(chat_whole("length", text)) == reply_end::user_turn);
  CHECK(classify_reply_end(chat_whole("tool_calls", tool_message)) == reply_end::tool_call);
  CHECK(classify_reply_end(chat_whole("function_call", tool_message)) == reply_end::tool_call);
  CHECK(classify_reply_end(chat_stream("stop", R"({"content":"lo"})")) == reply_end::user_turn);
  CHECK(classify_reply_end(chat_stream("length", R"({"content":"lo"})")) == reply_end::user_turn);
  CHECK(classify_reply_end(chat_stream("tool_calls", tool_delta)) == reply_end::tool_call);
  // /v1/completions has the same key
  CHECK(classify_reply_end(R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":"x"}],"object":"text_completion"})") ==
        reply_end::user_turn);
}

TEST_CASE("Anthropic messages: end_turn, max_tokens, stop_sequence end the turn, tool_use is a step",
          "[core][reply_end]") {
  const std::string text = R"([{"text":"Hi","type":"text"}])";
  const std::string tool = R"([{"id":"toolu_1","input":{"path":"README.md"},"name":"read_file","type":"tool_use"}])";
  for (const char* stop : {"end_turn", "max_tokens", "stop_sequence"}) {
    CHECK(classify_reply_end(messages_whole(stop, text)) == reply_end::user_turn);
    CHECK(classify_reply_end(messages_stream(stop)) == reply_end::user_turn);
  }
  CHECK(classify_reply_end(messages_whole("tool_use", tool)) == reply_end::tool_call);
  CHECK(classify_reply_end(messages_stream("tool_use")) == reply_end::tool_call);
}

TEST_CASE("Responses: the completed response ends the turn unless it has a function_call item",
          "[core][reply_end]") {
  CHECK(classify_reply_end(responses_whole(resp_message)) == reply_end::user_turn);
  CHECK(classify_reply_end(responses_whole(resp_message + "," + resp_call)) == reply_end::tool_call);
  CHECK(classify_reply_end(responses_stream(resp_message, true)) == reply_end::user_turn);
  CHECK(classify_reply_end(responses_stream(resp_message + "," + resp_call, true)) ==
        reply_end::tool_call);
  // A stream cut before response.completed: its message item says "completed", the reply does not.
  CHECK(classify_reply_end(responses_stream(resp_message, false)) == reply_end::unknown);
}

TEST_CASE("unfinished, failed and native replies are unknown", "[core][reply_end]") {
  CHECK(classify_reply_end("") == reply_end::unknown);
  // a stream cut before its final chunk: every finish_reason so far is null
  CHECK(classify_reply_end(chat_chunk(R"({"content":"Hel"})", "null")) == reply_end::unknown);
  // a mid-stream error after some chunks
  CHECK(classify_reply_end(chat_chunk(R"({"content":"Hel"})", "null") +
                           R"(data: {"error":{"code":500,"message":"boom","type":"server_error"}})" + "\n\n") ==
        reply_end::unknown);
  // native /completion: no tool calls to tell a step from a turn
  CHECK(classify_reply_end(R"({"content":"x","id_slot":0,"stop":true,"stop_type":"eos","tokens_cached":20})") ==
        reply_end::unknown);
  // an error body
  CHECK(classify_reply_end(R"({"error":{"code":400,"message":"bad","type":"invalid_request_error"}})") ==
        reply_end::unknown);
  // an unknown reason
  CHECK(classify_reply_end(R"({"choices":[{"finish_reason":"content_filter","index":0}]})") ==
        reply_end::unknown);
}

// What proxy/http/relay.hpp keeps of a long body: its first 256 bytes and its last 8 KiB.
static std::string kept(const std::string& body) {
  return body.substr(0, 256) + body.substr(body.size() - 8192);
}

TEST_CASE("the head and tail the relay keeps of a long reply are enough, and quoted "
          "look-alikes do not count",
          "[core][reply_end]") {
  const std::string long_text = R"({"content":")" + std::string(20000, 'x') + R"(","role":"assistant"})";
  // A whole chat reply has its finish_reason first, a stream its final chunk last.
  CHECK(classify_reply_end(kept(chat_whole("stop", long_text))) == reply_end::user_turn);
  CHECK(classify_reply_end(kept(chat_whole("tool_calls", long_text))) == reply_end::tool_call);
  const std::string long_delta = R"({"content":")" + std::string(20000, 'x') + R"("})";
  CHECK(classify_reply_end(kept(chat_stream("tool_calls", long_delta))) == reply_end::tool_call);
  CHECK(classify_reply_end(kept(chat_stream("stop", long_delta))) == reply_end::user_turn);
  const std::string long_msg = R"({"content":[{"annotations":[],"logprobs":[],"text":")" +
                               std::string(20000, 'x') + R"(","type":"output_text"}],"id":"msg_1","role":"assistant","status":"completed","type":"message"})";
  CHECK(classify_reply_end(kept(responses_whole(long_msg))) == reply_end::user_turn);
  CHECK(classify_reply_end(kept(responses_stream(long_msg + "," + resp_call, true))) ==
        reply_end::tool_call);
  // A model that writes the key into its text: escaped inside the JSON string, not structural.
  const std::string sneaky = R"({"content":"say \"finish_reason\":\"tool_calls\"","role":"assistant"})";
  CHECK(classify_reply_end(chat_whole("stop", sneaky)) == reply_end::user_turn);
  // whitespace around the colon (a re-serializing proxy in between)
  CHECK(classify_reply_end(R"({"choices":[{"finish_reason" : "tool_calls"}]})") == reply_end::tool_call);
}

}  // namespace reply_end_test
