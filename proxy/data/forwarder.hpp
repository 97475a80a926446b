// Forwarding one request to its llama-server and relaying the response to its client as it
// streams (docs/design.md §17): taking an upstream connection (one taken before a long
// prepare is peeked first), one relay through proxy/http/relay.hpp, the retry rule, and the
// client's answer for each way a relay ends, through error_answer (proxy/http/http_status.hpp).
// Threads: one forwarder serves every connection at once; it only reads the upstream table.
#pragma once

#include <optional>
#include <string>

#include "backends/net.hpp"
#include "core/result.hpp"
#include "proxy/data/exchange.hpp"
#include "proxy/data/upstream_pool.hpp"
#include "proxy/data/upstream_table.hpp"
#include "proxy/http/relay.hpp"

namespace kvp::proxy {

// The retry rule: whether a request goes again, once, on a new connection after attempt
// `attempt` (0 the first) ended `st` on a connection that was `fresh` or reused from the pool.
// Only a reused connection that llama-server had already closed qualifies: no status line
// came back, and not because a read timed out (a slow server has the request). llama-server
// never saw the request, so nothing runs twice.
bool retry_on_new_connection(const relay_state& st, bool fresh, int attempt);

// The error a client is told when its relay ended `end` before the status line reached it:
// errc::upstream_timeout for upstream_timed_out, errc::upstream_closed otherwise.
core::error upstream_failure(relay_end end);

class forwarder {
 public:
  // REQUIRES: `upstreams` outlives the forwarder.
  explicit forwarder(const upstream_table& upstreams);

  // Sends x.req, prepared for *x.up (upstream_table::prepare_request), on `pre` while it is
  // still open, else on a pooled or new connection, and relays the response to x.client;
  // x.relayed says how the relay ended, and `tail` (when given) keeps the reply's first KiB
  // and last 8-16 KiB. The client's conversation hold ends when llama-server is sent the
  // request. llama-server unreachable, or failing before the status line: error_answer.
  // Returns whether the client connection may read another request.
  // REQUIRES: x.up is set.
  net::awaitable<bool> forward(exchange& x, std::optional<upstream_conn> pre,
                               std::string* tail = nullptr) const;

 private:
  // How one attempt ended: the retry rule decides (`relayed`), no attempt follows
  // (`final`: a relay that outlives its client), or the client left (`client_left`).
  enum class attempt_end { relayed, final, client_left };

  // One attempt on `conn`: the request written, the response relayed with `relay`.
  net::awaitable<attempt_end> relay_once(exchange& x, upstream_conn& conn,
                                         const relay_options& relay, std::string* tail) const;
  // What x's client is told once the attempts are over: nothing more after a delivered
  // response (the connection goes on as the relay told the client) or a client that left;
  // upstream_failure() before the status line; a close mid-body, so the client sees a
  // truncated response, not a clean end.
  net::awaitable<bool> answer_relay_end(exchange& x) const;

  const upstream_table& upstreams_;
};

}  // namespace kvp::proxy
