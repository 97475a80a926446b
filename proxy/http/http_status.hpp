// Every error kvpersist itself answers is built here (docs/conventions.md §2): one table in
// http_status.cpp says, for each core::errc, the status, whether the body names the code,
// and the log line. The body is in the OpenAI/llama-server error shape so harnesses parse it
// like any upstream error.
#pragma once

#include <string_view>

#include "backends/net.hpp"
#include "core/log.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

using response = http::response<http::string_body>;

// What error_answer does for an error: its status, whether the body carries `kv_code`
// (core/errc.hpp's name: a persistence rule answered, not an HTTP rule or llama-server's
// transport), and the level and event of its log line.
struct answer_rule {
  http::status status;
  bool names_kv_code;
  core::log_level level;
  std::string_view event;
};

// The table's row for `e`: its code alone decides (e.http_status, llama-server's status when
// one was involved, does not).
answer_rule answer_rule_for(const core::error& e);

// {"error":{"code":<status>,"message":<e.message>,"type":<type>[,"kv_code":<KV_*>]}} with
// Retry-After when e.retry_after_s is set; `type` is derived from the status
// (invalid_request_error, authentication_error, permission_error, not_found_error,
// rate_limit_error, unavailable_error, timeout_error, server_error). `code` stays the
// numeric status, as llama-server sends it. Logs nothing: for an answer built ahead of time.
response error_response(const core::error& e, unsigned version, bool keep_alive);

// error_response, and the rule's log line (status, kv_code, message, and `detail` when the
// cause has more to say than the client is told).
response error_answer(const core::error& e, unsigned version, bool keep_alive,
                      std::string_view detail = {});

// A forwarded request that found no connection to llama-server (`cause`: the pool's error):
// errc::upstream_timeout when connecting timed out, errc::upstream_unreachable otherwise.
core::error unreachable_upstream(const core::error& cause);

}  // namespace kvp::proxy
