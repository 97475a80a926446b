#include "proxy/data/upstream_pool.hpp"

#include <fmt/format.h>

#include "proxy/http/socket_peek.hpp"

namespace kvp::proxy {


std::unique_ptr<tcp_stream> upstream_pool::take_idle(const net::any_io_executor& ex) {
  for (;;) {
    std::unique_ptr<tcp_stream> s;
    {
      std::lock_guard lk(mu_);
      if (idle_.empty()) return nullptr;
      s = std::move(idle_.back());
      idle_.pop_back();
    }
    // an idle connection the server closed, or that holds bytes nobody asked for, is dropped
    if (peek_peer(s->socket().native_handle()) != peer_state::silent) continue;
    if (s->get_executor() == ex) return s;
    // Rebind to the caller's executor: the stream object moves, its socket stays open and
    // keeps its protocol (an IPv6 upstream's socket is not an IPv4 one).
    beast::error_code ec;
    const auto protocol = s->socket().local_endpoint(ec).protocol();
    if (ec) continue;
    auto sock = s->release_socket();
    return std::make_unique<tcp_stream>(tcp::socket(ex, protocol, sock.release()));
  }
}

net::awaitable<core::result<upstream_conn>> upstream_pool::acquire(net::any_io_executor ex) {
  if (auto s = take_idle(ex)) co_return upstream_conn{std::move(s), false};
  resolver res(ex);
  auto [rec, eps] = co_await res.async_resolve(ep_.host, std::to_string(ep_.port));
  if (rec)
    co_return core::error{core::errc::backend_unavailable, 0,
                          fmt::format("resolve {}: {}", ep_.host, rec.message())};
  auto s = std::make_unique<tcp_stream>(ex);
  s->expires_after(connect_timeout_);
  auto [cec, ep] = co_await s->async_connect(eps);
  if (cec)
    co_return core::error{cec == beast::error::timeout ? core::errc::operation_timeout
                                                       : core::errc::backend_unavailable,
                          0, fmt::format("connect {}:{}: {}", ep_.host, ep_.port, cec.message())};
  s->expires_never();
  beast::error_code nodelay_ec;  // an optimisation: a socket that refuses it still works
  s->socket().set_option(tcp::no_delay(true), nodelay_ec);
  co_return upstream_conn{std::move(s), true};
}

void upstream_pool::release(std::unique_ptr<tcp_stream> s) {
  s->expires_never();
  std::lock_guard lk(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(s));
}

}  // namespace kvp::proxy
