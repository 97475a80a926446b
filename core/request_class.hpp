// Which requests take the slot. Pure functions over the request target and header values.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/prefix_chain.hpp"
#include "core/resumable_stream.hpp"

namespace kvp::core {

enum class endpoint_kind {
  inference,    // runs on a slot: goes through the coordinator
  slots,        // /slots*: owned by kvpersist, refused for clients
  passthrough,  // /health, /props, /v1/models, /tokenize, ...: forwarded without a lease
};

// How an inference route's body carries its conversation (core/prefix_chain.cpp reads it).
enum class body_format {
  none,       // no conversation kvpersist reads (infill, embeddings, rerank, audio, /api/generate)
  prompt,     // "prompt": /completion and its aliases
  chat,       // OpenAI chat "messages"
  messages,   // Anthropic Messages "messages"
  responses,  // OpenAI Responses "input"
};

// One row of the route table: every llama-server route that creates a slot task
// (tools/server/server.cpp routes), the one list request_class and prefix_chain read.
struct inference_route {
  std::string_view path;
  bool pinnable;  // llama-server honours "id_slot" there (docs/llama-server.md §4)
  body_format format;
};

// Every row of the route table, for tests that must cover each route (tests/core/slot_door_test.cpp).
std::span<const inference_route> inference_route_table();

// The route table's row for the decoded path of `target`, nullptr when it is no inference
// route (exact paths only).
const inference_route* inference_route_of(std::string_view target);

// Percent-decodes a URL path the way llama-server's cpp-httplib does before routing
// (%2F becomes '/'); malformed escapes are kept as they are.
std::string decode_path(std::string_view path);

// A query key or value as cpp-httplib decodes it for llama-server's get_param: %XX and '+'
// as a space (no %uXXXX, unlike a path); malformed escapes are kept as they are.
std::string decode_query_component(std::string_view component);

// The query parameter `name` of `target` as llama-server's get_param reads it
// (tools/server/server-http.cpp get_params, docs/llama-server.md §9): the fragment dropped,
// keys decoded like values (so "?%6Dodel=x" names the model), a pair repeated verbatim read
// once, and of several pairs with the key the last one counts. nullopt when absent; a
// parameter without '=' has the value "".
std::optional<std::string> query_param(std::string_view target, std::string_view name);

// The path llama-server routes `target` to. Its HTTP library percent-decodes the path
// before routing, so classify what it will route, or "/%73lots/0" would reach the slot API
// and "/v1/chat/%63ompletions" would run on the slot without a lease. The query is dropped
// and a trailing slash collapsed, so "/v1/chat/completions/" is not a way around the lease.
std::string routed_path(std::string_view target);

// A request as kvpersist routes it, decided once from its method and target and carried
// through the request path (proxy/data/server.cpp), so that the target is decoded once.
// Exact paths only: "/v1/chat/completions/x" is passthrough (llama-server answers 404 to it).
struct request_class {
  std::string path;  // routed_path(target)
  endpoint_kind kind = endpoint_kind::passthrough;
  const inference_route* route = nullptr;  // the route table's row (inference paths only)
  // POST on an inference path: the request runs on a slot, so it goes through the
  // coordinator. llama-server registers its inference routes for POST only; an OPTIONS (a
  // browser's CORS preflight), GET or HEAD there never creates a slot task (llama-server
  // answers the preflight itself, the rest with 404), so it passes straight through.
  bool needs_slot = false;
  // POST /lora-adapters: it changes the runtime's identity while the process stays (the
  // adapters' scales), so the fingerprint must be read again afterwards.
  bool changes_runtime = false;
  stream_route stream = stream_route::none;  // a resumable-stream route (resumable_stream.hpp)

  // An inference route whose requests llama-server cannot pin to a slot: it ignores
  // "id_slot" there (docs/llama-server.md §4), so in managed multi-slot mode they need the
  // whole server.
  bool unpinnable() const { return route && !route->pinnable; }
  // llama-server's Vertex AI prediction route `predict_route` (AIP_PREDICT_ROUTE, "/predict"
  // by default; "" = none). See proxy/data/server.cpp for why kvpersist refuses it.
  bool is_prediction(std::string_view predict_route) const {
    return !predict_route.empty() && path == predict_route;
  }
};

// Methods are case-sensitive (RFC 9110 §9.1); cpp-httplib matches "POST" exactly.
request_class classify(std::string_view method, std::string_view target);

// llama-server's API-key check (tools/server/server-http.cpp, middleware_validate_api_key),
// mirrored: the key is the Authorization header's value, or X-Api-Key's when Authorization
// is empty, with a leading "Bearer " (exactly that spelling) removed. Compared in constant
// time (SHA-256 of both sides), so a wrong key's prefix length cannot be timed.
bool client_key_matches(std::string_view authorization, std::string_view x_api_key,
                        std::string_view api_key);

// What a harness's own header says (docs/design.md §20, README "Harnesses"): the value that
// decides, or "" when the header does not match. `field` names a string member of a JSON
// object value ("" = the value itself); `values` lists the values that match (empty: any);
// a non-empty `prefix` matches only values that begin with it and go on after it
// (case-sensitive: `title-` matches `title-s1`, not `titles-1`, `Title-s1` or `title-`).
std::string harness_header_value(std::string_view header_value, std::string_view field,
                                 const std::vector<std::string>& values,
                                 std::string_view prefix);

// The sub-session of `session_id` that `tag` names: "<id>#<tag>", a long tag hashed to 16
// hex digits so that the id stays bounded.
std::string sub_session_id(std::string_view session_id, std::string_view tag);

// The request's session: `session_id` empty means none was given.
struct request_identity {
  std::string session_id;
  std::string purpose;  // non-empty marks an auxiliary call (session-title, compaction, ...)
  // Seeding (docs/design.md §3): the request's prefix chain (empty: none, or not needed)
  // and credential_key() of its credential.
  std::vector<chain_link> chain;
  std::string credential;
  // Links a candidate must share to be worth offering: 2 when link 0 is an empty preamble.
  std::size_t min_shared_links = 1;
};

}  // namespace kvp::core
