// Resumable streams through kvpersist (docs/design.md §21). llama-server keeps generating
// after a client disconnect when the request carries X-Conversation-Id, buffers the stream,
// and replays it (GET /v1/stream?conv_id=...&from=N), stops it (DELETE /v1/stream?conv_id=...)
// and lists it (POST /v1/streams/lookup {"conversation_ids": [...]}) for whoever names the id
// (docs/llama-server.md §6). Ids are chosen by clients, so kvpersist namespaces them per
// credential: llama-server sees a hash of the credential and the id, and one key can neither
// read, stop nor replace another key's stream. Pure functions; the proxy applies them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvp::core {

inline constexpr std::string_view conversation_header = "X-Conversation-Id";

enum class stream_route {
  none,
  replay,  // GET /v1/stream
  stop,    // DELETE /v1/stream
  lookup,  // POST /v1/streams/lookup
};

// Which of llama-server's resumable-stream routes a `method` request to the routed `path`
// (request_class.hpp's routed_path) reaches; request_class.hpp's classify calls it.
stream_route stream_route_of(std::string_view method, std::string_view path);

// The conversation id llama-server sees for a client's `conversation_id` under
// `credential` (a credential_key(): "" for none): "kvp-" and 32 hex digits.
std::string upstream_conversation_id(std::string_view credential, std::string_view conversation_id);

// `target` with the value of every conv_id query parameter (decoded as llama-server decodes
// a query: %XX and '+') replaced by its upstream_conversation_id, and the first of those ids
// ("" when there is none). Other parameters and the path are kept byte for byte.
struct namespaced_target {
  std::string target;
  std::string conversation;
};
namespaced_target namespace_stream_target(std::string_view target, std::string_view credential);

// A lookup body with each of its conversation ids namespaced, and the way back.
struct namespaced_lookup {
  std::string body;
  std::vector<std::pair<std::string, std::string>> upstream_to_client;
};

// The lookup body llama-server gets for a client's `body`; nullopt when it is not a JSON
// object with a "conversation_ids" array of at most `max_ids` strings (the caller answers 400,
// as llama-server would to a body it cannot read).
std::optional<namespaced_lookup> namespace_lookup(std::string_view body, std::string_view credential,
                                                  std::size_t max_ids = 256);

// llama-server's lookup reply (a JSON array of objects with "conversation_id", which is an
// upstream id or one followed by "::<model>") with each id given back as the client named
// it. Entries whose id the client did not name are dropped. nullopt when the reply does not
// parse as such an array.
std::optional<std::string> client_lookup_reply(std::string_view reply, const namespaced_lookup& lookup);

}  // namespace kvp::core
