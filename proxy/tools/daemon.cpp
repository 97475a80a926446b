#include "proxy/tools/daemon.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

net::awaitable<void> stop_coordinator(coordinator* co) {
  co->stop();
  co_return;
}

// Polls every 20 ms until `s` has no request in flight or `deadline` passes; with
// `close_idle`, each poll also closes the connections that finished their request since.
net::awaitable<void> wait_for_requests(server& s, std::chrono::steady_clock::time_point deadline,
                                       bool close_idle) {
  steady_timer tick(co_await net::this_coro::executor);
  while (s.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    tick.expires_after(std::chrono::milliseconds(20));
    co_await tick.async_wait(token);
    if (close_idle) s.stop_reading();
  }
}

}  // namespace

// Descriptors the process holds besides client connections: standard streams, the event
// loop's own (epoll, eventfd, timerfd, the signal pipe), both listening sockets, sd_notify's
// socket, with room to spare.
constexpr std::uint64_t process_descriptors = 32;
// Per llama-server: its management calls and background probes (one connection each, a few
// at once), and its file pool's two workers with up to three files each (a manifest, its
// temp file, the directory).
constexpr std::uint64_t server_descriptors = 4 + 2 * 3;

std::uint64_t reserved_descriptors(const config::config& cfg) {
  std::uint64_t reserve = process_descriptors;
  for (const auto& sv : config::effective_servers(cfg))
    reserve += sv.upstream.max_idle_connections + server_descriptors;
  // The admin listener's own cap, and the one connection it may hold while refusing a client
  // over that cap.
  if (!cfg.admin.listen.empty()) reserve += cfg.admin.max_connections + 1;
  return reserve;
}

std::size_t proxy_connection_cap(const config::config& cfg, std::uint64_t nofile) {
  const std::uint64_t reserve = reserved_descriptors(cfg);
  const std::uint64_t fit = nofile > reserve + 2 ? (nofile - reserve) / 2 : 1;
  return static_cast<std::size_t>(std::min<std::uint64_t>(cfg.limits.max_connections, fit));
}

daemon::daemon(net::io_context& ioc, config::config cfg)
    : ioc_(ioc), cfg_(std::move(cfg)), upstreams_(ioc, cfg_), server_(cfg_, upstreams_) {}

daemon::~daemon() = default;

std::size_t daemon::proxy_connection_limit() const {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return cfg_.limits.max_connections;
  const std::size_t cap = proxy_connection_cap(cfg_, rl.rlim_cur);
  if (cap < cfg_.limits.max_connections)
    log(log_level::warn, "kv.proxy.connection_cap",
        {{"max_connections", std::to_string(cap)},
         {"configured", std::to_string(cfg_.limits.max_connections)},
         {"nofile", std::to_string(rl.rlim_cur)},
         {"reserved", std::to_string(reserved_descriptors(cfg_))},
         {"reason", "RLIMIT_NOFILE allows no more (raise LimitNOFILE / ulimit -n)"}});
  return cap;
}

net::awaitable<core::result<std::string>> daemon::start() {
  auto bound = listen_on(ioc_, cfg_.listen, "proxy");
  if (!bound) co_return bound.err();
  const std::string address = local_address(*bound.value());
  const std::size_t max_connections = proxy_connection_limit();
  co_await upstreams_.discover_routers();
  std::vector<coordinator*> coords;
  for (auto* up : upstreams_.managed()) {
    co_await up->coord->on_strand(up->coord->start());
    coords.push_back(up->coord.get());
  }
  if (!cfg_.admin.listen.empty()) {
    admin_ = std::make_unique<admin_server>(ioc_, coords, cfg_.admin);
    auto a = admin_->start();
    if (!a) co_return a.err();
    admin_address_ = a.value();
  }
  listener_options opts{"proxy", "limits.maxConnections", max_connections, when_full::wait, ""};
  listener_ = std::make_unique<listener>(ioc_, std::move(bound.value()), std::move(opts),
                                         [this](tcp_stream s) { return server_.serve(std::move(s)); });
  listener_->start();
  co_return address;
}

net::awaitable<void> daemon::shutdown() {
  server_.stop_reading();
  log(log_level::info, "kv.proxy.draining",
      {{"in_flight", std::to_string(server_.in_flight())},
       {"grace_ms", std::to_string(cfg_.shutdown_grace.count())}});
  if (listener_) listener_->stop();
  if (admin_) admin_->stop();
  co_await drain();
  co_await stop_coordinators();
}

net::awaitable<void> daemon::drain() {
  const auto grace_end = std::chrono::steady_clock::now() + cfg_.shutdown_grace;
  co_await wait_for_requests(server_, grace_end, true);
  if (server_.in_flight() == 0) co_return;
  log(log_level::warn, "kv.proxy.grace_expired",
      {{"cancelled", std::to_string(server_.in_flight())}});
  server_.close_all();
  const auto hard_end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  co_await wait_for_requests(server_, hard_end, false);
}

net::awaitable<void> daemon::stop_coordinators() {
  for (auto* up : upstreams_.managed()) {
    co_await up->coord->on_strand(stop_coordinator(up->coord.get()));
    if (cfg_.checkpoint.on_shutdown) {
      const auto saved = co_await up->coord->on_strand(up->coord->checkpoint());
      const bool ok = saved.ok();
      log(ok ? log_level::info : log_level::warn, "kv.shutdown.checkpoint",
          {{"server", up->cfg.name}, {"result", ok ? "ok" : "failed"}});
    }
  }
}

}  // namespace kvp::proxy
