#include "proxy/http/listener.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>

#include <fmt/format.h>

#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

// A warning that can repeat in a tight loop (accept failures while descriptors are
// exhausted, clients refused at the cap): logged at most once per second, with the count of
// the ones left out.
class rate_limited_warning {
 public:
  explicit rate_limited_warning(std::string event) : event_(std::move(event)) {}
  void note(std::string reason) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(1)) {
      ++suppressed_;
      return;
    }
    log(log_level::warn, event_,
        {{"reason", std::move(reason)}, {"suppressed", std::to_string(suppressed_)}});
    last_ = now;
    suppressed_ = 0;
  }

 private:
  std::string event_;
  std::chrono::steady_clock::time_point last_{};
  std::uint64_t suppressed_ = 0;
};

}  // namespace

listener::listener(net::io_context& ioc, std::unique_ptr<acceptor> bound, listener_options opts,
                   serve_fn serve)
    : ioc_(ioc),
      opts_(std::move(opts)),
      serve_(std::move(serve)),
      strand_(net::make_strand(ioc)),
      acceptor_(std::move(bound)),
      gate_(strand_),
      backoff_(strand_) {}

void listener::start() { net::co_spawn(strand_, accept_loop(), log_exception); }

void listener::stop() {
  net::post(strand_, [this] {
    stopped_ = true;
    beast::error_code ignored;
    acceptor_->close(ignored);
    gate_.cancel();
    backoff_.cancel();
  });
}

net::awaitable<void> listener::accept_loop() {
  using std::chrono::milliseconds;
  rate_limited_warning full(fmt::format("kv.{}.connections_full", opts_.name));
  rate_limited_warning failed(fmt::format("kv.{}.accept_failed", opts_.name));
  const std::string full_reason =
      fmt::format("{} client connections open ({})", opts_.max_connections, opts_.cap_setting);
  milliseconds pause{0};
  while (!stopped_) {
    // At the cap the proxy stops accepting, as HAProxy (maxconn) and nginx
    // (worker_connections) do, instead of accepting to answer 503: that accept would spend
    // the very descriptor that is short, and a client left in the kernel's listen backlog is
    // served as soon as a connection closes, where a 503 would make it retry blind. The check
    // and the wait are one handler on strand_, so connection_closed's wake-up cannot be lost.
    if (opts_.at_cap == when_full::wait && open_.load() >= opts_.max_connections) {
      full.note(full_reason);
      gate_.expires_at(steady_timer::time_point::max());
      co_await gate_.async_wait(token);
      continue;
    }
    tcp::socket sock(net::make_strand(ioc_));
    auto [ec] = co_await acceptor_->async_accept(sock);
    if (ec) {
      if (stopped_ || ec == net::error::operation_aborted) co_return;
      // After EMFILE/ENFILE the pending connection stays in the backlog and the listener
      // stays readable: accepting again at once fails again at once, a busy loop. Back off
      // 50 ms doubling to 1 s; a success resets it.
      failed.note(ec.message());
      pause = std::clamp(pause * 2, milliseconds(50), milliseconds(1000));
      backoff_.expires_after(pause);
      co_await backoff_.async_wait(token);
      continue;
    }
    pause = milliseconds(0);
    if (open_.load() >= opts_.max_connections) {  // when_full::refuse
      full.note(full_reason);
      refuse(sock);
      continue;
    }
    beast::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);
    auto ex = sock.get_executor();
    ++open_;
    net::co_spawn(ex, serve_(tcp_stream(std::move(sock))), [this](std::exception_ptr e) {
      connection_closed();
      log_exception(e);
    });
  }
}

void listener::refuse(tcp::socket& sock) const {
  beast::error_code ec;
  sock.non_blocking(true, ec);
  // A fresh socket's send buffer holds a short answer whole; a client that cannot take it
  // loses only the answer.
  if (!ec) sock.write_some(net::buffer(opts_.refusal), ec);
  sock.shutdown(tcp::socket::shutdown_send, ec);
  // Whatever the client has sent is read and dropped first: closing a socket with unread
  // bytes sends RST, which can make the client discard the answer before reading it.
  std::array<char, 4096> sink;
  for (int i = 0; i < 4; ++i) {
    const auto n = sock.read_some(net::buffer(sink), ec);
    if (ec || n == 0) break;
  }
  sock.close(ec);
}

void listener::connection_closed() {
  // Only accept_loop raises the count, and only below the cap; a decrement from the cap
  // wakes it (a cancel posted to strand_ runs after the loop's check-and-wait handler).
  if (open_.fetch_sub(1) >= opts_.max_connections) net::post(strand_, [this] { gate_.cancel(); });
}

}  // namespace kvp::proxy
