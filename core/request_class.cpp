#include "core/request_class.hpp"

#include <openssl/crypto.h>

#include <algorithm>
#include <array>

#include "core/identity.hpp"
#include "core/json.hpp"

namespace kvp::core {

namespace {

constexpr std::array<inference_route, 21> route_table = {{
    {"/completion", true, body_format::prompt},
    {"/completions", true, body_format::prompt},
    {"/v1/completions", true, body_format::prompt},
    {"/chat/completions", true, body_format::chat},
    {"/v1/chat/completions", true, body_format::chat},
    {"/api/chat", false, body_format::chat},
    {"/responses", true, body_format::responses},
    {"/v1/responses", true, body_format::responses},
    {"/v1/messages", false, body_format::messages},
    {"/infill", true, body_format::none},
    {"/v1/infill", true, body_format::none},
    {"/api/generate", false, body_format::none},
    {"/embedding", false, body_format::none},
    {"/embeddings", false, body_format::none},
    {"/v1/embeddings", false, body_format::none},
    {"/rerank", false, body_format::none},
    {"/reranking", false, body_format::none},
    {"/v1/rerank", false, body_format::none},
    {"/v1/reranking", false, body_format::none},
    {"/v1/audio/transcriptions", false, body_format::none},
    {"/audio/transcriptions", false, body_format::none},
}};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string decode_path(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 5 < path.size() && path[i + 1] == 'u') {
      // cpp-httplib also decodes the non-standard %uXXXX form (to UTF-8).
      int cp = 0;
      bool ok = true;
      for (std::size_t k = 2; k < 6; ++k) {
        const int h = hex_value(path[i + k]);
        if (h < 0) ok = false;
        cp = cp * 16 + (h < 0 ? 0 : h);
      }
      if (ok) {
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          // A lone UTF-16 surrogate: cpp-httplib drops it, so must we ("/%uD800slots").
        } else if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
        i += 5;
        continue;
      }
    }
    if (path[i] == '%' && i + 2 < path.size()) {
      const int hi = hex_value(path[i + 1]);
      const int lo = hex_value(path[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += path[i];
  }
  return out;
}

std::string decode_query_component(std::string_view component) {
  std::string out;
  out.reserve(component.size());
  for (std::size_t i = 0; i < component.size(); ++i) {
    const bool escape = component[i] == '%' && i + 2 < component.size();
    const int hi = escape ? hex_value(component[i + 1]) : -1;
    const int lo = escape ? hex_value(component[i + 2]) : -1;
    if (hi >= 0 && lo >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += component[i] == '+' ? ' ' : component[i];
    }
  }
  return out;
}

std::optional<std::string> query_param(std::string_view target, std::string_view name) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return std::nullopt;
  const std::string_view query = target.substr(q + 1, target.find('#', q) - q - 1);
  std::optional<std::string> value;
  std::vector<std::string_view> seen;  // cpp-httplib skips a pair it has read before
  for (std::size_t pos = 0; pos <= query.size();) {
    const auto amp = std::min(query.find('&', pos), query.size());
    const std::string_view part = query.substr(pos, amp - pos);
    pos = amp + 1;
    if (std::find(seen.begin(), seen.end(), part) != seen.end()) continue;
    seen.push_back(part);
    const auto eq = part.find('=');
    if (decode_query_component(part.substr(0, eq)) == name)
      value = eq == std::string_view::npos ? "" : decode_query_component(part.substr(eq + 1));
  }
  return value;
}

std::string routed_path(std::string_view target) {
  std::string path = decode_path(target.substr(0, target.find_first_of("?#")));
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

namespace {

const inference_route* route_for_path(std::string_view path) {
  for (const auto& r : route_table)
    if (path == r.path) return &r;
  return nullptr;
}

}  // namespace

std::span<const inference_route> inference_route_table() { return route_table; }

const inference_route* inference_route_of(std::string_view target) {
  return route_for_path(routed_path(target));
}

request_class classify(std::string_view method, std::string_view target) {
  request_class rc;
  rc.path = routed_path(target);
  rc.route = route_for_path(rc.path);
  if (rc.path == "/slots" || rc.path.starts_with("/slots/")) rc.kind = endpoint_kind::slots;
  else if (rc.route) rc.kind = endpoint_kind::inference;
  rc.needs_slot = method == "POST" && rc.route;
  rc.changes_runtime = method == "POST" && rc.path == "/lora-adapters";
  rc.stream = stream_route_of(method, rc.path);
  return rc;
}

bool client_key_matches(std::string_view authorization, std::string_view x_api_key,
                        std::string_view api_key) {
  std::string_view given = authorization.empty() ? x_api_key : authorization;
  if (given.starts_with("Bearer ")) given.remove_prefix(7);
  const std::string a = sha256_hex(given), b = sha256_hex(api_key);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string harness_header_value(std::string_view header_value, std::string_view field,
                                 const std::vector<std::string>& values,
                                 std::string_view prefix) {
  std::string v;
  if (field.empty()) {
    v = std::string(header_value);
  } else {
    rapidjson::Document d;
    if (!parse_json_bounded(header_value, d) || !d.IsObject()) return {};
    const auto it = d.FindMember(rapidjson::StringRef(field.data(), field.size()));
    if (it == d.MemberEnd() || !it->value.IsString()) return {};
    v.assign(it->value.GetString(), it->value.GetStringLength());
  }
  if (v.size() <= prefix.size() || !v.starts_with(prefix)) return {};  // empty, or no more than it
  if (values.empty()) return v;
  for (const auto& want : values)
    if (v == want) return v;
  return {};
}

std::string sub_session_id(std::string_view session_id, std::string_view tag) {
  constexpr std::size_t max_tag = 64;
  std::string out(session_id);
  out += '#';
  if (tag.size() <= max_tag) out += tag;
  else out += sha256_hex(tag).substr(0, 16);
  return out;
}

}  // namespace kvp::core
