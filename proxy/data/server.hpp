// The data plane: serves the proxy port's client connections. It reads requests, refuses
// /slots, sends inference requests through the coordinator's lease and relays every response
// as it streams. Which llama-server a request goes to is upstream_table's; who the request
// is, request_identity_reader's; the resumable-stream routes, stream_routes'. What listens,
// starts and stops is proxy/tools/daemon.hpp's.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backends/net.hpp"
#include "config/config.hpp"
#include "proxy/control/lease.hpp"
#include "proxy/data/client_conn.hpp"
#include "proxy/data/exchange.hpp"
#include "proxy/data/forwarder.hpp"
#include "proxy/data/request_identity_reader.hpp"
#include "proxy/data/stream_routes.hpp"
#include "proxy/data/upstream_table.hpp"
#include "proxy/http/body_budget.hpp"

namespace kvp::proxy {

class server {
 public:
  // REQUIRES: cfg passed config::validate; `upstreams`, built from cfg, outlives the server,
  // and its routers are discovered and coordinators started before the first connection.
  server(config::config cfg, upstream_table& upstreams);
  ~server();

  // Serves one client connection until it closes, or the drain closes it (the proxy
  // listener's serve function).
  net::awaitable<void> serve(tcp_stream stream);

  // The drain (docs/design.md §16): no connection reads another request, and those waiting
  // for one are closed. Called again, it closes those that finished a request since. Any thread.
  void stop_reading();
  // Closes every connection, in the middle of a request or not: the grace is over. Any thread.
  void close_all();
  // The requests being served now.
  int in_flight() const { return active_.load(); }

 private:
  // Cancels the connections' pending reads and writes: only theirs between requests
  // (`only_idle`), or everyone's.
  void close_connections(bool only_idle);
  net::awaitable<bool> handle(client_conn& c, http::request<http::string_body> req);
  net::awaitable<bool> admit(exchange& x);
  net::awaitable<void> before_router_request(exchange& x);
  // POST /lora-adapters: forwarded while the coordinator holds the whole server.
  net::awaitable<bool> forward_runtime_change(exchange& x);
  net::awaitable<bool> handle_under_lease(exchange& x);
  // Persistence off: forwarded untouched; `ticket` (no slot) ends with the response.
  net::awaitable<bool> pass_through(exchange& x, lease ticket, std::optional<upstream_conn> pooled);
  net::awaitable<bool> run_exclusive(exchange& x, lease held, upstream_conn conn);
  net::awaitable<bool> run_on_slot(exchange& x, lease held, core::prepare_kind kind,
                                   upstream_conn conn, std::chrono::steady_clock::time_point t0);
  net::awaitable<bool> answer_abandoned(exchange& x);
  // What a stream route (stream_routes) answers and forwards through: x's client and forward.
  stream_route_io stream_io_of(exchange& x);

  const config::config cfg_;
  body_budget bodies_;
  upstream_table& upstreams_;
  const forwarder forwarder_;  // reaches upstreams_
  stream_routes streams_;  // reaches upstreams_
  const request_identity_reader identities_;

  std::mutex conns_mu_;
  std::set<std::shared_ptr<client_conn>> conns_;  // guarded by conns_mu_
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

}  // namespace kvp::proxy
