// The proxy: accepts client connections, reads requests, refuses /slots, sends inference
// requests through the coordinator's lease and relays every response as it streams.
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
#include "proxy/data/router_models.hpp"
#include "proxy/data/stream_directory.hpp"
#include "proxy/data/swap_groups.hpp"
#include "proxy/data/upstream_pool.hpp"

namespace kvp::proxy {

// Descriptors kvpersist keeps for everything but proxy clients: the process's own, each
// llama-server's idle pool, management calls and file pool, and the admin listener's cap.
std::uint64_t reserved_descriptors(const config::config& cfg);

// limits.maxConnections, clamped so that every proxy client can also hold an upstream
// connection without exhausting RLIMIT_NOFILE `nofile`: two descriptors per client beside
// reserved_descriptors(cfg). At least 1.
std::size_t proxy_connection_cap(const config::config& cfg, std::uint64_t nofile);

// The coordinator's options for server `sc` of configuration `cfg` (config::effective_servers).
coordinator_options options_for(const config::config& cfg, const config::server_config& sc);

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
  // One llama-server: its pool, its coordinator (own strand, own leases), its timeouts.
  struct upstream_entry {
    config::server_config cfg;
    std::shared_ptr<upstream_pool> pool;  // a router's models share the router's
    std::unique_ptr<coordinator> coord;
    relay_options relay;
    // A llama-server router (docs/design.md §15): this entry forwards, unmanaged, what names
    // no model of `router`; each model has its own entry, with `router_model` set and
    // `of_router` pointing at the router's models.
    std::unique_ptr<router_models> router;
    std::string router_model;
    router_models* of_router = nullptr;
  };
  std::unique_ptr<upstream_entry> make_entry(const config::server_config& sc,
                                             const std::string& state_dir,
                                             const std::string& router_model);
  static backends::http_endpoint endpoint_of(const config::server_config& sc);
  void build_swap_groups();
  // At start: each configured server that is a router gets an entry per model.
  net::awaitable<void> discover_routers();
  void add_router_models(upstream_entry& front, backends::router_info info);
  net::awaitable<void> before_router_request(upstream_entry& up, client_conn& c,
                                             std::string_view path);
  upstream_entry& route(const http::request<http::string_body>& req);
  // A router's entry for the model `req` names (body "model", or ?model= on a GET), else `up`.
  upstream_entry& model_entry(upstream_entry& up, const http::request<http::string_body>& req);
  upstream_entry* server_named(const std::string& name);
  // The credential a request carries: its Authorization value, else its X-Api-Key's.
  static std::string_view credential_header(const http::request<http::string_body>& req);
  net::awaitable<void> run_session(tcp_stream stream);
  net::awaitable<bool> handle(client_conn& c, http::request<http::string_body> req);
  net::awaitable<bool> forward(upstream_entry& up, client_conn& c,
                               http::request<http::string_body>& req,
                               std::optional<upstream_conn> pre, relay_state& st,
                               std::string* tail = nullptr);
  // Fills the request's credential, chain and content session; returns whether the body
  // opens with Claude Code's attribution block when it was chained (nullopt: not chained).
  std::optional<bool> describe_content(const http::request<http::string_body>& req,
                                       const core::request_class& rc,
                                       core::request_identity& who) const;
  bool client_may_use(const upstream_entry& up, const http::request<http::string_body>& req) const;
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
                                   prepare_result pr, upstream_conn conn,
                                   std::chrono::steady_clock::time_point t0);
  response prepare_failure(const prepare_result& pr,
                          const http::request<http::string_body>& req) const;
  // POST /lora-adapters: forwarded while the coordinator holds the whole server.
  net::awaitable<bool> forward_runtime_change(upstream_entry& up, client_conn& c,
                                              http::request<http::string_body>& req,
                                              relay_state& st);
  // Resumable streams (proxy/data/stream_routes.cpp): a request's X-Conversation-Id namespaced for
  // its credential and remembered with its server; replays, stops and lookups namespaced the
  // same way and sent to that server.
  // Returns the namespaced id (nullopt without X-Conversation-Id).
  std::optional<std::string> namespace_conversation(upstream_entry& up,
                                                    http::request<http::string_body>& req);
  bool abandoned(client_conn& c);
  net::awaitable<bool> departed(client_conn& c);
  net::awaitable<bool> answer_abandoned(client_conn& c, const http::request<http::string_body>& req);
  net::awaitable<bool> forward_stream_route(core::stream_route kind, client_conn& c,
                                            http::request<http::string_body>& req);
  net::awaitable<bool> forward_stream_lookup(upstream_entry& up, client_conn& c,
                                             http::request<http::string_body>& req,
                                             const core::namespaced_lookup& lookup);
  core::request_identity identity_of(const http::request<http::string_body>& req) const;
  void apply_harness_headers(const http::request<http::string_body>& req,
                             core::request_identity& id) const;
  void prepare_upstream_request(const upstream_entry& up,
                                http::request<http::string_body>& req) const;
  net::awaitable<bool> send(client_conn& c, response res);

  net::io_context& ioc_;
  config::config cfg_;
  body_budget bodies_;
  // The proxy port: at most proxy_connection_cap() clients, the rest wait in the backlog.
  std::unique_ptr<listener> listener_;
  std::vector<std::unique_ptr<upstream_entry>> ups_;
  stream_directory streams_;
  std::unique_ptr<swap_groups> swaps_;  // built once ups_ is
  std::unique_ptr<admin_server> admin_;
  std::string admin_address_;

  std::mutex conns_mu_;
  std::set<std::shared_ptr<client_conn>> conns_;  // guarded by conns_mu_
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

}  // namespace kvp::proxy
