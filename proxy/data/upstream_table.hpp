// The table of llama-servers behind the proxy (docs/design.md §15): one entry per configured
// server, each with its connection pool and its coordinator, plus one per model of a
// llama-server router; and how a request picks its entry (routes:, then a router's model).
//
// Owns the entries, their pools and coordinators (not started: the server starts and stops
// them), the swap groups and a copy of the configuration.
// Threads: discover_routers and add_router_models run once, at start, before any request is
// read. Afterwards the table does not change: route, model_entry, server_named and
// prepare_request are called from every connection's strand at once, and only read.
// REQUIRES: the configuration passed config::validate; the io_context outlives the table.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/llama_router.hpp"
#include "backends/net.hpp"
#include "config/config.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/data/router_models.hpp"
#include "proxy/data/swap_groups.hpp"
#include "proxy/data/upstream_pool.hpp"
#include "proxy/http/relay.hpp"

namespace kvp::proxy {

// The coordinator's options for server `sc` of configuration `cfg` (config::effective_servers).
coordinator_options options_for(const config::config& cfg, const config::server_config& sc);

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

// The model a llama-server router reads in `req` (docs/llama-server.md §14): a POST's body
// "model", ?model= on a GET or HEAD (its query decoded as the router decodes it), else "".
// An error (a 400 for the client) for a POST body kvpersist's JSON parser cannot read: the
// router's parser may still read a model in it (docs/design.md §15).
core::result<std::string> router_request_model(const http::request<http::string_body>& req);

class upstream_table {
 public:
  // One entry per server of config::effective_servers(cfg), in configuration order.
  upstream_table(net::io_context& ioc, config::config cfg);
  ~upstream_table();

  // At start: each configured server that is a router gets an entry per model.
  net::awaitable<void> discover_routers();
  // `front`, a configured server, is the router `info` describes: one entry per model,
  // named "<server>/<model>", appended after the configured servers.
  void add_router_models(upstream_entry& front, backends::router_info info);

  // The first of the configuration's routes that `req` matches (its header, its body's
  // "model"), else the first server.
  upstream_entry& route(const http::request<http::string_body>& req);
  // A router's entry for the model router_request_model reads in `req`, else `up`. Its
  // error for a request to a router: forwarded through the router's own entry, such a body
  // would run, and load its model, unmanaged (docs/design.md §15).
  core::result<upstream_entry*> model_entry(upstream_entry& up,
                                            const http::request<http::string_body>& req);
  // The entry named `name` (a configured server, or "<router>/<model>"); nullptr when none.
  upstream_entry* server_named(const std::string& name);

  // The entries whose coordinators manage slots: every entry but a router's own (its
  // models' coordinators manage its slots).
  std::vector<upstream_entry*> managed();
  // Servers of which only one runs at a time; built from the configured servers.
  swap_groups& swaps() { return *swaps_; }

  // `req` as `up`'s llama-server is sent it: kvpersist's session, purpose and strip headers
  // and hop-by-hop fields gone, Host and the base path of `up`'s URL, HTTP/1.1 keep-alive.
  void prepare_request(const upstream_entry& up, http::request<http::string_body>& req) const;

 private:
  std::unique_ptr<upstream_entry> make_entry(const config::server_config& sc,
                                             const std::string& state_dir,
                                             const std::string& router_model);

  net::io_context& ioc_;
  const config::config cfg_;
  std::vector<std::unique_ptr<upstream_entry>> ups_;
  std::unique_ptr<swap_groups> swaps_;
};

}  // namespace kvp::proxy
