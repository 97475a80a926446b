#include "proxy/data/client_conn.hpp"

#include "proxy/http/socket_peek.hpp"

namespace kvp::proxy {

namespace {

// Polls a held conversation request's stop: it completes only when a stop names the id.
net::awaitable<bool> until_conversation_stopped(const stream_hold& pending) {
  steady_timer poll(co_await net::this_coro::executor);
  while (!pending.stopped()) {
    poll.expires_after(std::chrono::milliseconds(100));
    co_await poll.async_wait(token);
  }
  co_return true;
}

}  // namespace

client_conn::client_conn(tcp_stream s, std::chrono::milliseconds write_limit)
    : stream(std::move(s)), write_timeout(write_limit) {}

net::awaitable<bool> client_conn::send(response res) {
  const bool keep = res.keep_alive();
  stream.expires_after(write_timeout);
  auto [ec, n] = co_await http::async_write(stream, res);
  co_return keep && !ec;
}

bool client_conn::hung_up() {
  return peek_peer(stream.socket().native_handle()) == peer_state::hung_up;
}

net::awaitable<bool> client_conn::gone() {
  auto [ec] = co_await stream.socket().async_wait(tcp::socket::wait_read, token);
  if (ec || hung_up()) co_return true;
  steady_timer forever(co_await net::this_coro::executor);
  forever.expires_at(steady_timer::time_point::max());
  co_await forever.async_wait(token);
  co_return false;
}

bool client_conn::abandoned() { return pending.active() ? pending.stopped() : hung_up(); }

net::awaitable<bool> client_conn::departed() {
  if (pending.active()) co_return co_await until_conversation_stopped(pending);
  co_return co_await gone();
}

}  // namespace kvp::proxy
