// JSON that kvpersist writes goes through RapidJSON's Writer, which escapes every string;
// these helpers spare call sites the casts of its pointer-and-length API. (Reading is
// core/json.hpp.)
#pragma once

#include <cstdint>
#include <string_view>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace kvp::core {

using json_writer = rapidjson::Writer<rapidjson::StringBuffer>;

// `s` as a JSON string. It REQUIRES valid UTF-8 (valid_utf8 in core/manifest.hpp makes it so):
// the Writer copies bytes above 0x7F as they are.
inline void write_json_string(json_writer& w, std::string_view s) {
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

// "key":"value" inside an object.
inline void write_json_member(json_writer& w, std::string_view key, std::string_view value) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  write_json_string(w, value);
}

// "key":count inside an object.
inline void write_json_count(json_writer& w, std::string_view key, std::uint64_t value) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  w.Uint64(value);
}

}  // namespace kvp::core
