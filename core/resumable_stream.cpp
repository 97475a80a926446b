#include "core/resumable_stream.hpp"

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/json.hpp"
#include "core/json_writer.hpp"
#include "core/request_class.hpp"

namespace kvp::core {

stream_route stream_route_of(std::string_view method, std::string_view path) {
  if (path == "/v1/stream") {
    if (method == "GET") return stream_route::replay;
    if (method == "DELETE") return stream_route::stop;
  }
  if (path == "/v1/streams/lookup" && method == "POST") return stream_route::lookup;
  return stream_route::none;
}

std::string upstream_conversation_id(std::string_view credential, std::string_view conversation_id) {
  const std::string h = sha256_hex(fmt::format("kvpersist-conversation-v1;{}:{};{}:{};", credential.size(),
                                               credential, conversation_id.size(), conversation_id));
  return "kvp-" + h.substr(0, 32);
}

namespaced_target namespace_stream_target(std::string_view target, std::string_view credential) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {std::string(target), ""};
  const auto frag = target.find('#', q);
  const std::string_view query = target.substr(q + 1, frag == std::string_view::npos ? frag : frag - q - 1);
  namespaced_target res;
  std::string& out = res.target;
  out = target.substr(0, q + 1);
  std::size_t pos = 0;
  while (pos <= query.size()) {
    auto amp = query.find('&', pos);
    if (amp == std::string_view::npos) amp = query.size();
    const std::string_view param = query.substr(pos, amp - pos);
    const auto eq = param.find('=');
    const std::string_view key = param.substr(0, eq);
    if (pos > 0) out += '&';
    if (decode_query_component(key) == "conv_id") {
      const std::string_view value = eq == std::string_view::npos ? "" : param.substr(eq + 1);
      auto id = upstream_conversation_id(credential, decode_query_component(value));
      out += "conv_id=" + id;
      if (res.conversation.empty()) res.conversation = std::move(id);
    } else {
      out += param;
    }
    pos = amp + 1;
  }
  if (frag != std::string_view::npos) out += target.substr(frag);
  return res;
}

std::optional<namespaced_lookup> namespace_lookup(std::string_view body, std::string_view credential,
                                                  std::size_t max_ids) {
  rapidjson::Document d;
  if (!parse_json_bounded(body, d) || !d.IsObject()) return std::nullopt;
  const auto ids = d.FindMember("conversation_ids");
  if (ids == d.MemberEnd() || !ids->value.IsArray() || ids->value.Size() > max_ids) return std::nullopt;
  namespaced_lookup out;
  rapidjson::StringBuffer sb;
  json_writer w(sb);
  w.StartObject();
  w.Key("conversation_ids");
  w.StartArray();
  for (const auto& v : ids->value.GetArray()) {
    if (!v.IsString()) return std::nullopt;
    const std::string_view id(v.GetString(), v.GetStringLength());
    if (id.empty()) continue;  // llama-server skips empty ids
    auto up = upstream_conversation_id(credential, id);
    write_json_string(w, up);
    out.upstream_to_client.emplace_back(std::move(up), std::string(id));
  }
  w.EndArray();
  w.EndObject();
  out.body.assign(sb.GetString(), sb.GetSize());
  return out;
}

std::optional<std::string> client_lookup_reply(std::string_view reply, const namespaced_lookup& lookup) {
  rapidjson::Document d;
  if (!parse_json_bounded(reply, d) || !d.IsArray()) return std::nullopt;
  // An upstream id as the client named it: the id alone, or with llama-server's "::<model>".
  const auto client_id = [&](std::string_view up) -> std::optional<std::string> {
    for (const auto& [u, c] : lookup.upstream_to_client) {
      if (up == u) return c;
      if (up.size() > u.size() + 2 && up.substr(0, u.size()) == u && up.substr(u.size(), 2) == "::")
        return c + std::string(up.substr(u.size()));
    }
    return std::nullopt;
  };
  rapidjson::StringBuffer sb;
  json_writer w(sb);
  w.StartArray();
  for (auto& entry : d.GetArray()) {
    if (!entry.IsObject()) return std::nullopt;
    const auto id = entry.FindMember("conversation_id");
    if (id == entry.MemberEnd() || !id->value.IsString()) return std::nullopt;
    const auto named = client_id(std::string_view(id->value.GetString(), id->value.GetStringLength()));
    if (!named) continue;
    id->value.SetString(named->data(), static_cast<rapidjson::SizeType>(named->size()), d.GetAllocator());
    entry.Accept(w);
  }
  w.EndArray();
  return std::string(sb.GetString(), sb.GetSize());
}

}  // namespace kvp::core
