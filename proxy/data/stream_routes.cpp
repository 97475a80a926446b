// Resumable streams through the proxy (docs/design.md §21): X-Conversation-Id is forwarded,
// namespaced per credential (core/resumable_stream.hpp), and GET/DELETE /v1/stream and
// POST /v1/streams/lookup reach the server that runs the stream, with the same namespacing.
#include "proxy/data/stream_routes.hpp"

#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "proxy/data/request_identity_reader.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

// A lookup reply lists a few streams; more than this is not one.
constexpr std::uint64_t max_lookup_reply_bytes = 1 << 20;

}  // namespace

stream_routes::stream_routes(upstream_table& upstreams) : upstreams_(upstreams) {}

stream_hold stream_routes::hold_conversation(const upstream_entry& up,
                                             http::request<http::string_body>& req) {
  auto it = req.find(core::conversation_header);
  if (it == req.end()) return {};
  const std::string credential = core::credential_key(credential_header(req));
  std::string id = core::upstream_conversation_id(credential, it->value());
  req.erase(core::conversation_header);  // every instance: llama-server reads one
  req.set(core::conversation_header, id);
  // Without llama-server's key the request starts no stream (it answers 401): nothing to find.
  if (client_may_use(up.cfg.upstream.api_key, req))
    directory_.remember(credential, id, up.cfg.name);
  return stream_hold(directory_, std::move(id));
}

net::awaitable<bool> stream_routes::forward(core::stream_route kind,
                                            http::request<http::string_body>& req,
                                            stream_route_io io) {
  const std::string credential = core::credential_key(credential_header(req));
  std::string conversation;
  std::optional<core::namespaced_lookup> lookup;
  if (kind == core::stream_route::lookup) {
    lookup = core::namespace_lookup(req.body(), credential);
    if (!lookup) {
      const core::error malformed{core::errc::request_refused, 0,
                                  "lookup body: {\"conversation_ids\": [...]} with at most 256 "
                                  "string ids"};
      co_return co_await io.answer(error_answer(malformed, req.version(), req.keep_alive()));
    }
    if (!lookup->upstream_to_client.empty()) conversation = lookup->upstream_to_client.front().first;
  } else {
    auto t = core::namespace_stream_target(req.target(), credential);
    req.target(t.target);
    conversation = std::move(t.conversation);
  }
  // A stream kvpersist still holds (its slot being prepared, its model loading): llama-server
  // does not know it yet. A replay is told to retry, as a router tells it while the model
  // loads; a stop cancels the held request (docs/design.md §21).
  if (kind == core::stream_route::replay && directory_.held(conversation)) {
    const core::error not_started{core::errc::over_capacity, 0,
                                  "the stream has not started yet: kvpersist is preparing its "
                                  "slot; retry later",
                                  1};
    co_return co_await io.answer(error_answer(not_started, req.version(), req.keep_alive()));
  }
  if (kind == core::stream_route::stop && directory_.stop_held(conversation)) {
    log(log_level::info, "kv.stream.stop_held", {});
    response res{http::status::no_content, req.version()};
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    co_return co_await io.answer(std::move(res));
  }
  // The server that ran the stream; the routes' choice when kvpersist never saw it (after a
  // restart of kvpersist, or an id forgotten): llama-server then answers 404 or an empty list.
  upstream_entry* up = nullptr;
  if (auto name = directory_.server_of(conversation)) up = upstreams_.server_named(*name);
  if (!up) up = &upstreams_.route(req);
  if (lookup) co_return co_await forward_lookup(*up, req, *lookup, io);
  co_return co_await io.forward(*up, req);
}

// A lookup's reply names upstream ids: it is read whole and given back with the client's.
net::awaitable<bool> stream_routes::forward_lookup(upstream_entry& up,
                                                   http::request<http::string_body>& req,
                                                   const core::namespaced_lookup& lookup,
                                                   const stream_route_io& io) {
  const unsigned version = req.version();
  const bool keep = req.keep_alive();
  req.body() = lookup.body;
  upstreams_.prepare_request(up, req);
  auto acquired = co_await up.pool->acquire(co_await net::this_coro::executor);
  if (!acquired) {
    co_return co_await io.answer(error_answer(unreachable_upstream(acquired.err()), version, keep,
                                              acquired.err().message));
  }
  auto conn = std::move(acquired.value());
  conn.stream->expires_after(up.relay.upstream_idle);
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_lookup_reply_bytes);
  beast::flat_buffer buf;
  auto [wec, wn] = co_await http::async_write(*conn.stream, req, token);
  beast::error_code rec = wec;
  if (!rec) std::tie(rec, std::ignore) = co_await http::async_read(*conn.stream, buf, parser, token);
  if (rec) {
    conn.stream->close();
    const core::error unanswered{core::errc::upstream_closed, 0,
                                 "upstream llama-server did not answer the lookup"};
    co_return co_await io.answer(error_answer(unanswered, version, keep, rec.message()));
  }
  auto upstream_res = parser.release();
  if (upstream_res.keep_alive()) up.pool->release(std::move(conn.stream));
  else conn.stream->close();
  response res{upstream_res.result(), version};
  res.set(http::field::content_type, "application/json; charset=utf-8");
  res.keep_alive(keep);
  if (upstream_res.result() != http::status::ok) {
    res.body() = std::move(upstream_res.body());  // llama-server's own error, no ids in it
  } else if (auto back = core::client_lookup_reply(upstream_res.body(), lookup)) {
    res.body() = std::move(*back);
  } else {
    const core::error garbled{core::errc::upstream_closed, 0,
                                "upstream llama-server's lookup reply is not a list"};
    co_return co_await io.answer(error_answer(garbled, version, keep));
  }
  res.prepare_payload();
  co_return co_await io.answer(std::move(res));
}

}  // namespace kvp::proxy
