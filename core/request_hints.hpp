// What a request shows about why a new conversation could not start warm, for the user to fix
// on the harness's side (README "Harnesses"): kvpersist never rewrites a prompt, it only says
// what keeps seeding and a kept slot (docs/design.md §3, §20) from helping. Pure functions.
#pragma once

#include <rapidjson/document.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvp::core {

// A hint as every report words it: the log event, /kv/status, /metrics, the dashboard and
// `kvpersist doctor`.
struct request_hint {
  std::string_view id;      // the log event's (kv.hint.<id>) and the metric label's name
  std::string_view effect;  // what it costs
  std::string_view fix;     // the setting that fixes it
};

enum class hint_id : std::size_t { attribution_header, count };
inline constexpr std::size_t hint_count = static_cast<std::size_t>(hint_id::count);

// Claude Code puts an attribution block first in every /v1/messages `system`:
// "x-anthropic-billing-header: cc_version=...;" with a value per conversation, so two
// conversations share no token prefix.
inline constexpr std::string_view attribution_header_prefix = "x-anthropic-billing-header:";

const request_hint& hint_text(hint_id h);
// The hint named `id` (request_hint::id), if there is one.
std::optional<hint_id> find_request_hint(std::string_view id);

// Whether `body`, sent to `target`, is a /v1/messages request whose system part starts with
// attribution_header_prefix: the text of the first block when `system` is an array, the
// string itself when it is one. Cheap for other requests: the route is checked first, then
// the body is searched for the prefix, and only a body holding it is parsed (bounded; one over
// max_chained_body_bytes is not). A body that does not parse says nothing: false.
bool has_attribution_header(std::string_view target, const std::string& body);
// The same check on a /v1/messages body already parsed (core/prefix_chain.cpp does it while
// chaining, so a chained request is not parsed a second time).
bool opens_with_attribution_block(const rapidjson::Value& body);

}  // namespace kvp::core
