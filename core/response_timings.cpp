#include "core/response_timings.hpp"

#include <cctype>
#include <charconv>
#include <optional>

namespace kvp::core {

namespace {

// The number after the last `"key"` and its colon, when it is a plain non-negative number.
std::optional<double> number_after(std::string_view text, std::string_view key) {
  auto pos = text.rfind(key);
  if (pos == std::string_view::npos) return std::nullopt;
  pos += key.size();
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == ':')) ++pos;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data() + pos, text.data() + text.size(), v);
  if (ec != std::errc() || end == text.data() + pos || !(v >= 0) || v >= 9007199254740992.0)
    return std::nullopt;
  return v;
}

}  // namespace

response_timings parse_response_timings(std::string_view kept) {
  response_timings t;
  for (std::string_view key : {"\"cache_n\"", "\"cache_read_input_tokens\"", "\"cached_tokens\""})
    if (auto v = number_after(kept, key)) {
      t.cache_n = static_cast<std::int64_t>(*v);
      break;
    }
  if (auto v = number_after(kept, "\"prompt_n\"")) t.prompt_n = static_cast<std::int64_t>(*v);
  if (auto v = number_after(kept, "\"prompt_ms\"")) t.prompt_ms = *v;
  return t;
}

}  // namespace kvp::core
