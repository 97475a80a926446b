// The behavioural fingerprint (docs/design.md §4): what a model answers to a fixed tiny
// prompt. Metadata cannot tell two models apart whose weights differ but whose file size,
// tensor shapes and chat template are identical; their next-token rankings can.
//
// A signature is the ids of the probe's most likely next tokens, most likely first. Two
// probes of the same runtime may disagree in the last ranks (batching, GPU nondeterminism),
// so signatures are compared by overlap, never byte for byte, and a runtime's behaviour is
// named by the first signature recorded for it (its "class").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::core {

// The prompt and the number of ranks kvpersist asks for.
inline constexpr std::string_view behaviour_prompt =
    "kvpersist runtime check. The quick brown fox jumps over the lazy dog; 1, 2, 3,";
inline constexpr std::size_t behaviour_ranks = 8;
// A signature file keeps at most this many classes per metadata fingerprint.
inline constexpr std::size_t max_behaviour_classes = 8;

struct behaviour_signature {
  std::vector<std::int64_t> top;  // token ids, most likely first; empty: the server cannot tell
};

// The same model: the most likely token agrees, or at least half of the ranks are shared.
bool same_behaviour(const behaviour_signature& a, const behaviour_signature& b);

// 16 hex digits naming the class a signature founds; part of the runtime fingerprint.
std::string behaviour_class_id(const behaviour_signature& s);

// The class among `known` that `probe` belongs to, or nullopt (another model, or noise).
std::optional<std::string> match_behaviour(const std::vector<behaviour_signature>& known,
                                           const behaviour_signature& probe);

}  // namespace kvp::core
