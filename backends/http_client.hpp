// A one-shot HTTP/1.1 client for management calls: one connection per call, one deadline
// for the whole exchange. Not used on the inference path (that is proxy/data/upstream_pool).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "backends/net.hpp"
#include "core/result.hpp"

namespace kvp::backends {

struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  std::string base_path;  // prefix before every target, without trailing slash
  std::string api_key;    // sent as "Authorization: Bearer <key>" when non-empty
};

// The Host field for `ep`: an IPv6 literal in brackets (RFC 9110 §7.2), the port unless 80.
std::string host_field(const http_endpoint& ep);

struct http_reply {
  int status = 0;
  std::string body;
};

// Sends `method target` with an optional JSON body and reads the whole reply.
// Errors: backend_unavailable (connect/IO), operation_timeout (deadline). A reply with any
// status is a success at this level.
net::awaitable<core::result<http_reply>> http_call(http_endpoint ep, http::verb method,
                                                   std::string target, std::string body,
                                                   std::chrono::milliseconds timeout);

}  // namespace kvp::backends
