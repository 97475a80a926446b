#include "proxy/data/server.hpp"

#include <sys/resource.h>

#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>

#include <fmt/format.h>

#include "core/json.hpp"
#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "core/reply_end.hpp"
#include "core/request_hints.hpp"
#include "core/response_timings.hpp"
#include "proxy/http/listen.hpp"
#include "core/request_rewrite.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/http/request_reader.hpp"
#include "proxy/http/socket_peek.hpp"

namespace kvp::proxy {

using namespace net::experimental::awaitable_operators;
using core::log;
using core::log_level;

struct server::client_conn {
  explicit client_conn(tcp_stream s) : stream(std::move(s)) {}
  tcp_stream stream;
  beast::flat_buffer buf;
  bool busy = false;  // guarded by conns_mu_
  // The request in hand's conversation id while kvpersist holds it (stream_directory.hpp).
  stream_hold pending;
};

namespace {

using client_socket = tcp_stream::socket_type;

bool client_hung_up(client_socket& sock) {
  return peek_peer(sock.native_handle()) == peer_state::hung_up;
}

// Completes when the client hangs up (EOF or reset) while we wait on something else.
// Consumes no bytes: a pipelined next request is left in the socket, and then the watcher
// simply waits until it is cancelled.
net::awaitable<bool> client_gone(client_socket& sock) {
  auto [ec] = co_await sock.async_wait(tcp::socket::wait_read, token);
  if (ec || client_hung_up(sock)) co_return true;
  steady_timer forever(co_await net::this_coro::executor);
  forever.expires_at(steady_timer::time_point::max());
  co_await forever.async_wait(token);
  co_return false;
}

// Polls a held conversation request's stop: it completes only when a stop names the id.
net::awaitable<bool> until_stopped(const stream_hold& pending) {
  steady_timer poll(co_await net::this_coro::executor);
  while (!pending.stopped()) {
    poll.expires_after(std::chrono::milliseconds(100));
    co_await poll.async_wait(token);
  }
  co_return true;
}

// An upstream connection whose response was read whole goes back to the pool; any other is
// closed (closing is also how a request still running is cancelled).
void give_back_or_close(upstream_pool& pool, upstream_conn& conn, const relay_state& st) {
  if (st.upstream_reusable)
    pool.release(std::move(conn.stream));
  else
    conn.stream->close();
}

// How client requests are read: the configured limits, and the fields
// upstream_table::prepare_request drops (they do not count against llama-server's limits).
read_limits client_read_limits(const config::config& cfg) {
  read_limits r{cfg.limits.max_header_bytes, cfg.limits.max_body_bytes, cfg.limits.header_timeout,
                cfg.limits.client_write_timeout, cfg.limits.client_write_timeout,
                cfg.sessions.headers};
  r.dropped_fields.push_back(cfg.sessions.purpose_header);
  r.dropped_fields.insert(r.dropped_fields.end(), cfg.sessions.strip_headers.begin(),
                          cfg.sessions.strip_headers.end());
  return r;
}

// A slot that could not be leased in time, or a queue that is full.
core::error slot_busy(acquisition::outcome what) {
  return core::error{core::errc::slot_busy, 0,
                     what == acquisition::outcome::rejected
                         ? "too many requests are waiting for the slot"
                         : "timed out waiting for the slot",
                     2};
}

// What is refused before a request is routed: a body nested deeper than the JSON parser
// reads, and /slots in any encoding (kvpersist manages the slots).
std::optional<core::error> refusal_before_routing(const http::request<http::string_body>& req,
                                                  const core::request_class& rc) {
  if (core::json_nesting_exceeds(req.body()))
    return core::error{core::errc::request_refused, 0,
                       fmt::format("request body: JSON nested deeper than {} levels",
                                   core::json_max_depth)};
  if (rc.kind == core::endpoint_kind::slots)
    return core::error{core::errc::route_forbidden, 0,
                       "kvpersist manages llama-server's slots; /slots is not forwarded"};
  return std::nullopt;
}

// llama-server's Vertex AI prediction route (AIP_MODE=PREDICTION) runs up to 128 instances
// at once, each dispatched to any route its "@requestFormat" names: "slots" (the slot API:
// save, restore, erase behind kvpersist's back) as well as inference. Treating it as
// exclusive would still let an instance rewrite the slot while kvpersist's manifests
// vouch for it, so it is refused like /slots.
core::error prediction_refused() {
  return core::error{core::errc::route_forbidden, 0,
                     "kvpersist manages llama-server's slots; the prediction route "
                     "(upstream.predictRoute) is not forwarded"};
}

// A slot kvpersist could not prepare: the coordinator's error, with its Retry-After (a limit
// says why itself; a failure says what could not be done).
response prepare_failure(const core::error& e, const http::request<http::string_body>& req) {
  core::error failed = e;
  if (e.retry_after_s == 0)
    failed.message = fmt::format("kvpersist could not prepare the slot: {}", e.message);
  return error_answer(failed, req.version(), req.keep_alive());
}

// The router's routes that list its models: they start and stop none.
bool lists_router_models(std::string_view path) {
  return path == "/models" || path == "/models/sse" || path == "/v1/models";
}

// A router's request naming a model kvpersist does not manage (docs/design.md §15): one the
// router gained since kvpersist started may still make it unload a managed model, so their
// sessions are saved first where it would. An unload of such a model unloads no other.
net::awaitable<void> before_unmanaged_model(router_models& router,
                                            const http::request<http::string_body>& req,
                                            std::string_view path) {
  if (lists_router_models(path) || path == "/models/unload") co_return;
  const auto model = router_request_model(req);
  if (!model || model->empty()) co_return;
  co_await router.before_unmanaged(model.value());
}

net::awaitable<void> stop_coordinator(coordinator* co) {
  co->stop();
  co_return;
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

server::server(net::io_context& ioc, config::config cfg)
    : ioc_(ioc),
      cfg_(std::move(cfg)),
      bodies_(cfg_.limits.max_buffered_body_bytes),
      upstreams_(ioc, cfg_),
      streams_(upstreams_),
      identities_(cfg_.sessions) {}

// The router's own routes for its models (docs/llama-server.md §14): an unload saves that
// model's sessions first, a load the running models' when one must make room; any other
// request naming the model may make the router start it.
net::awaitable<void> server::before_router_request(upstream_entry& up, client_conn& c,
                                                   std::string_view path) {
  const auto& m = *up.of_router->find(up.router_model);
  const std::function<bool()> wanted = [this, &c] { return !abandoned(c); };
  if (path == "/models/unload") co_return co_await up.of_router->before_unload(m);
  if (path == "/models/load") co_return co_await up.of_router->before_serving(m, false, wanted);
  if (lists_router_models(path)) co_return;
  co_await up.of_router->before_serving(m, true, wanted);
}

server::~server() = default;

net::awaitable<core::result<std::string>> server::start() {
  auto bound = listen_on(ioc_, cfg_.listen, "proxy");
  if (!bound) co_return bound.err();
  const std::string address = local_address(*bound.value());
  std::size_t max_connections = cfg_.limits.max_connections;
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    max_connections = proxy_connection_cap(cfg_, rl.rlim_cur);
    if (max_connections < cfg_.limits.max_connections)
      log(log_level::warn, "kv.proxy.connection_cap",
          {{"max_connections", std::to_string(max_connections)},
           {"configured", std::to_string(cfg_.limits.max_connections)},
           {"nofile", std::to_string(rl.rlim_cur)},
           {"reserved", std::to_string(reserved_descriptors(cfg_))},
           {"reason", "RLIMIT_NOFILE allows no more (raise LimitNOFILE / ulimit -n)"}});
  }
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
                                         [this](tcp_stream s) { return run_session(std::move(s)); });
  listener_->start();
  co_return address;
}

net::awaitable<bool> server::send(client_conn& c, response res) {
  const bool keep = res.keep_alive();
  c.stream.expires_after(cfg_.limits.client_write_timeout);
  auto [ec, n] = co_await http::async_write(c.stream, res);
  co_return keep && !ec;
}

stream_route_io server::stream_io_of(client_conn& c) {
  return {
      .answer = [this, &c](response res) { return send(c, std::move(res)); },
      .forward = [this, &c](upstream_entry& up, http::request<http::string_body>& req,
                            relay_state& st) { return forward(up, c, req, std::nullopt, st); },
  };
}

net::awaitable<void> server::run_session(tcp_stream stream) {
  auto c = std::make_shared<client_conn>(std::move(stream));
  {
    std::lock_guard lk(conns_mu_);
    conns_.insert(c);
  }
  const read_limits limits = client_read_limits(cfg_);
  for (;;) {
    if (draining_) break;
    request_reader reader(c->stream, c->buf, limits);
    if (!co_await reader.read_header()) break;
    {
      std::lock_guard lk(conns_mu_);
      c->busy = true;
    }
    ++active_;
    bool keep = false;
    body_budget::hold body_share(bodies_);  // returned when this request is done
    if (co_await reader.read_body(&body_share)) {
      c->stream.expires_never();
      try {
        keep = co_await handle(*c, reader.release());
        c->pending.end();
      } catch (const std::exception& e) {
        // A bug, not an I/O outcome: log it and drop the connection, but never leak it.
        log(log_level::error, "kv.internal.exception", {{"what", e.what()}});
      }
    }
    --active_;
    {
      std::lock_guard lk(conns_mu_);
      c->busy = false;
    }
    if (!keep) break;
  }
  beast::error_code ignored;
  c->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  c->stream.close();
  std::lock_guard lk(conns_mu_);
  conns_.erase(c);
}

net::awaitable<bool> server::forward_runtime_change(upstream_entry& up, client_conn& c,
                                                    http::request<http::string_body>& req,
                                                    relay_state& st) {
  // Without llama-server's key the request changes nothing (it answers 401): no need to
  // save every session first.
  if (!client_may_use(up.cfg.upstream.api_key, req))
    co_return co_await forward(up, c, req, std::nullopt, st);
  auto acq = co_await begin_runtime_change(*up.coord, cfg_.queue.timeout,
                                            [&c] { return client_gone(c.stream.socket()); });
  using outcome = acquisition::outcome;
  if (acq.what == outcome::client_gone) co_return false;
  if (acq.what == outcome::runtime_change_pending) {
    const core::error pending{
        core::errc::runtime_change_pending, 0,
        "another runtime change (POST /lora-adapters) is waiting or running; retry after it", 1};
    co_return co_await send(c, error_answer(pending, req.version(), req.keep_alive()));
  }
  if (acq.what != outcome::granted)
    co_return co_await send(c, error_answer(slot_busy(acq.what), req.version(), true));
  // The saves before it took time: a client that left meanwhile has its change dropped, never
  // forwarded (its lease goes back with `acq.held`).
  if (client_hung_up(c.stream.socket())) co_return false;
  const bool keep = co_await forward(up, c, req, std::nullopt, st);
  co_await end_runtime_change(std::move(acq.held), st.request_sent);
  co_return keep;
}

net::awaitable<bool> server::forward(upstream_entry& up, client_conn& c,
                                     http::request<http::string_body>& req,
                                     std::optional<upstream_conn> pre, relay_state& st,
                                     std::string* tail) {
  const unsigned version = req.version();
  const bool client_keep = req.keep_alive();
  const bool head = req.method() == http::verb::head;
  auto ex = c.stream.get_executor();
  upstreams_.prepare_request(up, req);
  // With X-Conversation-Id llama-server keeps generating after the client leaves: the
  // response is read to its end, and the lease held as long (docs/design.md §21).
  relay_options relay = up.relay;
  relay.outlives_client = req.find(core::conversation_header) != req.end();
  std::optional<upstream_conn> conn = std::move(pre);
  // A connection opened before a long prepare (restores, a router loading the model) may have
  // been closed by llama-server's keep-alive timeout meanwhile (5 s in its HTTP library): a
  // peek sees the close, and a new connection carries the request.
  if (conn && peek_peer(conn->stream->socket().native_handle()) != peer_state::silent) {
    conn->stream->close();
    conn.reset();
  }
  for (int attempt = 0;; ++attempt) {
    if (!conn) {
      auto r = co_await up.pool->acquire(ex);
      if (!r) {
        up.coord->note_upstream_trouble();
        co_return co_await send(c, error_answer(unreachable_upstream(r.err()), version,
                                                client_keep, r.err().message));
      }
      conn = std::move(r.value());
      // A new connection may mean a new llama-server process (a restart closes the old
      // ones): let the next coordinated request re-read /props first.
      if (conn->fresh) up.coord->note_upstream_trouble();
    }
    st = relay_state{};
    conn->stream->expires_after(up.relay.upstream_idle);
    c.pending.end();  // from here llama-server knows the conversation id
    auto [wec, wn] = co_await http::async_write(*conn->stream, req);
    st.request_sent = !wec;
    if (!wec) {
      // Beast reads at most max(512, capacity - size) bytes per read_some: without room,
      // a 45 KB SSE event would be forwarded in ~90 pieces of 512 bytes.
      beast::flat_buffer ubuf;
      ubuf.reserve(64 * 1024);
      if (tail) tail->clear();
      if (relay.outlives_client) {
        co_await relay_response(*conn->stream, ubuf, c.stream, version, client_keep, head, relay, st, tail);
        break;
      }
      auto r = co_await (relay_response(*conn->stream, ubuf, c.stream, version, client_keep, head,
                                        relay, st, tail) ||
                         client_gone(c.stream.socket()));
      if (r.index() == 1) {
        // Closing the upstream connection is the only portable cancel: llama-server notices
        // within about a second and frees the slot (docs/llama-server.md §6). A response
        // already read whole needs no cancel.
        end_with(st, relay_end::client_gone);
        give_back_or_close(*up.pool, *conn, st);
        co_return false;
      }
    }
    // A pooled connection the server had already closed: retry once on a new one. The
    // server never saw the request, so nothing ran twice.
    if (!st.header_received && st.end != relay_end::upstream_timed_out && !conn->fresh && attempt == 0) {
      up.coord->note_upstream_trouble();
      conn.reset();
      continue;
    }
    break;
  }
  give_back_or_close(*up.pool, *conn, st);
  if (st.end == relay_end::delivered) co_return st.client_keep_alive;
  if (st.end == relay_end::client_gone) co_return false;
  up.coord->note_upstream_trouble();
  if (!st.header_sent) {
    const core::error failed =
        st.end == relay_end::upstream_timed_out
            ? core::error{core::errc::upstream_timeout, 0, "upstream llama-server timed out"}
            : core::error{core::errc::upstream_closed, 0,
                          "upstream llama-server closed the connection"};
    co_return co_await send(c, error_answer(failed, version, client_keep));
  }
  log(log_level::warn, "kv.upstream.broken_stream",
      {{"status", std::to_string(st.status)}, {"bytes", std::to_string(st.body_bytes)}});
  co_return false;  // mid-body: close so the client sees a truncated response, not a clean end
}

// The request path (docs/architecture.md): refuse what must never reach llama-server, pick
// the server, and either forward untouched or run the request under a slot lease.
net::awaitable<bool> server::handle(client_conn& c, http::request<http::string_body> req) {
  const unsigned version = req.version();
  const bool keep = req.keep_alive();
  const auto rc = core::classify(req.method_string(), req.target());
  if (auto no = refusal_before_routing(req, rc))
    co_return co_await send(c, error_answer(*no, version, keep));
  // Resumable-stream routes are passthrough paths: an inference request is not decoded again.
  if (rc.stream != core::stream_route::none)
    co_return co_await streams_.forward(rc.stream, req, stream_io_of(c));
  auto who = identities_.identity_of(req);
  auto entry = upstreams_.model_entry(upstreams_.route(req), req);
  if (!entry) co_return co_await send(c, error_answer(entry.err(), version, keep));
  auto& up = *entry.value();
  c.pending = streams_.hold_conversation(up, req);
  if (rc.is_prediction(up.cfg.upstream.predict_route))
    co_return co_await send(c, error_answer(prediction_refused(), version, keep));
  relay_state st;
  // A router's request for no model kvpersist manages: the router picks (or refuses) it.
  if (up.router) {
    if (client_may_use(up.cfg.upstream.api_key, req))
      co_await before_unmanaged_model(*up.router, req, rc.path);
    co_return co_await forward(up, c, req, std::nullopt, st);
  }
  // A router starts the model a request names, and may unload another to do so; a client
  // without the key makes nothing move (the router answers it 401).
  if (up.of_router && client_may_use(up.cfg.upstream.api_key, req)) {
    co_await before_router_request(up, c, rc.path);
    // A client that left meanwhile is not served: the router drops a queued request whose
    // client left, and forwarding it would make the router load its model after all. A
    // conversation request is served unless stopped, as the router serves it.
    if (abandoned(c)) co_return co_await answer_abandoned(c, req);
  }
  if (rc.changes_runtime) co_return co_await forward_runtime_change(up, c, req, st);
  const bool needs_slot = rc.needs_slot;
  // Checked before the body is parsed or the request admitted, as llama-server would check
  // it: a client without the key costs no parse and cannot make kvpersist save or evict the
  // resident session.
  if (needs_slot && !client_may_use(up.cfg.upstream.api_key, req)) {
    const core::error invalid_key{core::errc::credential_refused, 0, "Invalid API Key"};
    auto res = error_answer(invalid_key, version, keep);
    co_return co_await send(c, std::move(res));
  }
  if (needs_slot) {
    // README "Harnesses": what keeps this harness's new conversations cold, told, not
    // rewritten; read from the chain when the body was chained (parsed once).
    const auto chained = identities_.describe_content(req, rc, who);
    if (chained ? *chained : core::has_attribution_header(req.target(), req.body()))
      up.coord->hints().note(core::hint_id::attribution_header);
  }
  // A swap group's other servers save their sessions before this one's process replaces theirs.
  if (needs_slot) co_await upstreams_.swaps().before_serving(up.cfg.name);
  // docs/design.md §24: a request passes the lease, and the door, uncoordinated only where the
  // scope lets anyone run on anything (proxy/tools/main.cpp warns of the rest).
  const bool passes_by = cfg_.sessions.unmanaged == config::unmanaged_policy::passthrough &&
                         cfg_.sharing == config::sharing_scope::instance;
  const bool coordinated = needs_slot && (!who.session_id.empty() || !passes_by);
  if (!coordinated) co_return co_await forward(up, c, req, std::nullopt, st);
  co_return co_await handle_under_lease(up, c, req, rc, who);
}

// A request nobody waits for any more: its client hung up, or, for a conversation request
// kvpersist holds (which outlives its client, as in llama-server), a stop named its id.
bool server::abandoned(client_conn& c) {
  return c.pending.active() ? c.pending.stopped() : client_hung_up(c.stream.socket());
}

// Completes when the request becomes abandoned while it waits (for the slot's lease).
net::awaitable<bool> server::departed(client_conn& c) {
  if (c.pending.active()) co_return co_await until_stopped(c.pending);
  co_return co_await client_gone(c.stream.socket());
}

// A stopped conversation request is answered as the router answers one it held (its client
// may still be there); a client that hung up gets nothing.
net::awaitable<bool> server::answer_abandoned(client_conn& c,
                                              const http::request<http::string_body>& req) {
  if (!c.pending.stopped()) co_return false;
  log(log_level::info, "kv.stream.stopped_before_forward", {});
  const core::error cancelled{core::errc::request_refused, 0,
                              "request cancelled by a stop (DELETE /v1/stream) before it "
                              "reached llama-server"};
  co_return co_await send(c, error_answer(cancelled, req.version(), req.keep_alive()));
}

// Acquire, prepare, forward, finish (docs/design.md §5). A pooled upstream connection taken
// before asking for the lease lets acquire prepare in the same trip (a pooled connection
// says the server has not restarted under it); it goes back unused if the request waits.
net::awaitable<bool> server::handle_under_lease(upstream_entry& up, client_conn& c,
                                                http::request<http::string_body>& req,
                                                const core::request_class& rc,
                                                const core::request_identity& who) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ex = c.stream.get_executor();
  auto idle = up.pool->take_idle(ex);
  auto give_back_idle = [&] {
    if (idle) up.pool->release(std::move(idle));
  };
  auto acq = co_await acquire(*up.coord, who, rc.unpinnable(), idle != nullptr,
                              cfg_.queue.timeout,
                              [this, &c] { return departed(c); }, give_back_idle);
  using outcome = acquisition::outcome;
  if (acq.what == outcome::client_gone) co_return co_await answer_abandoned(c, req);
  if (acq.what == outcome::rejected || acq.what == outcome::timed_out)
    co_return co_await send(c, error_answer(slot_busy(acq.what), req.version(), true));
  if (acq.what == outcome::pass_through) {
    std::optional<upstream_conn> pooled;
    if (idle) pooled = upstream_conn{std::move(idle), false};
    co_return co_await pass_through(up, c, req, std::move(acq.held), std::move(pooled));
  }
  // One co_await per statement (docs/conventions.md §3).
  core::result<upstream_conn> conn = core::error{};
  if (idle)
    conn = upstream_conn{std::move(idle), false};
  else
    conn = co_await up.pool->acquire(ex);
  if (!conn) {
    up.coord->note_upstream_trouble();
    co_await acq.held.release();
    co_return co_await send(c, error_answer(unreachable_upstream(conn.err()), req.version(),
                                            req.keep_alive(), conn.err().message));
  }
  if (acq.held.exclusive())
    co_return co_await run_exclusive(up, c, req, std::move(acq.held), std::move(conn.value()));
  const prepare_result pr = co_await acq.held.prepare(who, conn->fresh);
  if (!pr) {
    up.pool->release(std::move(conn->stream));
    co_return co_await send(c, prepare_failure(pr.err(), req));
  }
  co_return co_await run_on_slot(up, c, req, std::move(acq.held), pr.value(),
                                 std::move(conn.value()), t0);
}

// Persistence is off: the request runs with llama-server's own parallelism, on whatever
// slot it picks; its ticket keeps the coordinator from managing a slot meanwhile
// (docs/design.md §5 "Without persistence").
net::awaitable<bool> server::pass_through(upstream_entry& up, client_conn& c,
                                          http::request<http::string_body>& req, lease ticket,
                                          std::optional<upstream_conn> pooled) {
  relay_state st;
  const bool keep = co_await forward(up, c, req, std::move(pooled), st);
  ticket.finish_later(st.request_sent, false);
  co_return keep;
}

// Managed mode, an endpoint llama-server cannot pin: the whole server, see README.
net::awaitable<bool> server::run_exclusive(upstream_entry& up, client_conn& c,
                                           http::request<http::string_body>& req, lease held,
                                           upstream_conn conn) {
  const core::request_identity nobody;  // a named argument (docs/conventions.md §3)
  auto pr = co_await held.prepare(nobody, false);
  if (!pr) {
    up.pool->release(std::move(conn.stream));
    co_return co_await send(c, prepare_failure(pr.err(), req));
  }
  relay_state st;
  const bool keep = co_await forward(up, c, req, std::move(conn), st);
  co_await held.finish(st.request_sent);
  co_return keep;
}

// A prepared request on its slot: pinned there in managed mode, relayed, then finished.
net::awaitable<bool> server::run_on_slot(upstream_entry& up, client_conn& c,
                                         http::request<http::string_body>& req, lease held,
                                         core::prepare_kind kind, upstream_conn conn,
                                         std::chrono::steady_clock::time_point t0) {
  if (c.pending.stopped()) {  // stopped while its slot was prepared: it never runs
    co_await held.finish(false);
    up.pool->release(std::move(conn.stream));
    co_return co_await answer_abandoned(c, req);
  }
  if (held.pinned()) {
    // The request runs on the slot the coordinator prepared, nowhere else. A body we cannot
    // pin would run on whatever slot llama-server picks, maybe an owned one.
    auto pinned = core::pin_request_body(req.body(), held.slot());
    if (!pinned) {
      co_await held.finish(false);
      up.pool->release(std::move(conn.stream));
      const core::error unpinnable{core::errc::request_refused, 0,
                                   fmt::format("managed-slots mode needs the request body to "
                                               "be one JSON object: {}",
                                               pinned.err().message)};
      co_return co_await send(c, error_answer(unpinnable, req.version(), req.keep_alive()));
    }
    req.body() = std::move(pinned.value());
  }
  // Session requests read llama-server's timings back (the session's reuse counters and the
  // reuse metrics: README "Dashboard"), and their finish reason when checkpoint.onTurnEnd
  // needs it. Auxiliary calls and requests without persistence read nothing.
  const bool watch = kind == core::prepare_kind::restored ||
                     kind == core::prepare_kind::cold ||
                     kind == core::prepare_kind::cold_fallback ||
                     kind == core::prepare_kind::resident;
  const bool watch_turn = up.coord->watches_turn_end() && kind != core::prepare_kind::none &&
                          kind != core::prepare_kind::auxiliary;
  // The route as the client sent it: forward() puts the server's base path before it.
  std::string seeded_target;
  if (kind == core::prepare_kind::restored) seeded_target = std::string(req.target());
  std::string tail;
  relay_state st;
  const bool keep_after = co_await forward(up, c, req, std::move(conn), st,
                                           watch || watch_turn ? &tail : nullptr);
  // What upstream finished counts even when the client left while its last bytes went out:
  // the slot holds the whole reply either way.
  const bool turn_end = watch_turn && st.upstream_done &&
                        core::classify_reply_end(tail) == core::reply_end::user_turn;
  std::optional<reply_report> reply;
  if (watch && st.upstream_done) {
    reply = reply_report{kind, core::parse_response_timings(tail), {}, {}};
    // After a restore (maybe a seed) the request goes with its reply, moved, not copied: a
    // seed that read much more than it reused makes a prefix snapshot from it (docs/design.md
    // §3). Only a body small enough to be chained can have been seeded.
    if (kind == core::prepare_kind::restored && req.body().size() <= core::max_chained_body_bytes) {
      reply->body = std::make_shared<const std::string>(std::move(req.body()));
      reply->target = std::move(seeded_target);
    }
  }
  // Not awaited: whatever this client (or anyone) asks of the coordinator afterwards sees
  // the lease released; a turn-end checkpoint runs while the client reads its next request.
  held.finish_later(st.request_sent, turn_end, std::move(reply));
  if (core::log_enabled(log_level::debug)) {
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0).count();
    log(log_level::debug, "kv.request.done",
        {{"prepare", std::string(core::to_string(kind))},
         {"status", std::to_string(st.status)},
         {"ms", fmt::format("{:.1f}", ms)},
         {"client_gone", st.end == relay_end::client_gone ? "1" : "0"}});
  }
  co_return keep_after;
}

net::awaitable<void> server::shutdown() {
  draining_ = true;
  log(log_level::info, "kv.proxy.draining",
      {{"in_flight", std::to_string(active_.load())},
       {"grace_ms", std::to_string(cfg_.shutdown_grace.count())}});
  if (listener_) listener_->stop();
  if (admin_) admin_->stop();
  auto close_conns = [this](bool only_idle) {
    std::lock_guard lk(conns_mu_);
    for (const auto& c : conns_) {
      if (only_idle && c->busy) continue;
      // Closing from the connection's own strand: its pending read or write completes with
      // an error and the session ends.
      net::post(c->stream.get_executor(), [c] {
        beast::error_code ec;  // the session may have closed its socket meanwhile
        c->stream.socket().cancel(ec);
      });
    }
  };
  close_conns(true);
  steady_timer tick(co_await net::this_coro::executor);
  const auto deadline = std::chrono::steady_clock::now() + cfg_.shutdown_grace;
  while (active_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    tick.expires_after(std::chrono::milliseconds(20));
    co_await tick.async_wait(token);
    close_conns(true);
  }
  if (active_.load() > 0) {
    log(log_level::warn, "kv.proxy.grace_expired", {{"cancelled", std::to_string(active_.load())}});
    close_conns(false);
    const auto hard = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (active_.load() > 0 && std::chrono::steady_clock::now() < hard) {
      tick.expires_after(std::chrono::milliseconds(20));
      co_await tick.async_wait(token);
    }
  }
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
