#include "proxy/data/server.hpp"

#include <boost/asio/post.hpp>
#include <chrono>

#include <fmt/format.h>

#include "core/json.hpp"
#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "core/reply_end.hpp"
#include "core/request_hints.hpp"
#include "core/response_timings.hpp"
#include "core/request_rewrite.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/http/request_reader.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

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
core::error prepare_failure(const core::error& e) {
  core::error failed = e;
  if (e.retry_after_s == 0)
    failed.message = fmt::format("kvpersist could not prepare the slot: {}", e.message);
  return failed;
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

// Whether a session's reply handed the conversation back to the user (checkpoint.onTurnEnd,
// the early checkpoint): read from its last bytes `tail` when the coordinator watches turn
// ends. What upstream finished counts even when the client left while its last bytes went
// out: the slot holds the whole reply either way.
bool turn_ended(core::prepare_kind kind, bool watches_turn_end, const relay_state& st,
                const std::string& tail) {
  return watches_turn_end && kind != core::prepare_kind::none &&
         kind != core::prepare_kind::auxiliary && st.upstream_done &&
         core::classify_reply_end(tail) == core::reply_end::user_turn;
}

// The report of a reply that reached its end, `tail` (nullopt for one that did not): what it
// reused, for the reuse counters (README "Metrics"). After a restore (maybe a seed) the
// request goes with its reply, moved, not copied: a seed that read much more than it reused
// makes a prefix snapshot from it (docs/design.md §3). Only a body small enough to be
// chained can have been seeded.
std::optional<reply_report> reply_of(core::prepare_kind kind, const relay_state& st,
                                     const std::string& tail,
                                     http::request<http::string_body>& req,
                                     std::string seeded_target) {
  if (!st.upstream_done) return std::nullopt;
  reply_report reply{kind, core::parse_response_timings(tail), {}, {}};
  if (kind == core::prepare_kind::restored && req.body().size() <= core::max_chained_body_bytes) {
    reply.body = std::make_shared<const std::string>(std::move(req.body()));
    reply.target = std::move(seeded_target);
  }
  return reply;
}

void log_request_done(core::prepare_kind kind, const relay_state& st,
                      std::chrono::steady_clock::time_point t0) {
  if (!core::log_enabled(log_level::debug)) return;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  log(log_level::debug, "kv.request.done",
      {{"prepare", std::string(core::to_string(kind))},
       {"status", std::to_string(st.status)},
       {"ms", fmt::format("{:.1f}", ms)},
       {"client_gone", st.end == relay_end::client_gone ? "1" : "0"}});
}

}  // namespace

server::server(config::config cfg, upstream_table& upstreams)
    : cfg_(std::move(cfg)),
      bodies_(cfg_.limits.max_buffered_body_bytes),
      upstreams_(upstreams),
      forwarder_(upstreams_),
      streams_(upstreams_),
      identities_(cfg_.sessions) {}

// The router's own routes for its models (docs/llama-server.md §14): an unload saves that
// model's sessions first, a load the running models' when one must make room; any other
// request naming the model may make the router start it.
net::awaitable<void> server::before_router_request(exchange& x) {
  auto& router = *x.up->of_router;
  const auto& m = *router.find(x.up->router_model);
  const std::function<bool()> wanted = [&c = x.client] { return !c.abandoned(); };
  const std::string_view path = x.rc.path;
  if (path == "/models/unload") co_return co_await router.before_unload(m);
  if (path == "/models/load") co_return co_await router.before_serving(m, false, wanted);
  if (lists_router_models(path)) co_return;
  co_await router.before_serving(m, true, wanted);
}

server::~server() = default;

stream_route_io server::stream_io_of(exchange& x) {
  return {
      .answer = [&x](response res) { return x.client.send(std::move(res)); },
      // `req` is x.req, namespaced by the stream route.
      .forward = [this, &x](upstream_entry& up, http::request<http::string_body>&) {
        x.up = &up;
        return forwarder_.forward(x, std::nullopt);
      },
  };
}

net::awaitable<void> server::serve(tcp_stream stream) {
  auto c = std::make_shared<client_conn>(std::move(stream), cfg_.limits.client_write_timeout);
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

net::awaitable<bool> server::forward_runtime_change(exchange& x) {
  auto& up = *x.up;
  // Without llama-server's key the request changes nothing (it answers 401): no need to
  // save every session first.
  if (!client_may_use(up.cfg.upstream.api_key, x.req))
    co_return co_await forwarder_.forward(x, std::nullopt);
  auto acq = co_await begin_runtime_change(*up.coord, cfg_.queue.timeout,
                                            [&c = x.client] { return c.gone(); });
  using outcome = acquisition::outcome;
  if (acq.what == outcome::client_gone) co_return false;
  if (acq.what == outcome::runtime_change_pending) {
    const core::error pending{
        core::errc::runtime_change_pending, 0,
        "another runtime change (POST /lora-adapters) is waiting or running; retry after it", 1};
    co_return co_await answer_error(x, pending);
  }
  if (acq.what != outcome::granted)
    co_return co_await x.client.send(error_answer(slot_busy(acq.what), x.version, true));
  // The saves before it took time: a client that left meanwhile has its change dropped, never
  // forwarded (its lease goes back with `acq.held`).
  if (x.client.hung_up()) co_return false;
  const bool keep = co_await forwarder_.forward(x, std::nullopt);
  co_await end_runtime_change(std::move(acq.held), x.relayed.request_sent);
  co_return keep;
}

// The request path (docs/architecture.md): refuse what must never reach llama-server, pick
// the server, then admit() the request.
net::awaitable<bool> server::handle(client_conn& c, http::request<http::string_body> req) {
  auto rc = core::classify(req.method_string(), req.target());
  exchange x(c, std::move(req), std::move(rc));
  if (auto no = refusal_before_routing(x.req, x.rc)) co_return co_await answer_error(x, *no);
  // Resumable-stream routes are passthrough paths: an inference request is not decoded again.
  if (x.rc.stream != core::stream_route::none)
    co_return co_await streams_.forward(x.rc.stream, x.req, stream_io_of(x));
  x.who = identities_.identity_of(x.req);
  auto entry = upstreams_.model_entry(upstreams_.route(x.req), x.req);
  if (!entry) co_return co_await answer_error(x, entry.err());
  x.up = entry.value();
  c.pending = streams_.hold_conversation(*x.up, x.req);
  if (x.rc.is_prediction(x.up->cfg.upstream.predict_route))
    co_return co_await answer_error(x, prediction_refused());
  co_return co_await admit(x);
}

// A routed request: forwarded untouched (a router's own, one without a slot, one that passes
// by), as a runtime change, or under a slot lease.
net::awaitable<bool> server::admit(exchange& x) {
  auto& up = *x.up;
  // A router's request for no model kvpersist manages: the router picks (or refuses) it.
  if (up.router) {
    if (client_may_use(up.cfg.upstream.api_key, x.req))
      co_await before_unmanaged_model(*up.router, x.req, x.rc.path);
    co_return co_await forwarder_.forward(x, std::nullopt);
  }
  // A router starts the model a request names, and may unload another to do so; a client
  // without the key makes nothing move (the router answers it 401).
  if (up.of_router && client_may_use(up.cfg.upstream.api_key, x.req)) {
    co_await before_router_request(x);
    // A client that left meanwhile is not served: the router drops a queued request whose
    // client left, and forwarding it would make the router load its model after all. A
    // conversation request is served unless stopped, as the router serves it.
    if (x.client.abandoned()) co_return co_await answer_abandoned(x);
  }
  if (x.rc.changes_runtime) co_return co_await forward_runtime_change(x);
  const bool needs_slot = x.rc.needs_slot;
  // Checked before the body is parsed or the request admitted, as llama-server would check
  // it: a client without the key costs no parse and cannot make kvpersist save or evict the
  // resident session.
  if (needs_slot && !client_may_use(up.cfg.upstream.api_key, x.req)) {
    const core::error invalid_key{core::errc::credential_refused, 0, "Invalid API Key"};
    co_return co_await answer_error(x, invalid_key);
  }
  if (needs_slot) {
    // README "Harnesses": what keeps this harness's new conversations cold, told, not
    // rewritten; read from the chain when the body was chained (parsed once).
    const auto chained = identities_.describe_content(x.req, x.rc, x.who);
    if (chained ? *chained : core::has_attribution_header(x.req.target(), x.req.body()))
      up.coord->hints().note(core::hint_id::attribution_header);
  }
  // A swap group's other servers save their sessions before this one's process replaces theirs.
  if (needs_slot) co_await upstreams_.swaps().before_serving(up.cfg.name);
  // docs/design.md §24: a request passes the lease, and the door, uncoordinated only where the
  // scope lets anyone run on anything (proxy/tools/main.cpp warns of the rest).
  const bool passes_by = cfg_.sessions.unmanaged == config::unmanaged_policy::passthrough &&
                         cfg_.sharing == config::sharing_scope::instance;
  const bool coordinated = needs_slot && (!x.who.session_id.empty() || !passes_by);
  if (!coordinated) co_return co_await forwarder_.forward(x, std::nullopt);
  co_return co_await handle_under_lease(x);
}

// A stopped conversation request is answered as the router answers one it held (its client
// may still be there); a client that hung up gets nothing.
net::awaitable<bool> server::answer_abandoned(exchange& x) {
  if (!x.client.pending.stopped()) co_return false;
  log(log_level::info, "kv.stream.stopped_before_forward", {});
  const core::error cancelled{core::errc::request_refused, 0,
                              "request cancelled by a stop (DELETE /v1/stream) before it "
                              "reached llama-server"};
  co_return co_await answer_error(x, cancelled);
}

// Acquire, prepare, forward, finish (docs/design.md §5). A pooled upstream connection taken
// before asking for the lease lets acquire prepare in the same trip (a pooled connection
// says the server has not restarted under it); it goes back unused if the request waits.
net::awaitable<bool> server::handle_under_lease(exchange& x) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& up = *x.up;
  auto ex = x.client.stream.get_executor();
  auto idle = up.pool->take_idle(ex);
  auto give_back_idle = [&] {
    if (idle) up.pool->release(std::move(idle));
  };
  auto acq = co_await acquire(*up.coord, x.who, x.rc.unpinnable(), idle != nullptr,
                              cfg_.queue.timeout,
                              [&c = x.client] { return c.departed(); }, give_back_idle);
  using outcome = acquisition::outcome;
  if (acq.what == outcome::client_gone) co_return co_await answer_abandoned(x);
  if (acq.what == outcome::rejected || acq.what == outcome::timed_out)
    co_return co_await x.client.send(error_answer(slot_busy(acq.what), x.version, true));
  if (acq.what == outcome::pass_through) {
    std::optional<upstream_conn> pooled;
    if (idle) pooled = upstream_conn{std::move(idle), false};
    co_return co_await pass_through(x, std::move(acq.held), std::move(pooled));
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
    co_return co_await answer_error(x, unreachable_upstream(conn.err()), conn.err().message);
  }
  if (acq.held.exclusive())
    co_return co_await run_exclusive(x, std::move(acq.held), std::move(conn.value()));
  const prepare_result pr = co_await acq.held.prepare(x.who, conn->fresh);
  if (!pr) {
    up.pool->release(std::move(conn->stream));
    co_return co_await answer_error(x, prepare_failure(pr.err()));
  }
  co_return co_await run_on_slot(x, std::move(acq.held), pr.value(), std::move(conn.value()), t0);
}

// Persistence is off: the request runs with llama-server's own parallelism, on whatever
// slot it picks; its ticket keeps the coordinator from managing a slot meanwhile
// (docs/design.md §5 "Without persistence").
net::awaitable<bool> server::pass_through(exchange& x, lease ticket,
                                          std::optional<upstream_conn> pooled) {
  std::string tail;
  const bool keep = co_await forwarder_.forward(x, std::move(pooled), &tail);
  ticket.finish_later(x.relayed.request_sent, false,
                      reply_of(core::prepare_kind::none, x.relayed, tail, x.req, {}));
  co_return keep;
}

// A request llama-server places itself (an endpoint it cannot pin in managed mode; every
// request in mode auto with several slots): the whole server, see README.
net::awaitable<bool> server::run_exclusive(exchange& x, lease held, upstream_conn conn) {
  const auto t0 = std::chrono::steady_clock::now();
  auto pr = co_await held.prepare(x.who, conn.fresh);
  if (!pr) {
    x.up->pool->release(std::move(conn.stream));
    co_return co_await answer_error(x, prepare_failure(pr.err()));
  }
  std::string tail;
  const bool keep = co_await forwarder_.forward(x, std::move(conn), &tail);
  const bool turn_end = turn_ended(pr.value(), x.up->coord->watches_turn_end(), x.relayed, tail);
  auto reply = reply_of(pr.value(), x.relayed, tail, x.req, {});
  co_await held.finish(x.relayed.request_sent, turn_end, std::move(reply));
  log_request_done(pr.value(), x.relayed, t0);
  co_return keep;
}

// A prepared request on its slot: pinned there in managed mode, relayed, then finished.
net::awaitable<bool> server::run_on_slot(exchange& x, lease held, core::prepare_kind kind,
                                         upstream_conn conn,
                                         std::chrono::steady_clock::time_point t0) {
  auto& up = *x.up;
  if (x.client.pending.stopped()) {  // stopped while its slot was prepared: it never runs
    co_await held.finish(false);
    up.pool->release(std::move(conn.stream));
    co_return co_await answer_abandoned(x);
  }
  if (held.pinned()) {
    // The request runs on the slot the coordinator prepared, nowhere else. A body we cannot
    // pin would run on whatever slot llama-server picks, maybe an owned one.
    auto pinned = core::pin_request_body(x.req.body(), held.slot());
    if (!pinned) {
      co_await held.finish(false);
      up.pool->release(std::move(conn.stream));
      const core::error unpinnable{core::errc::request_refused, 0,
                                   fmt::format("managed-slots mode needs the request body to "
                                               "be one JSON object: {}",
                                               pinned.err().message)};
      co_return co_await answer_error(x, unpinnable);
    }
    x.req.body() = std::move(pinned.value());
  }
  // Every reply is read back for what it reused (the reuse counters: README "Metrics"); a
  // session's also for its finish reason when checkpoint.onTurnEnd needs it.
  // The route as the client sent it: the forward puts the server's base path before it.
  std::string seeded_target;
  if (kind == core::prepare_kind::restored) seeded_target = std::string(x.req.target());
  std::string tail;
  const bool keep_after = co_await forwarder_.forward(x, std::move(conn), &tail);
  const relay_state& st = x.relayed;
  const bool turn_end = turn_ended(kind, up.coord->watches_turn_end(), st, tail);
  auto reply = reply_of(kind, st, tail, x.req, std::move(seeded_target));
  // Not awaited: whatever this client (or anyone) asks of the coordinator afterwards sees
  // the lease released; a turn-end checkpoint runs while the client reads its next request.
  held.finish_later(st.request_sent, turn_end, std::move(reply));
  log_request_done(kind, st, t0);
  co_return keep_after;
}

void server::stop_reading() {
  draining_ = true;
  close_connections(true);
}

void server::close_all() { close_connections(false); }

void server::close_connections(bool only_idle) {
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
}

}  // namespace kvp::proxy
