// Pins an inference request to a slot (managed multi-slot mode, spec §65-66): llama-server
// honours "id_slot" in the JSON body of completion-style endpoints.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvp::core {

// Returns the body with "id_slot": slot and "cache_prompt": true. When the client sent
// neither key, the two members are inserted before the object's closing brace and every
// other byte is kept as the client sent it; otherwise the document is re-serialized with
// those values replaced. nullopt when the body is not a JSON object (forward it unchanged:
// llama-server will reject it the same way).
std::optional<std::string> pin_request_body(std::string_view body, int slot);

// The "model" member of a JSON request body, or "" (used for routing to a server).
std::string request_model(std::string_view body);

}  // namespace kvp::core
