#include "core/request_rewrite.hpp"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <fmt/format.h>

namespace kvp::core {

std::optional<std::string> pin_request_body(std::string_view body, int slot) {
  // RapidJSON stops at a NUL byte as if the input ended there; JSON text never contains
  // one, so such a body is not ours to rewrite.
  if (body.find('\0') != std::string_view::npos) return std::nullopt;
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) return std::nullopt;
  auto end = body.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos || body[end] != '}') return std::nullopt;
  if (!d.HasMember("id_slot") && !d.HasMember("cache_prompt")) {
    // Byte-preserving path: the last non-space byte is the top-level object's closing brace.
    std::string out(body.substr(0, end));
    const bool empty = d.MemberCount() == 0;
    out += fmt::format(R"({}"id_slot":{},"cache_prompt":true}})", empty ? "" : ",", slot);
    out.append(body.substr(end + 1));
    return out;
  }
  auto& a = d.GetAllocator();
  d.RemoveMember("id_slot");
  d.RemoveMember("cache_prompt");
  d.AddMember("id_slot", slot, a);
  d.AddMember("cache_prompt", true, a);
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  d.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

std::string request_model(std::string_view body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) return {};
  auto it = d.FindMember("model");
  if (it == d.MemberEnd() || !it->value.IsString()) return {};
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

}  // namespace kvp::core
