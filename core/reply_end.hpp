// Whether a model reply hands the conversation back to the user (a turn end) or asks the
// harness to run tools and call the model again (a step). Read from the last bytes of the
// response body, streamed or not, for the three reply shapes llama-server speaks:
//
//   OpenAI chat / completions  "finish_reason": stop | length        (tool_calls, function_call: a step)
//   Anthropic /v1/messages     "stop_reason": end_turn | max_tokens | stop_sequence  (tool_use: a step)
//   Responses /v1/responses    the completed response ("type":"response.completed" when streamed,
//                              "status":"completed" when not) without a "function_call" item
//
// The last non-null finish/stop reason wins (a stream repeats the key as null in every chunk
// before the final one). A body that ends before any of these (an error, a cut stream, a
// native /completion reply) is `unknown`. Pure: no I/O, bounded by the input.
#pragma once

#include <string_view>

namespace kvp::core {

enum class reply_end { unknown, user_turn, tool_call };
std::string_view to_string(reply_end e);

reply_end classify_reply_end(std::string_view body_tail);

}  // namespace kvp::core
