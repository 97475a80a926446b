#include "core/request_hints.hpp"

#include <array>

#include <rapidjson/document.h>

#include "core/json.hpp"
#include "core/prefix_chain.hpp"
#include "core/request_class.hpp"

namespace kvp::core {

namespace {

bool starts_with_prefix(const rapidjson::Value& v) {
  return v.IsString() &&
         std::string_view(v.GetString(), v.GetStringLength()).starts_with(attribution_header_prefix);
}

// The text of `system`'s first block, or the string `system` is.
bool system_starts_with_prefix(const rapidjson::Value& system) {
  if (!system.IsArray()) return starts_with_prefix(system);
  if (system.Empty() || !system[0].IsObject()) return false;
  const auto text = system[0].FindMember("text");
  return text != system[0].MemberEnd() && starts_with_prefix(text->value);
}

}  // namespace

// In hint_id's order.
constexpr std::array<request_hint, hint_count> hints{{
    {"attribution_header",
     "Claude Code's per-conversation x-anthropic-billing-header block opens every system "
     "prompt, so no two conversations share a prompt prefix and each new one starts cold",
     "CLAUDE_CODE_ATTRIBUTION_HEADER=0 in Claude Code's environment"},
}};

const request_hint& hint_text(hint_id h) { return hints.at(static_cast<std::size_t>(h)); }

std::optional<hint_id> find_request_hint(std::string_view id) {
  for (std::size_t i = 0; i < hint_count; ++i)
    if (hint_text(static_cast<hint_id>(i)).id == id) return static_cast<hint_id>(i);
  return std::nullopt;
}

bool has_attribution_header(std::string_view target, const std::string& body) {
  // routed_path allocates: only for a target that can name the route, spelled out or escaped.
  const bool may_route = target.find("messages") != std::string_view::npos ||
                         target.find('%') != std::string_view::npos;
  if (!may_route || body.size() > max_chained_body_bytes || routed_path(target) != "/v1/messages" ||
      body.find(attribution_header_prefix) == std::string::npos)
    return false;
  rapidjson::Document doc;
  if (!parse_json_bounded(body, doc) || !doc.IsObject()) return false;
  return opens_with_attribution_block(doc);
}

bool opens_with_attribution_block(const rapidjson::Value& body) {
  if (!body.IsObject()) return false;
  const auto system = body.FindMember("system");
  return system != body.MemberEnd() && system_starts_with_prefix(system->value);
}

}  // namespace kvp::core
