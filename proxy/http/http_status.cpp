#include "proxy/http/http_status.hpp"

#include <string>

#include "core/json_writer.hpp"
#include "core/version.hpp"

namespace kvp::proxy {

namespace {

using core::errc;
using core::log_level;

constexpr std::string_view refused_event = "kv.request.refused";
constexpr std::string_view upstream_event = "kv.upstream.unavailable";

// The one place a status is chosen for an errc. Persistence failures answer 503 (the
// coordinator already logged their cause); upstream transport failures 502/504 with a
// warning, since the next coordinated request re-reads llama-server's state. A request that
// broke an HTTP or API rule answers that rule's 4xx without kv_code, as an HTTP server would;
// so do the admin API's answers that predate kv_code (no session, persistence unavailable, a
// purge that kept files), whose bodies stay as clients know them.
answer_rule rule_for_code(errc code) {
  constexpr auto refusal = [](http::status s) {
    return answer_rule{s, false, log_level::debug, refused_event};
  };
  switch (code) {
    case errc::session_rate:
    case errc::runtime_change_pending:
      return {http::status::too_many_requests, true, log_level::debug, refused_event};
    case errc::over_capacity: return refusal(http::status::service_unavailable);
    case errc::upstream_unreachable:
    case errc::upstream_closed:
      return {http::status::bad_gateway, false, log_level::warn, upstream_event};
    case errc::upstream_timeout:
      return {http::status::gateway_timeout, false, log_level::warn, upstream_event};
    case errc::request_refused: return refusal(http::status::bad_request);
    case errc::credential_refused: return refusal(http::status::unauthorized);
    case errc::route_forbidden: return refusal(http::status::forbidden);
    case errc::not_found: return refusal(http::status::not_found);
    case errc::method_not_allowed: return refusal(http::status::method_not_allowed);
    case errc::body_too_large: return refusal(http::status::payload_too_large);
    case errc::target_too_long: return refusal(http::status::uri_too_long);
    case errc::media_type_refused: return refusal(http::status::unsupported_media_type);
    case errc::header_too_large: return refusal(http::status::request_header_fields_too_large);
    case errc::persistence_unavailable: return refusal(http::status::service_unavailable);
    case errc::snapshot_files_kept: return refusal(http::status::bad_gateway);
    default:
      break;
  }
  return {http::status::service_unavailable, true, log_level::debug, refused_event};
}

std::string_view type_for(http::status s) {
  switch (s) {
    case http::status::unauthorized: return "authentication_error";
    case http::status::forbidden: return "permission_error";
    case http::status::not_found: return "not_found_error";
    case http::status::service_unavailable: return "unavailable_error";
    case http::status::gateway_timeout: return "timeout_error";
    case http::status::too_many_requests: return "rate_limit_error";
    default: break;
  }
  return static_cast<unsigned>(s) < 500 ? "invalid_request_error" : "server_error";
}

std::string error_json(http::status status, std::string_view message, std::string_view kv_code) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  w.Key("error");
  w.StartObject();
  w.Key("code");
  w.Uint(static_cast<unsigned>(status));
  core::write_json_member(w, "message", message);
  core::write_json_member(w, "type", type_for(status));
  if (!kv_code.empty()) core::write_json_member(w, "kv_code", kv_code);
  w.EndObject();
  w.EndObject();
  return sb.GetString();
}

}  // namespace

answer_rule answer_rule_for(const core::error& e) { return rule_for_code(e.code); }

response error_response(const core::error& e, unsigned version, bool keep_alive) {
  const answer_rule rule = answer_rule_for(e);
  response res{rule.status, version};
  res.set(http::field::server, std::string("kvpersist/") + kvp::version);
  res.set(http::field::content_type, "application/json");
  if (e.retry_after_s > 0) res.set(http::field::retry_after, std::to_string(e.retry_after_s));
  res.keep_alive(keep_alive);
  res.body() = error_json(rule.status, e.message,
                          rule.names_kv_code ? core::to_string(e.code) : std::string_view{});
  res.prepare_payload();
  return res;
}

response error_answer(const core::error& e, unsigned version, bool keep_alive,
                      std::string_view detail) {
  const answer_rule rule = answer_rule_for(e);
  std::string status = std::to_string(static_cast<unsigned>(rule.status));
  std::string code(core::to_string(e.code));
  if (detail.empty())
    core::log(rule.level, rule.event,
              {{"status", std::move(status)}, {"code", std::move(code)}, {"reason", e.message}});
  else
    core::log(rule.level, rule.event,
              {{"status", std::move(status)}, {"code", std::move(code)}, {"reason", e.message},
               {"detail", std::string(detail)}});
  return error_response(e, version, keep_alive);
}

core::error unreachable_upstream(const core::error& cause) {
  return core::error{cause.code == errc::operation_timeout ? errc::upstream_timeout
                                                           : errc::upstream_unreachable,
                     0, "upstream llama-server is unreachable"};
}

}  // namespace kvp::proxy
