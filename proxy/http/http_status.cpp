#include "proxy/http/http_status.hpp"

#include "core/json_writer.hpp"
#include "core/version.hpp"

namespace kvp::proxy {

namespace {

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

}  // namespace

response error_response(http::status status, std::string_view message, unsigned version,
                        bool keep_alive, std::string_view kv_code) {
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
  response res{status, version};
  res.set(http::field::server, std::string("kvpersist/") + kvp::version);
  res.set(http::field::content_type, "application/json");
  res.keep_alive(keep_alive);
  res.body() = sb.GetString();
  res.prepare_payload();
  return res;
}

response retry_later_response(http::status status, std::string_view message,
                              unsigned retry_after_s, unsigned version, bool keep_alive,
                              std::string_view kv_code) {
  auto res = error_response(status, message, version, keep_alive, kv_code);
  res.set(http::field::retry_after, std::to_string(retry_after_s));
  return res;
}

response busy_response(std::string_view message, unsigned retry_after_s, unsigned version,
                       std::string_view kv_code) {
  return retry_later_response(http::status::service_unavailable, message, retry_after_s, version,
                              true, kv_code);
}

}  // namespace kvp::proxy
