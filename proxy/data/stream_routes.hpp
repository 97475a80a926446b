// Resumable streams through the proxy (docs/design.md §21): a request's X-Conversation-Id is
// namespaced per credential (core/resumable_stream.hpp) and remembered with the server it
// runs on; GET/DELETE /v1/stream and POST /v1/streams/lookup are namespaced the same way and
// reach that server, or are answered here while kvpersist still holds the stream.
//
// Owns the stream_directory (which server runs each stream, which streams are held). Thread-
// safe: connections of every I/O thread call it at once (the directory has its own mutex).
// The answer to the client and the relay of an upstream response stay the proxy's: a stream
// route gets them as a stream_route_io.
// REQUIRES: `upstreams` outlives this object, its routers already discovered.
#pragma once

#include <functional>
#include <optional>

#include "backends/net.hpp"
#include "core/resumable_stream.hpp"
#include "proxy/data/stream_directory.hpp"
#include "proxy/data/upstream_table.hpp"
#include "proxy/http/http_status.hpp"

namespace kvp::proxy {

// What a stream route needs of the client connection it serves.
struct stream_route_io {
  // Sends `res` to the client; returns whether the connection may read another request.
  std::function<net::awaitable<bool>(response res)> answer;
  // Forwards `req` (the request stream_routes::forward was given, namespaced) to `up` and
  // relays the response to the client; returns whether the connection may read another request.
  std::function<net::awaitable<bool>(upstream_entry& up, http::request<http::string_body>& req)>
      forward;
};

class stream_routes {
 public:
  explicit stream_routes(upstream_table& upstreams);

  // A request about to run on `up`: its X-Conversation-Id (every instance of it) replaced by
  // the id namespaced for its credential, which is remembered with `up`'s server and held
  // until the request is forwarded. An empty hold for a request without X-Conversation-Id.
  stream_hold hold_conversation(const upstream_entry& up, http::request<http::string_body>& req);

  // A stream route's request (`kind` is not none): answered here (a malformed lookup, a held
  // stream's replay or stop), or namespaced and sent to the server that runs the stream
  // (route() when none is known).
  net::awaitable<bool> forward(core::stream_route kind, http::request<http::string_body>& req,
                               stream_route_io io);

 private:
  net::awaitable<bool> forward_lookup(upstream_entry& up, http::request<http::string_body>& req,
                                      const core::namespaced_lookup& lookup,
                                      const stream_route_io& io);

  upstream_table& upstreams_;
  stream_directory directory_;
};

}  // namespace kvp::proxy
