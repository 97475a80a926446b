#include "proxy/data/forwarder.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "core/log.hpp"
#include "core/resumable_stream.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/http/socket_peek.hpp"

namespace kvp::proxy {

using namespace net::experimental::awaitable_operators;
using core::log;
using core::log_level;

namespace {

// A connection opened before a long prepare (restores, a router loading the model) may have
// been closed by llama-server's keep-alive timeout meanwhile (5 s in its HTTP library): a
// peek sees the close, and a new connection carries the request.
std::optional<upstream_conn> unless_closed_meanwhile(std::optional<upstream_conn> pre) {
  if (pre && peek_peer(pre->stream->socket().native_handle()) != peer_state::silent) {
    pre->stream->close();
    pre.reset();
  }
  return pre;
}

// A pooled or new connection to `up`'s llama-server. A new one may mean a new llama-server
// process (a restart closes the old ones), and a failure is trouble: either way the next
// coordinated request re-reads /props first.
net::awaitable<core::result<upstream_conn>> connect_upstream(upstream_entry& up,
                                                             net::any_io_executor ex) {
  auto conn = co_await up.pool->acquire(ex);
  if (!conn || conn->fresh) up.coord->note_upstream_trouble();
  co_return conn;
}

// An upstream connection whose response was read whole goes back to the pool; any other is
// closed (closing is also how a request still running is cancelled).
void give_back_or_close(upstream_pool& pool, upstream_conn& conn, const relay_state& st) {
  if (st.upstream_reusable)
    pool.release(std::move(conn.stream));
  else
    conn.stream->close();
}

}  // namespace

bool retry_on_new_connection(const relay_state& st, bool fresh, int attempt) {
  return !st.header_received && st.end != relay_end::upstream_timed_out && !fresh && attempt == 0;
}

core::error upstream_failure(relay_end end) {
  if (end == relay_end::upstream_timed_out)
    return core::error{core::errc::upstream_timeout, 0, "upstream llama-server timed out"};
  return core::error{core::errc::upstream_closed, 0, "upstream llama-server closed the connection"};
}

forwarder::forwarder(const upstream_table& upstreams) : upstreams_(upstreams) {}

net::awaitable<bool> forwarder::forward(exchange& x, std::optional<upstream_conn> pre,
                                        std::string* tail) const {
  auto& up = *x.up;
  upstreams_.prepare_request(up, x.req);
  // With X-Conversation-Id llama-server keeps generating after the client leaves: the
  // response is read to its end, and the lease held as long (docs/design.md §21).
  relay_options relay = up.relay;
  relay.outlives_client = x.req.find(core::conversation_header) != x.req.end();
  std::optional<upstream_conn> conn = unless_closed_meanwhile(std::move(pre));
  for (int attempt = 0;; ++attempt) {
    if (!conn) {
      auto opened = co_await connect_upstream(up, x.client.stream.get_executor());
      if (!opened)
        co_return co_await answer_error(x, unreachable_upstream(opened.err()), opened.err().message);
      conn = std::move(opened.value());
    }
    const attempt_end end = co_await relay_once(x, *conn, relay, tail);
    if (end == attempt_end::client_left) {
      // Closing the upstream connection is the only portable cancel: llama-server notices
      // within about a second and frees the slot (docs/llama-server.md §6). A response
      // already read whole needs no cancel.
      give_back_or_close(*up.pool, *conn, x.relayed);
      co_return false;
    }
    if (end == attempt_end::final || !retry_on_new_connection(x.relayed, conn->fresh, attempt))
      break;
    up.coord->note_upstream_trouble();
    conn.reset();
  }
  give_back_or_close(*up.pool, *conn, x.relayed);
  co_return co_await answer_relay_end(x);
}

net::awaitable<forwarder::attempt_end> forwarder::relay_once(exchange& x, upstream_conn& conn,
                                                             const relay_options& relay,
                                                             std::string* tail) const {
  relay_state& st = x.relayed;
  st = relay_state{};
  conn.stream->expires_after(relay.upstream_idle);
  x.client.pending.end();  // from here llama-server knows the conversation id
  auto [wec, wn] = co_await http::async_write(*conn.stream, x.req);
  st.request_sent = !wec;
  if (wec) co_return attempt_end::relayed;
  // Beast reads at most max(512, capacity - size) bytes per read_some: without room, a 45 KB
  // SSE event would be forwarded in ~90 pieces of 512 bytes.
  beast::flat_buffer ubuf;
  ubuf.reserve(64 * 1024);
  if (tail) tail->clear();
  const bool head = x.req.method() == http::verb::head;
  if (relay.outlives_client) {
    co_await relay_response(*conn.stream, ubuf, x.client.stream, x.version, x.keep_alive, head,
                            relay, st, tail);
    co_return attempt_end::final;
  }
  auto r = co_await (relay_response(*conn.stream, ubuf, x.client.stream, x.version, x.keep_alive,
                                    head, relay, st, tail) ||
                     x.client.gone());
  if (r.index() == 0) co_return attempt_end::relayed;
  end_with(st, relay_end::client_gone);
  co_return attempt_end::client_left;
}

net::awaitable<bool> forwarder::answer_relay_end(exchange& x) const {
  const relay_state& st = x.relayed;
  if (st.end == relay_end::delivered) co_return st.client_keep_alive;
  if (st.end == relay_end::client_gone) co_return false;
  x.up->coord->note_upstream_trouble();
  if (!st.header_sent) co_return co_await answer_error(x, upstream_failure(st.end));
  log(log_level::warn, "kv.upstream.broken_stream",
      {{"status", std::to_string(st.status)}, {"bytes", std::to_string(st.body_bytes)}});
  co_return false;
}

}  // namespace kvp::proxy
