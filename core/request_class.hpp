// Which requests take the slot. Pure functions over the request target and header values.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvp::core {

enum class endpoint_kind {
  inference,    // runs on a slot: goes through the coordinator
  slots,        // /slots*: owned by kvpersist, refused for clients
  passthrough,  // /health, /props, /v1/models, /tokenize, ...: forwarded without a lease
};

// Percent-decodes a URL path the way llama-server's cpp-httplib does before routing
// (%2F becomes '/'); malformed escapes are kept as they are.
std::string decode_path(std::string_view path);

// Classifies by the decoded path (query string ignored). Exact paths only, so "/v1/chat/completions/x"
// is passthrough (llama-server answers 404 to it anyway).
endpoint_kind classify_target(std::string_view target);

// Inference endpoints whose requests llama-server cannot pin to a slot: it ignores
// "id_slot" for them (llama-server.md §4.1), so in managed multi-slot mode they need the
// whole server.
bool is_unpinnable(std::string_view target);

// The request's session: `session_id` empty means none was given.
struct request_identity {
  std::string session_id;
  std::string purpose;  // non-empty marks an auxiliary call (session-title, compaction, ...)
};

}  // namespace kvp::core
