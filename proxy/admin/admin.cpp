#include "proxy/admin/admin.hpp"

#include <openssl/crypto.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <charconv>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "config/config.hpp"
#include "core/event_history.hpp"
#include "core/json.hpp"
#include "core/json_writer.hpp"
#include "core/log.hpp"
#include "core/manifest.hpp"
#include "proxy/http/listen.hpp"
#include "core/metrics.hpp"
#include "core/request_class.hpp"
#include "core/version.hpp"
#include "proxy/http/http_status.hpp"
#include "proxy/http/request_reader.hpp"
#include "proxy/http/socket_peek.hpp"
#include "proxy/admin/ui_assets.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using core::errc;

namespace {

// 200 with a JSON body, never cached.
response json_ok(std::string body, unsigned version) {
  response res{http::status::ok, version};
  res.set(http::field::server, std::string("kvpersist/") + kvp::version);
  res.set(http::field::content_type, "application/json");
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// Every admin error: error_answer (its status from proxy/http/http_status.cpp's table, its log
// line), never cached.
response err(const core::error& e, unsigned version) {
  auto res = error_answer(e, version, true);
  res.set(http::field::cache_control, "no-store");
  return res;
}

response err(errc code, std::string_view message, unsigned version) {
  return err(core::error{code, 0, std::string(message)}, version);
}

// What an operation that succeeded says in {"result": ...}.
std::string_view text_for(admin_result r) {
  switch (r) {
    case admin_result::saved: return "saved";
    case admin_result::clean: return "clean: nothing to save";
    case admin_result::not_resident: return "not resident: its last snapshot is current";
    case admin_result::restored: return "restored";
    case admin_result::resident: return "resident";
    case admin_result::cold: return "cold: no usable snapshot";
    case admin_result::restore_failed_cold: return "restore failed: cold";
    case admin_result::invalidated: return "invalidated";
    case admin_result::disposed: return "disposed";
    case admin_result::nothing_to_dispose: return "not resident: nothing to dispose";
    case admin_result::purged: return "purged";
    case admin_result::flushed: return "flushed";
  }
  return "done";
}

// {"result": ...}; a purge adds freedBytes and filesDeleted.
std::string outcome_json(const admin_outcome& o) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "result", text_for(o.result));
  if (o.result == admin_result::purged) {
    core::write_json_count(w, "freedBytes", o.freed_bytes);
    w.Key("filesDeleted");
    w.Bool(o.files_deleted);
  }
  w.EndObject();
  return sb.GetString();
}

response outcome_response(const admin_reply& r, unsigned version) {
  if (!r) return err(r.err(), version);
  return json_ok(outcome_json(r.value()), version);
}

std::string gc_report_json(const gc_report& r) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_count(w, "evicted", r.evicted);
  core::write_json_count(w, "freedBytes", r.freed_bytes);
  core::write_json_count(w, "remainingSessions", r.remaining_sessions);
  core::write_json_count(w, "remainingBytes", r.remaining_bytes);
  if (r.files_kept) {
    core::write_json_member(
        w, "note",
        "server-owned snapshots: evicted sessions' manifests are removed; their files stay "
        "in llama-server's --slot-save-path (see kv.session.forgotten in the log)");
  }
  w.EndObject();
  return sb.GetString();
}

// Constant-time comparison so the token cannot be guessed byte by byte from timings.
bool token_matches(std::string_view header, const std::string& token) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || !header.starts_with(prefix)) return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
}

// "application/json", with or without parameters ("; charset=utf-8").
bool is_json_media_type(std::string_view content_type) {
  auto type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  return beast::iequals(type, "application/json");
}

// The percent-decoded value of `name` in the target's query, if present.
bool is_session_hash(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// ?limit=N (1..1000, default 100) and ?after=HASH (a 64-hex session hash). nullopt: invalid.
struct page_query {
  std::string after;
  std::size_t limit = 100;
};
std::optional<page_query> parse_page_query(std::string_view target) {
  page_query p;
  if (auto limit = core::query_param(target, "limit")) {
    std::size_t n = 0;
    auto [end, ec] = std::from_chars(limit->data(), limit->data() + limit->size(), n);
    if (ec != std::errc{} || end != limit->data() + limit->size() || n < 1 || n > 1000)
      return std::nullopt;
    p.limit = n;
  }
  if (auto after = core::query_param(target, "after")) {
    if (!is_session_hash(*after)) return std::nullopt;
    p.after = std::move(*after);
  }
  return p;
}

// Coroutines that run on a coordinator's strand (plain functions, not capturing lambdas:
// CP.51). Each only reads or copies: JSON of a listing is formatted by the caller, off the
// strand.
net::awaitable<core::prom_writer> metrics_of(coordinator* c) {
  core::prom_writer w;
  c->write_metrics(w);
  co_return w;
}
net::awaitable<std::string> status_of(coordinator* c) { co_return c->status_json(); }
net::awaitable<session_page> page_of(coordinator* c, std::string after, std::size_t limit) {
  co_return c->admin().sessions_page(after, limit);
}
net::awaitable<core::result<session_row>> session_of(coordinator* c, std::string id) {
  co_return c->admin().session(id);
}

net::awaitable<response> all_metrics(std::vector<coordinator*> coords, unsigned v) {
  core::prom_writer all;
  for (auto* c : coords) {
    auto part = co_await c->on_strand(metrics_of(c));
    all.merge(part);
  }
  response res{http::status::ok, v};
  res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  res.body() = all.text();
  res.prepare_payload();
  co_return res;
}

// {"version": ..., "servers": [...]}; each server's part is already JSON (status_json).
std::string status_body(const std::vector<std::string>& servers) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "version", kvp::version);
  w.Key("servers");
  w.StartArray();
  for (const auto& part : servers) w.RawValue(part.data(), part.size(), rapidjson::kObjectType);
  w.EndArray();
  w.EndObject();
  return sb.GetString();
}

net::awaitable<response> all_status(std::vector<coordinator*> coords, unsigned v) {
  std::vector<std::string> servers;
  for (auto* c : coords) {
    auto part = co_await c->on_strand(status_of(c));
    servers.push_back(std::move(part));
  }
  co_return json_ok(status_body(servers), v);
}

// What /healthz always answers: {"status":"ok"}.
std::string healthy_body() {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "status", "ok");
  w.EndObject();
  return sb.GetString();
}

net::awaitable<std::string> json_of(session_page page) { co_return sessions_page_json(page); }

// GET /kv/sessions: one page, in hash order. Only the page's rows are copied on the strand;
// the JSON (the costly part with long session ids) is built on the admin's own thread, so
// that a listing never holds up the threads serving requests.
net::awaitable<response> list_sessions(coordinator* coord, net::thread_pool::executor_type formatter,
                                       std::string target, unsigned v) {
  auto q = parse_page_query(target);
  if (!q)
    co_return err(errc::request_refused, "limit must be 1..1000 and after a 64-hex session hash",
                  v);
  auto page = co_await coord->on_strand(page_of(coord, std::move(q->after), q->limit));
  auto body = co_await net::co_spawn(formatter, json_of(std::move(page)), net::use_awaitable);
  co_return json_ok(std::move(body), v);
}

// The optional body of POST .../invalidate: {"reason": "..."} (at most 256 bytes of text).
// nullopt: not that shape.
std::optional<std::string> invalidate_note(const std::string& body) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return std::string();
  rapidjson::Document d;
  if (!core::parse_json_bounded(body, d) || !d.IsObject()) return std::nullopt;
  std::string note;
  for (const auto& kv : d.GetObject()) {
    if (std::string_view(kv.name.GetString()) != "reason" || !kv.value.IsString() ||
        kv.value.GetStringLength() > core::manifest::max_note_bytes)
      return std::nullopt;
    note.assign(kv.value.GetString(), kv.value.GetStringLength());
  }
  return note;
}

// /kv/sessions/{id}[/action]; `rest` is the raw path after that prefix.
net::awaitable<response> session_route(coordinator* coord, http::verb method, std::string rest,
                                       std::string body, unsigned v) {
  // Split before decoding: a session id may contain an encoded '/' (a%2Fb).
  std::string action;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    action = core::decode_path(rest.substr(slash + 1));
    rest.resize(slash);
  }
  rest = core::decode_path(rest);
  if (rest.empty()) co_return err(errc::not_found, "no session id in the path", v);
  // One co_await per statement (docs/conventions.md §3).
  admin_reply r;
  if (action.empty()) {
    if (method == http::verb::get) {
      const auto row = co_await coord->on_strand(session_of(coord, rest));
      if (!row) co_return err(row.err(), v);
      co_return json_ok(session_json(row.value()), v);
    } else if (method == http::verb::delete_) {
      r = co_await coord->on_strand(coord->admin().purge(rest));
    } else {
      co_return err(errc::method_not_allowed, "use GET or DELETE", v);
    }
  } else {
    if (method != http::verb::post) co_return err(errc::method_not_allowed, "use POST", v);
    if (action == "save" || action == "flush")
      r = co_await coord->on_strand(coord->admin().save(rest));
    else if (action == "restore")
      r = co_await coord->on_strand(coord->admin().restore(rest));
    else if (action == "invalidate") {
      auto note = invalidate_note(body);
      if (!note)
        co_return err(errc::request_refused,
                      "the body must be empty or {\"reason\": \"at most 256 bytes\"}", v);
      r = co_await coord->on_strand(coord->admin().invalidate(rest, std::move(*note)));
    }
    else if (action == "dispose")
      r = co_await coord->on_strand(coord->admin().dispose(rest));
    else
      co_return err(errc::not_found, "unknown action (save, flush, restore, invalidate, dispose)",
                    v);
  }
  co_return outcome_response(r, v);
}

// The dashboard file a path names: "/ui" is the page, "/ui/<name>" its files. ("/" stays
// 404: nothing else on this listener answers without the token.)
const ui_asset* ui_file(std::string_view path) {
  std::string_view name;
  if (path == "/ui" || path == "/ui/")
    name = "index.html";
  else if (path.starts_with("/ui/"))
    name = path.substr(4);
  else
    return nullptr;
  for (const auto& a : ui_assets())
    if (a.name == name) return &a;
  return nullptr;
}

std::string_view media_type_of(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  return "text/css; charset=utf-8";
}

// The page may load only its own files and talk only to this listener; no framing
// (clickjacking), no sniffing, no Referer with the admin address in it.
response ui_response(const ui_asset& file, unsigned v) {
  response res{http::status::ok, v};
  res.set(http::field::server, std::string("kvpersist/") + kvp::version);
  res.set(http::field::content_type, media_type_of(file.name));
  res.set(http::field::cache_control, "no-cache");
  res.set("Content-Security-Policy",
          "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
          "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set("X-Content-Type-Options", "nosniff");
  res.set("X-Frame-Options", "DENY");
  res.set("Referrer-Policy", "no-referrer");
  res.body() = std::string(file.body);
  res.prepare_payload();
  return res;
}

// Event-stream limits: enough for a few open dashboards; each costs a timer and a socket.
constexpr int max_event_streams = 8;
constexpr auto event_poll_interval = std::chrono::milliseconds(250);
constexpr auto event_keepalive_interval = std::chrono::seconds(5);
constexpr auto event_write_timeout = std::chrono::seconds(10);

bool is_event_stream(const http::request<http::string_body>& req) {
  const std::string_view target = req.target();
  return target.substr(0, target.find('?')) == "/kv/events";
}

// Last-Event-ID (sent by a reconnecting client): resume after that event. Anything else
// (absent, not a number, an id from before a restart of this daemon, which numbers from 1
// again) replays the whole kept history.
std::uint64_t resume_point(const http::request<http::string_body>& req) {
  const std::string_view id = req["Last-Event-ID"];
  std::uint64_t seq = 0;
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), seq);
  const bool ours = ec == std::errc{} && end == id.data() + id.size() &&
                    seq <= core::recent_events().last_seq();
  return ours ? seq : 0;
}

// One server-sent event per entry: "id", "event" (the log event name) and "data" (its JSON,
// one line: the log escapes control bytes).
std::string sse_frames(const std::vector<core::event_history::entry>& entries) {
  std::string out;
  for (const auto& e : entries)
    out += fmt::format("id: {}\nevent: {}\ndata: {}\n\n", e.seq, e.event, e.json);
  return out;
}

}  // namespace

admin_server::admin_server(net::io_context& ioc, std::vector<coordinator*> coords,
                           const config::admin_config& cfg)
    : ioc_(ioc),
      coords_(std::move(coords)),
      listen_(cfg.listen),
      token_(cfg.token),
      max_connections_(cfg.max_connections) {}

core::result<std::string> admin_server::start() {
  auto a = listen_on(ioc_, listen_, "admin");
  if (!a) return a.err();
  std::uint16_t configured_port = 0;
  config::parse_host_port(listen_, listen_host_, configured_port);
  bound_port_ = a.value()->local_endpoint().port();
  const std::string address = local_address(*a.value());
  // Over the cap a client is answered at once instead of waiting in the backlog: an operator
  // or a health check learns that the port is busy, and the connection costs one descriptor
  // for a moment (reserved for it: reserved_descriptors in proxy/tools/daemon.hpp).
  const core::error full{core::errc::over_capacity, 0,
                         fmt::format("the admin API has {} connections open "
                                     "(admin.maxConnections); retry later",
                                     max_connections_),
                         1};
  auto busy = error_response(full, 11, false);
  busy.set(http::field::cache_control, "no-store");
  std::ostringstream wire;
  wire << busy;
  listener_options opts{"admin", "admin.maxConnections", max_connections_, when_full::refuse,
                        wire.str()};
  listener_ = std::make_unique<listener>(ioc_, std::move(a.value()), std::move(opts),
                                         [this](tcp_stream s) { return run_session(std::move(s)); });
  listener_->start();
  return address;
}

void admin_server::stop() {
  stopping_ = true;  // open event streams end at their next poll
  if (listener_) listener_->stop();
}

net::awaitable<void> admin_server::run_session(tcp_stream s) {
  beast::flat_buffer buf;
  const read_limits limits{16 * 1024, 64 * 1024, std::chrono::seconds(30),
                           std::chrono::seconds(30), std::chrono::seconds(30), {}};
  for (;;) {
    request_reader reader(s, buf, limits);
    if (!co_await reader.read_header()) break;
    if (!co_await reader.read_body()) break;  // one co_await per statement (docs/conventions.md §3)
    auto req = reader.release();
    if (is_event_stream(req)) {
      co_await serve_events(s, req);
      break;
    }
    const bool keep = req.keep_alive();
    auto res = co_await route(std::move(req));
    res.keep_alive(keep);
    s.expires_after(std::chrono::seconds(30));
    auto [wec, wn] = co_await http::async_write(s, res);
    if (wec || !keep) break;
  }
  beast::error_code ignored;
  s.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

// DNS rebinding: a page of attacker.example whose name now resolves to 127.0.0.1 reaches us
// with "Host: attacker.example". A rebound page cannot name localhost or an IP address (an
// address is not rebindable), so those and admin.listen's own name (with its port) are
// served; an IP address also covers probes that name the container's or pod's address.
bool admin_server::host_is_ours(std::string_view host_header) const {
  std::string host, base_path;
  std::uint16_t port = 80;
  if (!config::parse_http_url(fmt::format("http://{}", host_header), host, port, base_path) ||
      !base_path.empty())
    return false;
  boost::system::error_code not_an_address;
  net::ip::make_address(host, not_an_address);
  if (!not_an_address || beast::iequals(host, "localhost")) return true;
  return beast::iequals(host, listen_host_) && port == bound_port_;
}

// A browser names the page that sent a request in Origin (on every POST, and on cross-origin
// GETs); only our own origin may talk to us. Refused with 403, as Jupyter's and Syncthing's
// host checks do: 421 would invite the client to retry on another connection, which cannot
// help. The message echoes nothing the client sent.
std::optional<std::string_view> admin_server::cross_site_refusal(
    const http::request<http::string_body>& req) const {
  const auto host = req[http::field::host];
  if (!host_is_ours(host))
    return "the Host header names neither localhost, an IP address nor admin.listen's host "
           "(DNS rebinding guard)";
  if (req.find(http::field::origin) != req.end() &&
      !beast::iequals(req[http::field::origin], fmt::format("http://{}", host)))
    return "cross-origin requests are refused";
  return std::nullopt;
}

// The bearer token, then CSRF: a browser sends a cross-site POST without asking first (no
// CORS preflight) only with no Content-Type or a form/text one. Requiring application/json on
// every state change forces the preflight, which this API never grants.
std::optional<response> admin_server::credential_refusal(
    const http::request<http::string_body>& req) const {
  const unsigned v = req.version();
  if (!token_.empty() && !token_matches(req[http::field::authorization], token_)) {
    auto res = err(errc::credential_refused, "missing or wrong bearer token", v);
    res.set(http::field::www_authenticate, "Bearer");
    return res;
  }
  if ((req.method() == http::verb::post || req.method() == http::verb::delete_) &&
      !is_json_media_type(req[http::field::content_type]))
    return err(errc::media_type_refused, "POST and DELETE need Content-Type: application/json",
               v);
  return std::nullopt;
}

// GET /kv/events under the same Host, Origin and token rules as every data route (the
// dashboard reads it with fetch(), which sends the Authorization header; EventSource could
// not). At most max_event_streams at once; the connection closes when the stream ends.
net::awaitable<void> admin_server::serve_events(tcp_stream& s,
                                                const http::request<http::string_body>& req) {
  const unsigned v = req.version();
  std::optional<response> refusal;
  if (auto why = cross_site_refusal(req)) {
    refusal = err(errc::route_forbidden, *why, v);
  } else if (auto denied = credential_refusal(req)) {
    refusal = std::move(denied);
  } else if (req.method() != http::verb::get) {
    refusal = err(errc::method_not_allowed, "use GET", v);
  } else if (event_streams_.fetch_add(1) >= max_event_streams) {
    --event_streams_;
    const core::error full{core::errc::over_capacity, 0,
                           fmt::format("at most {} event streams at once", max_event_streams), 5};
    refusal = error_answer(full, v, true);
    refusal->set(http::field::cache_control, "no-store");
  }
  if (refusal) {
    refusal->keep_alive(false);
    s.expires_after(event_write_timeout);
    co_await http::async_write(s, *refusal);
    co_return;
  }
  co_await stream_events(s, resume_point(req));
  --event_streams_;
}

// Polls the history every event_poll_interval and writes what is new, with a comment line
// after event_keepalive_interval of silence. A client that hangs up frees its stream at the
// next poll (a peek sees the EOF); a write to it would fail only at the second try.
net::awaitable<void> admin_server::stream_events(tcp_stream& s, std::uint64_t after) {
  http::response<http::empty_body> head{http::status::ok, 11};
  head.set(http::field::server, std::string("kvpersist/") + kvp::version);
  head.set(http::field::content_type, "text/event-stream; charset=utf-8");
  head.set(http::field::cache_control, "no-store");
  head.set("X-Accel-Buffering", "no");  // a reverse proxy in front must not buffer the stream
  head.keep_alive(false);               // the body ends when the connection closes
  http::response_serializer<http::empty_body> head_writer{head};
  s.expires_after(event_write_timeout);
  if (auto [ec, n] = co_await http::async_write_header(s, head_writer); ec) co_return;
  steady_timer tick(s.get_executor());
  auto last_write = std::chrono::steady_clock::now();
  while (!stopping_ && peek_peer(s.socket().native_handle()) != peer_state::hung_up) {
    const auto fresh = core::recent_events().since(after);
    std::string out = sse_frames(fresh);
    if (!fresh.empty()) after = fresh.back().seq;
    const auto now = std::chrono::steady_clock::now();
    if (out.empty() && now - last_write >= event_keepalive_interval) out = ": keep-alive\n\n";
    if (!out.empty()) {
      s.expires_after(event_write_timeout);
      if (auto [ec, n] = co_await net::async_write(s, net::buffer(out)); ec) co_return;
      last_write = now;
    }
    tick.expires_after(event_poll_interval);
    co_await tick.async_wait();
  }
}

net::awaitable<response> admin_server::route(http::request<http::string_body> req) {
  const unsigned v = req.version();
  const std::string target(req.target());
  const std::string raw_path = target.substr(0, target.find('?'));
  const std::string path = core::decode_path(raw_path);
  const auto method = req.method();
  // /healthz answers a constant and changes nothing, so it stays open to container health
  // checks whatever Host they send (Docker and Kubernetes probes may name a service).
  if (path == "/healthz") {
    if (method != http::verb::get && method != http::verb::head)
      co_return err(errc::method_not_allowed, "use GET", v);
    co_return json_ok(healthy_body(), v);
  }
  if (auto why = cross_site_refusal(req)) co_return err(errc::route_forbidden, *why, v);
  // The dashboard's files are the same for everyone and hold no data, so they need no token:
  // a browser cannot send a bearer header when it navigates. Its script asks for the token
  // and sends it on every request for data.
  if (const auto* file = ui_file(path)) {
    if (method != http::verb::get) co_return err(errc::method_not_allowed, "use GET", v);
    co_return ui_response(*file, v);
  }
  if (auto refused = credential_refusal(req)) co_return std::move(*refused);
  // ?server=NAME picks the llama-server for session operations (default: the first).
  coordinator* coord = coords_.front();
  if (auto name = core::query_param(target, "server"); name && !name->empty()) {
    auto it = std::find_if(coords_.begin(), coords_.end(),
                           [&](coordinator* c) { return c->name() == *name; });
    if (it == coords_.end()) co_return err(errc::not_found, "unknown server", v);
    coord = *it;
  }
  if (path == "/metrics") {
    if (method != http::verb::get) co_return err(errc::method_not_allowed, "use GET", v);
    co_return co_await all_metrics(coords_, v);
  }
  if (path == "/kv/status") {
    if (method != http::verb::get) co_return err(errc::method_not_allowed, "use GET", v);
    co_return co_await all_status(coords_, v);
  }
  if (path == "/kv/sessions") {
    if (method != http::verb::get) co_return err(errc::method_not_allowed, "use GET", v);
    co_return co_await list_sessions(coord, formatter_.get_executor(), target, v);
  }
  if (path == "/kv/flush" || path == "/kv/gc") {
    if (method != http::verb::post) co_return err(errc::method_not_allowed, "use POST", v);
    if (path == "/kv/flush") {
      const auto flushed = co_await coord->on_strand(coord->checkpoint());
      if (!flushed) co_return err(core::error{flushed.err().code, 0, "save failed"}, v);
      co_return outcome_response(admin_outcome{admin_result::flushed}, v);
    }
    const auto report = co_await coord->on_strand(coord->admin().gc());
    co_return json_ok(gc_report_json(report), v);
  }
  constexpr std::string_view prefix = "/kv/sessions/";
  if (raw_path.starts_with(prefix))
    co_return co_await session_route(coord, method, raw_path.substr(prefix.size()),
                                     std::move(req.body()), v);
  co_return err(errc::not_found, "not found", v);
}

}  // namespace kvp::proxy
