#include "backends/llama_router.hpp"

#include <fmt/format.h>
#include <rapidjson/document.h>

#include "backends/llama_http_backend.hpp"
#include "core/json.hpp"

namespace kvp::backends {

namespace {

core::error bad_router_reply(std::string_view what) {
  return core::error{core::errc::backend_unsupported, 0,
                     fmt::format("unexpected reply from the llama-server router: {}", what)};
}

std::string string_member(const rapidjson::Value& v, const char* key) {
  const auto it = v.FindMember(key);
  return it != v.MemberEnd() && it->value.IsString()
             ? std::string(it->value.GetString(), it->value.GetStringLength())
             : std::string();
}

core::result<http_reply> expect_ok(core::result<http_reply> r, std::string_view what) {
  if (!r) return r.err();
  if (r->status != 200)
    return core::error{core::errc::backend_unavailable, r->status,
                       fmt::format("{}: {} {}", what, r->status, error_message(r->body))};
  return r;
}

}  // namespace

core::result<std::optional<router_info>> parse_router_props(std::string_view json) {
  rapidjson::Document d;
  if (auto parsed = core::parse_json_bounded(json, d); !parsed)
    return bad_router_reply(fmt::format("/props: {}", parsed.err().message));
  if (!d.IsObject() || string_member(d, "role") != "router") return std::optional<router_info>();
  router_info info;
  if (const auto m = d.FindMember("max_instances"); m != d.MemberEnd()) {
    if (!m->value.IsInt() || m->value.GetInt() < 0)
      return bad_router_reply("/props max_instances is not a count");
    info.max_instances = m->value.GetInt();
  }
  if (const auto a = d.FindMember("models_autoload"); a != d.MemberEnd() && a->value.IsBool())
    info.autoload = a->value.GetBool();
  return std::optional<router_info>(std::move(info));
}

core::result<std::vector<router_model>> parse_router_models(std::string_view json) {
  rapidjson::Document d;
  if (auto parsed = core::parse_json_bounded(json, d); !parsed)
    return bad_router_reply(fmt::format("/v1/models: {}", parsed.err().message));
  const auto data = d.IsObject() ? d.FindMember("data") : d.MemberEnd();
  if (data == d.MemberEnd() || !data->value.IsArray())
    return bad_router_reply("/v1/models has no data array");
  std::vector<router_model> out;
  for (const auto& m : data->value.GetArray()) {
    if (out.size() == max_router_models) break;
    if (!m.IsObject()) continue;
    router_model rm;
    rm.id = string_member(m, "id");
    if (rm.id.empty()) continue;
    if (const auto al = m.FindMember("aliases"); al != m.MemberEnd() && al->value.IsArray())
      for (const auto& a : al->value.GetArray())
        if (a.IsString() && rm.aliases.size() < max_router_models)
          rm.aliases.emplace_back(a.GetString(), a.GetStringLength());
    if (const auto st = m.FindMember("status"); st != m.MemberEnd() && st->value.IsObject())
      rm.status = string_member(st->value, "value");
    out.push_back(std::move(rm));
  }
  return out;
}

net::awaitable<core::result<std::vector<router_model>>> read_router_models(
    http_endpoint ep, std::chrono::milliseconds timeout) {
  auto r = expect_ok(co_await http_call(ep, http::verb::get, "/v1/models", "", timeout),
                     "GET /v1/models");
  if (!r) co_return r.err();
  co_return parse_router_models(r->body);
}

net::awaitable<core::result<std::optional<router_info>>> read_router(
    http_endpoint ep, std::chrono::milliseconds timeout) {
  auto r = expect_ok(co_await http_call(ep, http::verb::get, "/props", "", timeout), "GET /props");
  if (!r) co_return r.err();
  auto info = parse_router_props(r->body);
  if (!info || !info.value()) co_return info;
  auto models = co_await read_router_models(ep, timeout);
  if (!models) co_return models.err();
  info.value()->models = std::move(models.value());
  co_return info;
}

net::awaitable<core::result<bool>> await_router_model(http_endpoint ep, std::string id,
                                                      std::chrono::milliseconds timeout) {
  auto target = router_target("/props", id);
  target.replace(target.rfind("autoload=false"), std::string_view("autoload=false").size(),
                 "autoload=true");
  auto r = expect_ok(co_await http_call(ep, http::verb::get, target, "", timeout),
                     "GET /props (loading the model)");
  if (!r) co_return r.err();
  co_return true;
}

}  // namespace kvp::backends
