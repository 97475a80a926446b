// The proxy: accepts client connections, reads requests, refuses /slots, sends inference
// requests through the coordinator's lease and relays every response as it streams. Which
// llama-server a request goes to is upstream_table's; who the request is,
// request_identity_reader's; the resumable-stream routes, stream_routes'.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backends/net.hpp"
#include "config/config.hpp"
#include "proxy/admin/admin.hpp"
#include "proxy/http/body_budget.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/control/lease.hpp"
#include "core/resumable_stream.hpp"
#include "proxy/http/listener.hpp"
#include "proxy/http/relay.hpp"
#include "proxy/data/request_identity_reader.hpp"
#include "proxy/data/stream_routes.hpp"
#include "proxy/data/upstream_table.hpp"

namespace kvp::proxy {

// Descriptors kvpersist keeps for everything but proxy clients: the process's own, each
// llama-server's idle pool, management calls and file pool, and the admin listener's cap.
std::uint64_t reserved_descriptors(const config::config& cfg);

// limits.maxConnections, clamped so that every proxy client can also hold an upstream
// connection without exhausting RLIMIT_NOFILE `nofile`: two descriptors per client beside
// reserved_descriptors(cfg). At least 1.
std::size_t proxy_connection_cap(const config::config& cfg, std::uint64_t nofile);

class server {
 public:
  // REQUIRES: cfg passed config::validate.
  server(net::io_context& ioc, config::config cfg);
  ~server();

  // Binds the listener (port 0 picks one), starts the coordinator and the admin API.
  // Returns the bound address as "host:port", or an error message.
  net::awaitable<core::result<std::string>> start();
  // The admin listener's bound address ("" when disabled). Valid after start().
  const std::string& admin_address() const { return admin_address_; }

  // Graceful stop (docs/design.md §16): stop accepting, let in-flight requests finish
  // within shutdown_grace, close the rest, checkpoint the dirty slot, stop timers.
  net::awaitable<void> shutdown();

 private:
  struct client_conn;
  net::awaitable<void> run_session(tcp_stream stream);
  net::awaitable<bool> handle(client_conn& c, http::request<http::string_body> req);
  net::awaitable<void> before_router_request(upstream_entry& up, client_conn& c,
                                             std::string_view path);
  // POST /lora-adapters: forwarded while the coordinator holds the whole server.
  net::awaitable<bool> forward_runtime_change(upstream_entry& up, client_conn& c,
                                              http::request<http::string_body>& req,
                                              relay_state& st);
  net::awaitable<bool> handle_under_lease(upstream_entry& up, client_conn& c,
                                          http::request<http::string_body>& req,
                                          const core::request_class& rc,
                                          const core::request_identity& who);
  // Persistence off: forwarded untouched; `ticket` (no slot) ends with the response.
  net::awaitable<bool> pass_through(upstream_entry& up, client_conn& c,
                                    http::request<http::string_body>& req, lease ticket,
                                    std::optional<upstream_conn> pooled);
  net::awaitable<bool> run_exclusive(upstream_entry& up, client_conn& c,
                                     http::request<http::string_body>& req, lease held,
                                     upstream_conn conn);
  net::awaitable<bool> run_on_slot(upstream_entry& up, client_conn& c,
                                   http::request<http::string_body>& req, lease held,
                                   core::prepare_kind kind, upstream_conn conn,
                                   std::chrono::steady_clock::time_point t0);
  bool abandoned(client_conn& c);
  net::awaitable<bool> departed(client_conn& c);
  net::awaitable<bool> answer_abandoned(client_conn& c, const http::request<http::string_body>& req);
  net::awaitable<bool> forward(upstream_entry& up, client_conn& c,
                               http::request<http::string_body>& req,
                               std::optional<upstream_conn> pre, relay_state& st,
                               std::string* tail = nullptr);
  // What a stream route (stream_routes) answers and forwards through: `c`'s send and forward.
  stream_route_io stream_io_of(client_conn& c);
  net::awaitable<bool> send(client_conn& c, response res);

  net::io_context& ioc_;
  config::config cfg_;
  body_budget bodies_;
  // The proxy port: at most proxy_connection_cap() clients, the rest wait in the backlog.
  std::unique_ptr<listener> listener_;
  upstream_table upstreams_;
  stream_routes streams_;  // reaches upstreams_
  const request_identity_reader identities_;
  std::unique_ptr<admin_server> admin_;
  std::string admin_address_;

  std::mutex conns_mu_;
  std::set<std::shared_ptr<client_conn>> conns_;  // guarded by conns_mu_
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

}  // namespace kvp::proxy
