// Helpers shared by the coordinator's translation units (coordinator.cpp and its
// coordinator_*.cpp parts); not part of the coordinator's interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/json_writer.hpp"
#include "core/utc_time.hpp"
#include "proxy/coordinator.hpp"

namespace kvp::proxy::detail {

// The wall-clock time manifests are stamped with.
inline std::string wall_now() {
  return core::format_utc(std::chrono::system_clock::now(), core::utc_precision::seconds);
}

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// {"<key>": "<value>"}
inline admin_reply json_reply(unsigned status, std::string_view key, std::string_view value) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, key, value);
  w.EndObject();
  return admin_reply{status, sb.GetString()};
}

// {"error": {"code": <status>, "message": "<message>"}}
inline admin_reply error_reply(unsigned status, std::string_view message) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  w.Key("error");
  w.StartObject();
  w.Key("code");
  w.Uint(status);
  w.Key("message");
  core::write_json_string(w, message);
  w.EndObject();
  w.EndObject();
  return admin_reply{status, sb.GetString()};
}

}  // namespace kvp::proxy::detail
