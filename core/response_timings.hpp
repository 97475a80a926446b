// What a llama-server reply says about its prompt: how many prompt tokens it reused from the
// slot's KV, how many it computed and how long that took. Read from the bytes the relay kept
// of the body (proxy/http/relay.hpp: its first KiB and its last 8-16 KiB), in every API family:
// docs/llama-server.md §12 lists where each puts the reused count.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvp::core {

struct response_timings {
  std::int64_t cache_n = -1;   // prompt tokens reused; -1: the reply did not say
  std::int64_t prompt_n = -1;  // prompt tokens computed (timings only)
  double prompt_ms = -1;       // time spent on them (timings only)
};

// `kept`: the head and tail of a JSON body or an SSE stream. The last report wins (a stream's
// final event carries the request's totals). The reused count comes from `timings.cache_n`,
// else Messages' `cache_read_input_tokens`, else the OpenAI `cached_tokens` (chat
// `prompt_tokens_details`, Responses `input_tokens_details`). Values that are not
// non-negative numbers below 2^53 are ignored.
response_timings parse_response_timings(std::string_view kept);

}  // namespace kvp::core
