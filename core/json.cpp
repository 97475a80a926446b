#include "core/json.hpp"

#include <cstring>

#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <fmt/format.h>

namespace kvp::core {

namespace {

// Forwards the reader's events to the document and stops the parse one level too deep.
class depth_limited_handler {
 public:
  explicit depth_limited_handler(rapidjson::Document& d) : d_(d) {}
  bool too_deep() const { return depth_ > json_max_depth; }

  bool Null() { return d_.Null(); }
  bool Bool(bool b) { return d_.Bool(b); }
  bool Int(int i) { return d_.Int(i); }
  bool Uint(unsigned u) { return d_.Uint(u); }
  bool Int64(std::int64_t i) { return d_.Int64(i); }
  bool Uint64(std::uint64_t u) { return d_.Uint64(u); }
  bool Double(double x) { return d_.Double(x); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool copy) { return d_.RawNumber(s, n, copy); }
  bool String(const char* s, rapidjson::SizeType n, bool copy) { return d_.String(s, n, copy); }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) { return d_.Key(s, n, copy); }
  bool StartObject() { return enter() && d_.StartObject(); }
  bool EndObject(rapidjson::SizeType n) { --depth_; return d_.EndObject(n); }
  bool StartArray() { return enter() && d_.StartArray(); }
  bool EndArray(rapidjson::SizeType n) { --depth_; return d_.EndArray(n); }

 private:
  bool enter() { return ++depth_ <= json_max_depth; }
  rapidjson::Document& d_;
  int depth_ = 0;
};

}  // namespace

namespace {

template <typename Stream>
result<unit> parse_stream(Stream& in, rapidjson::Document& d) {
  rapidjson::Reader reader;
  rapidjson::ParseResult parsed;
  depth_limited_handler handler(d);
  auto generate = [&](rapidjson::Document&) {
    // Not kParseFullPrecisionFlag: its slow path has undefined behaviour in RapidJSON 1.1.
    parsed = reader.Parse<rapidjson::kParseIterativeFlag>(in, handler);
    return !parsed.IsError();
  };
  d.Populate(generate);
  if (handler.too_deep())
    return error{errc::invariant, 0,
                 fmt::format("JSON nested deeper than {} levels", json_max_depth)};
  if (parsed.IsError())
    return error{errc::invariant, 0,
                 fmt::format("invalid JSON at byte {}: {}", parsed.Offset(),
                             rapidjson::GetParseError_En(parsed.Code()))};
  return unit{};
}

error nul_byte() { return error{errc::invariant, 0, "JSON text contains a NUL byte"}; }

}  // namespace

result<unit> parse_json_bounded(std::string_view text, rapidjson::Document& d) {
  if (text.find('\0') != std::string_view::npos) return nul_byte();
  rapidjson::MemoryStream ms(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(ms);
  return parse_stream(in, d);
}

result<unit> parse_json_bounded(const std::string& text, rapidjson::Document& d) {
  // Without a NUL inside, the string ends exactly at its terminator, where StringStream stops.
  if (text.find('\0') != std::string::npos) return nul_byte();
  rapidjson::StringStream in(text.c_str());
  return parse_stream(in, d);
}

std::optional<std::uint64_t> json_count(const rapidjson::Value& v) {
  if (!v.IsUint64() || v.GetUint64() > json_max_count) return std::nullopt;
  return v.GetUint64();
}

namespace {

// From just past an opening quote: the position just past the closing one, or nullptr when
// the string never ends (then the parser that reads the body says what is wrong).
const char* skip_string(const char* p, const char* end) {
  for (;;) {
    const auto* quote =
        static_cast<const char*>(std::memchr(p, '"', static_cast<std::size_t>(end - p)));
    if (!quote) return nullptr;
    const char* escapes = quote;
    while (escapes > p && escapes[-1] == '\\') --escapes;
    if ((quote - escapes) % 2 == 0) return quote + 1;  // not escaped
    p = quote + 1;
  }
}

}  // namespace

bool json_nesting_exceeds(std::string_view body, int max_depth) {
  const char* p = body.data();
  const char* end = p + body.size();
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) ++p;
  if (p == end || (*p != '{' && *p != '[')) return false;
  int depth = 0;
  while (p < end) {
    const char c = *p++;
    if (c == '"') {
      p = skip_string(p, end);
      if (!p) return false;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace kvp::core
