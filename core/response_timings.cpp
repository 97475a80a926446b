#include "core/response_timings.hpp"

#include <array>
#include <charconv>
#include <cstring>
#include <optional>

namespace kvp::core {

namespace {

// The keys read, each with its quotes: the reused count in order of preference, then the
// timings' prompt figures.
constexpr std::array<std::string_view, 5> keys{"\"cache_n\"", "\"cache_read_input_tokens\"",
                                               "\"cached_tokens\"", "\"prompt_n\"",
                                               "\"prompt_ms\""};
constexpr std::size_t reused_keys = 3;
constexpr auto none = std::string_view::npos;

// Where each key occurs last in `text`. One backward pass over the quotes (memrchr), each
// looked at only when the letter after it may start a key: every session request's reply is
// read (proxy/data/server.cpp), so this runs per resident turn.
std::array<std::size_t, keys.size()> last_positions(std::string_view text) {
  std::array<std::size_t, keys.size()> at;
  at.fill(none);
  std::size_t found = 0, end = text.size();
  while (found < keys.size() && end > 0) {
    const void* q = ::memrchr(text.data(), '"', end);
    if (!q) break;
    end = static_cast<std::size_t>(static_cast<const char*>(q) - text.data());
    if (end + 1 >= text.size() || (text[end + 1] != 'c' && text[end + 1] != 'p')) continue;
    const auto rest = text.substr(end);
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (at[k] == none && rest.starts_with(keys[k])) {
        at[k] = end;
        ++found;
      }
  }
  return at;
}

// The number after the key at `pos` and its colon, when it is a plain non-negative number.
std::optional<double> number_at(std::string_view text, std::size_t pos, std::string_view key) {
  if (pos == none) return std::nullopt;
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
  const auto at = last_positions(kept);
  for (std::size_t k = 0; k < reused_keys; ++k)
    if (auto v = number_at(kept, at[k], keys[k])) {
      t.cache_n = static_cast<std::int64_t>(*v);
      break;
    }
  if (auto v = number_at(kept, at[3], keys[3])) t.prompt_n = static_cast<std::int64_t>(*v);
  if (auto v = number_at(kept, at[4], keys[4])) t.prompt_ms = *v;
  return t;
}

}  // namespace kvp::core
