// One request on its way through the data plane (docs/architecture.md "The request path"),
// from server::handle to the forward: the client connection it came on, the request, what it
// is and who sent it, and, once routed, the llama-server it goes to. The forward prepares the
// request for upstream in place and records how its relay went.
// REQUIRES: the client connection, and the entry once routed, outlive the exchange.
#pragma once

#include <string_view>

#include "backends/net.hpp"
#include "core/request_class.hpp"
#include "core/result.hpp"
#include "proxy/data/client_conn.hpp"
#include "proxy/data/upstream_table.hpp"
#include "proxy/http/relay.hpp"

namespace kvp::proxy {

struct exchange {
  exchange(client_conn& from, http::request<http::string_body> request,
           core::request_class what)
      : client(from),
        req(std::move(request)),
        version(req.version()),
        keep_alive(req.keep_alive()),
        rc(std::move(what)) {}

  client_conn& client;
  http::request<http::string_body> req;
  // The client's HTTP version, and whether it asked to keep the connection: kvpersist's own
  // answers use them (the forward sends upstream HTTP/1.1 keep-alive).
  const unsigned version;
  const bool keep_alive;
  const core::request_class rc;
  core::request_identity who;    // read after the stream routes (request_identity_reader)
  upstream_entry* up = nullptr;  // the llama-server it goes to, once routed
  relay_state relayed;           // how the forward's relay went
};

// error_answer(e) (docs/conventions.md §2) for x's client, in its HTTP version and keep-alive;
// `detail` goes to the log line only. Returns whether the connection may read another request.
net::awaitable<bool> answer_error(exchange& x, core::error e, std::string_view detail = {});

}  // namespace kvp::proxy
