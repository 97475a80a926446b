// The admin API on its own listener (default 127.0.0.1:8082): status, sessions, lifecycle
// hints from harnesses (flush, dispose), gc, Prometheus /metrics and /healthz.
// With admin.token set, every route except /healthz needs "Authorization: Bearer <token>".
// Every route except /healthz also refuses what a browser page elsewhere could send: a Host
// that is not ours (DNS rebinding), a foreign Origin, and POST/DELETE without
// "Content-Type: application/json" (cross-site request forgery).
// The dashboard (GET /ui, /ui/<file>) is static and holds no data: it passes the Host and
// Origin checks but not the token, which its script asks for and sends on every data request.
// GET /kv/events streams core::recent_events() as text/event-stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "backends/net.hpp"
#include "config/config.hpp"
#include "core/result.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/http/listener.hpp"

namespace kvp::proxy {

class admin_server {
 public:
  // `coords`: one per llama-server, the first is the default for session operations
  // (others are chosen with ?server=NAME). `cfg`: listen, token and connection cap.
  admin_server(net::io_context& ioc, std::vector<coordinator*> coords,
               const config::admin_config& cfg);

  // Binds and starts accepting: at most admin.maxConnections at once, a client beyond them
  // gets 503 with Retry-After and is closed. Returns the bound "host:port".
  core::result<std::string> start();
  void stop();

 private:
  // The answer to one request that is not an event stream.
  net::awaitable<http::response<http::string_body>> route(http::request<http::string_body> req);
  net::awaitable<void> run_session(tcp_stream s);
  net::awaitable<void> serve_events(tcp_stream& s, const http::request<http::string_body>& req);
  net::awaitable<void> stream_events(tcp_stream& s, std::uint64_t after);
  std::optional<response> credential_refusal(const http::request<http::string_body>& req) const;
  bool host_is_ours(std::string_view host_header) const;
  std::optional<std::string_view> cross_site_refusal(const http::request<http::string_body>& req) const;

  net::io_context& ioc_;
  std::vector<coordinator*> coords_;
  std::string listen_;
  std::string listen_host_;      // admin.listen's host (a name is served only with our port)
  std::uint16_t bound_port_ = 0;
  std::string token_;
  std::size_t max_connections_;
  std::unique_ptr<listener> listener_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> event_streams_{0};  // open GET /kv/events responses
  // Builds large responses (session listings) off the io_context's threads. Last member:
  // destroyed (joined) first.
  net::thread_pool formatter_{1};
};

}  // namespace kvp::proxy
