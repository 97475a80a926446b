// Every error kvpersist itself answers is built here: a status, and a JSON body in the
// OpenAI/llama-server error shape so harnesses parse it like any upstream error.
#pragma once

#include <string_view>

#include "backends/net.hpp"

namespace kvp::proxy {

using response = http::response<http::string_body>;

// {"error":{"code":<status>,"message":<message>,"type":<type>[,"kv_code":<KV_*>]}}; `type` is
// derived from the status (invalid_request_error, authentication_error, permission_error,
// not_found_error, rate_limit_error, unavailable_error, server_error). `code` stays the
// numeric status, as llama-server sends it; `kv_code` (core/errc.hpp's name) says which
// persistence rule answered.
response error_response(http::status status, std::string_view message, unsigned version,
                        bool keep_alive, std::string_view kv_code = {});

// `status` with Retry-After (seconds): 429 for a credential over limits.newSessionsPerMinute
// (kv_code KV_SESSION_RATE).
response retry_later_response(http::status status, std::string_view message,
                              unsigned retry_after_s, unsigned version, bool keep_alive,
                              std::string_view kv_code = {});

// 503 with Retry-After (seconds): a full or timed-out slot queue (kv_code KV_SLOT_BUSY), a
// full body budget.
response busy_response(std::string_view message, unsigned retry_after_s, unsigned version,
                       std::string_view kv_code = {});

}  // namespace kvp::proxy
