// Pins an inference request to a slot (managed multi-slot mode, docs/design.md §14): llama-server
// honours "id_slot" in the JSON body of completion-style endpoints.
#pragma once

#include <string>
#include <string_view>

#include "core/result.hpp"

namespace kvp::core {

// Returns the body with "id_slot": slot and "cache_prompt": true appended before the
// object's closing brace; every other byte stays as the client sent it. A client's own
// id_slot stays too, earlier in the object: llama-server keeps the last of duplicate keys,
// so ours wins. A client's own "cache_prompt": false is kept and wins (no "cache_prompt" is
// appended): the client asked for a fresh evaluation, and the slot still holds its prompt
// afterwards, so what kvpersist knows of the slot stays true (docs/design.md §14). An error (its message fit for the client's 400) when the body is not one
// JSON object that parse_json_bounded accepts, e.g. one nested deeper than json_max_depth:
// the caller refuses such a request in managed mode rather than run it unpinned.
result<std::string> pin_request_body(std::string_view body, int slot);

// The "model" member of a JSON request body, "" when it has none (used for routing to a
// server). Of duplicate "model" keys the last counts, as in llama-server; "" when that one
// is no string. An error (its message fit for the client's 400) when the body is not JSON
// parse_json_bounded accepts: llama-server's parser may still read a model in it (it stops
// at a NUL byte, docs/llama-server.md §14), so a router's request is refused then.
result<std::string> read_request_model(std::string_view body);

// read_request_model's model, "" for a body it cannot read: routes: send such a body where
// they send one without a model, to the first server.
std::string request_model(std::string_view body);

}  // namespace kvp::core
