#include "core/reply_end.hpp"

#include <array>
#include <optional>

namespace kvp::core {

std::string_view to_string(reply_end e) {
  switch (e) {
    case reply_end::unknown: return "unknown";
    case reply_end::user_turn: return "user_turn";
    case reply_end::tool_call: return "tool_call";
  }
  return "unknown";
}

namespace {

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Visits the string value of every `"key": "value"` in `s`, last first, until `f` returns
// true; null values (and values cut off by the end of `s`) are skipped. Keys never occur
// unescaped inside JSON strings, so a match is structural.
template <class F>
bool any_string_value(std::string_view s, std::string_view key, F f) {
  for (std::size_t end = s.size(); end > 0;) {
    const auto at = s.rfind(key, end - 1);
    if (at == std::string_view::npos) return false;
    end = at;
    std::size_t i = at + key.size();
    while (i < s.size() && json_space(s[i])) ++i;
    if (i >= s.size() || s[i] != ':') continue;
    ++i;
    while (i < s.size() && json_space(s[i])) ++i;
    if (i >= s.size() || s[i] != '"') continue;
    const auto close = s.find('"', i + 1);
    if (close == std::string_view::npos) continue;
    if (f(s.substr(i + 1, close - i - 1))) return true;
  }
  return false;
}

std::optional<std::string_view> last_string_value(std::string_view s, std::string_view key) {
  std::optional<std::string_view> out;
  any_string_value(s, key, [&](std::string_view v) {
    out = v;
    return true;
  });
  return out;
}

bool has_pair(std::string_view s, std::string_view key, std::string_view value) {
  return any_string_value(s, key, [&](std::string_view v) { return v == value; });
}

template <std::size_t N>
bool one_of(std::string_view v, const std::array<std::string_view, N>& set) {
  for (auto x : set)
    if (v == x) return true;
  return false;
}

}  // namespace

reply_end classify_reply_end(std::string_view tail) {
  static constexpr std::array<std::string_view, 2> oai_user{"stop", "length"};
  static constexpr std::array<std::string_view, 2> oai_tool{"tool_calls", "function_call"};
  static constexpr std::array<std::string_view, 3> anthropic_user{"end_turn", "max_tokens",
                                                                   "stop_sequence"};
  if (auto v = last_string_value(tail, "\"finish_reason\"")) {
    if (one_of(*v, oai_user)) return reply_end::user_turn;
    if (one_of(*v, oai_tool)) return reply_end::tool_call;
    return reply_end::unknown;
  }
  if (auto v = last_string_value(tail, "\"stop_reason\"")) {
    if (one_of(*v, anthropic_user)) return reply_end::user_turn;
    if (*v == "tool_use") return reply_end::tool_call;
    return reply_end::unknown;
  }
  // Responses: a stream's events are typed "response.*" and only the last one says it is
  // complete; a whole reply is one response object whose status says so.
  const bool streamed = any_string_value(
      tail, "\"type\"", [](std::string_view v) { return v.starts_with("response."); });
  const bool complete = streamed ? has_pair(tail, "\"type\"", "response.completed")
                                 : has_pair(tail, "\"status\"", "completed");
  if (!complete) return reply_end::unknown;
  return has_pair(tail, "\"type\"", "function_call") ? reply_end::tool_call : reply_end::user_turn;
}

}  // namespace kvp::core
