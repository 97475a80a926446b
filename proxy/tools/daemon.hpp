// What `kvpersist serve` runs, built and owned in one place (docs/architecture.md "Layers":
// the composition root): the table of llama-servers with their coordinators, the data plane's
// server, the admin API, and the proxy port's listener. It starts them in order and stops
// them gracefully (docs/design.md §16): drain, then each coordinator's shutdown checkpoint.
// The planes below it never see one another's objects except through what it hands them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/net.hpp"
#include "config/config.hpp"
#include "core/result.hpp"
#include "proxy/admin/admin.hpp"
#include "proxy/data/server.hpp"
#include "proxy/data/upstream_table.hpp"
#include "proxy/http/listener.hpp"

namespace kvp::proxy {

// Descriptors kvpersist keeps for everything but proxy clients: the process's own, each
// llama-server's idle pool, management calls and file pool, and the admin listener's cap.
std::uint64_t reserved_descriptors(const config::config& cfg);

// limits.maxConnections, clamped so that every proxy client can also hold an upstream
// connection without exhausting RLIMIT_NOFILE `nofile`: two descriptors per client beside
// reserved_descriptors(cfg). At least 1.
std::size_t proxy_connection_cap(const config::config& cfg, std::uint64_t nofile);

class daemon {
 public:
  // REQUIRES: cfg passed config::validate.
  daemon(net::io_context& ioc, config::config cfg);
  ~daemon();

  // Binds the proxy port (port 0 picks one), finds routers' models, starts the coordinators,
  // the admin API, then accepts clients. Returns the proxy's bound address as "host:port",
  // or an error message.
  net::awaitable<core::result<std::string>> start();
  // The admin listener's bound address ("" when disabled). Valid after start().
  const std::string& admin_address() const { return admin_address_; }

  // Graceful stop (docs/design.md §16): stop accepting, let in-flight requests finish
  // within shutdown_grace, close the rest, checkpoint the dirty slots, stop timers.
  net::awaitable<void> shutdown();

 private:
  // limits.maxConnections as RLIMIT_NOFILE allows it (proxy_connection_cap), warned when lower.
  std::size_t proxy_connection_limit() const;
  // Waits for the requests in flight: until the grace ends, then closes them.
  net::awaitable<void> drain();
  // Each coordinator stopped, and its dirty slots saved when checkpoint.onShutdown.
  net::awaitable<void> stop_coordinators();

  net::io_context& ioc_;
  const config::config cfg_;
  upstream_table upstreams_;
  server server_;  // reaches upstreams_
  std::unique_ptr<admin_server> admin_;
  std::string admin_address_;
  // The proxy port: at most proxy_connection_cap() clients, the rest wait in the backlog.
  std::unique_ptr<listener> listener_;
};

}  // namespace kvp::proxy
