// Untrusted JSON (client bodies, llama-server's replies, manifests, admin replies) is parsed
// only through parse_json_bounded, so no call site can forget its limits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <rapidjson/document.h>

#include "core/result.hpp"

namespace kvp::core {

// Deepest nesting of arrays and objects accepted (the root container is level 1). Deeper
// text is refused before anything recursive can see it: RapidJSON's Writer, Accept and deep
// copies recurse once per level.
inline constexpr int json_max_depth = 128;

// Largest count (tokens, bytes, revisions) taken from outside: 2^53, the integers every JSON
// reader keeps exactly. Counters start from such values and only ever add one per turn.
inline constexpr std::uint64_t json_max_count = std::uint64_t{1} << 53;

// Parses `text` (one JSON value, nothing after it but whitespace) into `d` with RapidJSON's
// iterative parser, which uses no stack per level, and refuses nesting deeper than
// json_max_depth and NUL bytes (RapidJSON would take one as the end of the text). The error
// (errc::invariant: callers map it to their own) says why, for logs and 400 bodies.
result<unit> parse_json_bounded(std::string_view text, rapidjson::Document& d);
// The same for a std::string, whose terminating NUL lets RapidJSON scan with SIMD where the
// build enables it (RAPIDJSON_SSE2 on x86-64, see CMakeLists.txt): about 8x faster on long
// strings, which is what agent requests are made of.
result<unit> parse_json_bounded(const std::string& text, rapidjson::Document& d);
inline result<unit> parse_json_bounded(const char* text, rapidjson::Document& d) {
  return parse_json_bounded(std::string_view(text), d);
}

// Whether `body`, when it looks like JSON (its first byte past whitespace is '{' or '['),
// nests arrays and objects deeper than `max_depth`. A byte scan, not a parse: strings are
// skipped with memchr, so it costs about one read of the body. llama-server's JSON parser
// recurses once per level and crashes on a few hundred thousand, so such a body is refused
// before it is forwarded, whatever the mode.
bool json_nesting_exceeds(std::string_view body, int max_depth = json_max_depth);

// `v` as a count: an integer in [0, json_max_count], else nullopt.
std::optional<std::uint64_t> json_count(const rapidjson::Value& v);

}  // namespace kvp::core
