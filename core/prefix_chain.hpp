// A request's prompt as a chain of hashes (docs/design.md §3): what kvpersist knows of a
// request's content without tokenizing it. Each link hashes the link before it and one
// element of the request's canonical content, in the order llama-server renders the prompt:
//
//   link 0    the preamble: the options that change the rendered prompt (tools, functions,
//             response format, template kwargs) and the system part (leading system or
//             developer messages; /v1/messages' `system`; /v1/responses' `instructions`)
//   link 1..  one message (or input item) each, in order
//
// A raw prompt (/completion) is chained as an empty link 0 and one link per 4 KiB of its text.
//
// Two requests share their first k links exactly when their first k elements are equal, so
// a chain names every prefix of a conversation. Elements are hashed as canonical JSON
// (object members sorted by name, no insignificant whitespace), so a harness that reorders
// keys or re-indents its body still matches itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::core {

// One link: the first 128 bits of a SHA-256.
using chain_link = std::array<std::uint8_t, 16>;

// 32 hex digits, and back (nullopt unless exactly 32 hex digits).
std::string to_hex(const chain_link& link);
std::optional<chain_link> parse_link(std::string_view hex);

// Links two chains have in common from the start.
std::size_t common_links(const std::vector<chain_link>& a, const std::vector<chain_link>& b);

struct prefix_chain {
  // The first max_chain_links links: nothing compares a later one (manifests and the
  // chain index keep as many), so a longer conversation is not kept in memory.
  std::vector<chain_link> links;
  // Links that name the conversation: the preamble and every message up to and including
  // the first user message (all links when there is none). May exceed links.size().
  std::size_t identity_links = 0;
  chain_link named{};  // the last of them, which names the conversation (content_session_id)
  // No tools, options or system part: link 0 is the same for every such conversation of a
  // route and says nothing about its content.
  bool empty_preamble = false;
  // A /v1/messages body that opens with Claude Code's per-conversation attribution block
  // (core/request_hints.hpp): told to the user, read here so the body is parsed once.
  bool attribution_block = false;
  // Links another request's chain must share with this one to say anything about content.
  std::size_t min_shared_links() const { return empty_preamble ? 2 : 1; }
};

// Bodies larger than this are not chained: parsing one builds a document about its size, and
// such bodies carry media more than text. 8 MiB is about 2M tokens of text. Parses run one
// at a time per I/O thread (nothing suspends inside), so this bounds their memory too.
inline constexpr std::size_t max_chained_body_bytes = std::size_t{8} << 20;

// A raw prompt (/completion, /completions, /v1/completions with a string `prompt`) is
// chained in pieces of this many bytes.
inline constexpr std::size_t raw_chunk_bytes = 4096;
// The links a chain keeps, in a request, a session's record, a manifest and the chain index.
inline constexpr std::size_t max_chain_links = 256;

// The chain of a POST to an inference route (`target` as the client sent it) with `body`:
// chat completions, /v1/messages, /v1/responses (identity_links > 0), and raw prompts
// (identity_links 0: they name no conversation). nullopt for other routes (infill,
// embeddings, rerank), for a body over max_chained_body_bytes, and for a body that is not a
// JSON object of that route's shape.
std::optional<prefix_chain> prefix_chain_of(std::string_view target, const std::string& body);
// The same for a request already classified (request_class.hpp): `route` is its row of the
// route table, nullptr for a path that is no inference route.
struct inference_route;
std::optional<prefix_chain> prefix_chain_of(const inference_route* route, const std::string& body);

// The body of a request that makes a prefix snapshot (docs/design.md §3, "Prefix snapshots"):
// `body` (a chat completions, /v1/messages or /v1/responses request with a message list) cut
// after its first `links` links, keeping only its model and what llama-server renders the
// prompt from (preamble, template options), asking for one token, not streamed. A cut that
// leaves no user message gets an empty one, which templates require and which renders after
// the prefix, so llama-server keeps the prefix and evaluates a few tokens more. nullopt when
// the body is no such request, has fewer links, or when the cut body's chain would not start
// with exactly those `links` links.
std::optional<std::string> cut_after_links(const inference_route* route, const std::string& body,
                                           std::size_t links);

// The session id a request without a session header gets (`sessions.unmanaged: content`):
// a hash of its conversation's identity links and the caller's credential (the
// Authorization value, else X-Api-Key's; "" when none), so equal conversations of two
// credentials stay two sessions. "content:" and 64 hex digits.
std::string content_session_id(const prefix_chain& chain, std::string_view credential);

// What identifies a credential (the Authorization value, else X-Api-Key's, without a leading
// "Bearer ") in manifests and in the sharing scope's checks: 32 hex digits of a SHA-256, ""
// for none.
std::string credential_key(std::string_view credential);

// Whether `session_id` was made by content_session_id.
inline bool is_content_session(std::string_view session_id) {
  return session_id.starts_with("content:");
}

}  // namespace kvp::core
