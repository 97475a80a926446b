#include "proxy/admin.hpp"

#include <openssl/crypto.h>

#include <fmt/format.h>

#include "config/config.hpp"
#include "core/log.hpp"
#include "proxy/listen.hpp"
#include "core/metrics.hpp"
#include "core/request_class.hpp"
#include "core/version.hpp"
#include "proxy/http_status.hpp"
#include "proxy/request_reader.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

http::response<http::string_body> json(unsigned status, std::string body, unsigned version) {
  http::response<http::string_body> res{static_cast<http::status>(status), version};
  res.set(http::field::server, std::string("kvpersist/") + kvp::version);
  res.set(http::field::content_type, "application/json");
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// Constant-time comparison so the token cannot be guessed byte by byte from timings.
bool token_matches(std::string_view header, const std::string& token) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || !header.starts_with(prefix)) return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
}

// Coroutines that read coordinator state on its strand (plain functions, not capturing
// lambdas: CP.51).
net::awaitable<core::prom_writer> metrics_of(coordinator* c) {
  core::prom_writer w;
  c->write_metrics(w);
  co_return w;
}
net::awaitable<std::string> status_of(coordinator* c) { co_return c->status_json(); }
net::awaitable<std::string> sessions_of(coordinator* c) { co_return c->sessions_json(); }
net::awaitable<admin_reply> session_of(coordinator* c, std::string id) {
  co_return c->session_json(id);
}

}  // namespace

admin_server::admin_server(net::io_context& ioc, std::vector<coordinator*> coords,
                           std::string listen, std::string token)
    : ioc_(ioc), coords_(std::move(coords)), listen_(std::move(listen)), token_(std::move(token)) {}

core::result<std::string> admin_server::start() {
  auto a = listen_on(ioc_, listen_, "admin");
  if (!a) return a.err();
  acceptor_ = std::move(a.value());
  net::co_spawn(ioc_, accept_loop(), log_exception);
  return local_address(*acceptor_);
}

void admin_server::stop() {
  beast::error_code ignored;
  if (acceptor_) acceptor_->close(ignored);
}

net::awaitable<void> admin_server::accept_loop() {
  for (;;) {
    tcp::socket sock(net::make_strand(ioc_));
    auto [ec] = co_await acceptor_->async_accept(sock);
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor_->is_open()) co_return;
      continue;
    }
    auto ex = sock.get_executor();
    net::co_spawn(ex, run_session(tcp_stream(std::move(sock))), log_exception);
  }
}

net::awaitable<void> admin_server::run_session(tcp_stream s) {
  beast::flat_buffer buf;
  const read_limits limits{16 * 1024, 64 * 1024, std::chrono::seconds(30),
                           std::chrono::seconds(30), std::chrono::seconds(30), {}};
  for (;;) {
    request_reader reader(s, buf, limits);
    if (!co_await reader.read_header() || !co_await reader.read_body()) break;
    auto req = reader.release();
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

net::awaitable<http::response<http::string_body>> admin_server::route(
    http::request<http::string_body> req) {
  const unsigned v = req.version();
  const std::string target(req.target());
  const std::string path = core::decode_path(target.substr(0, target.find('?')));
  auto err = [&](unsigned status, std::string_view msg) {
    return json(status,
                fmt::format(R"({{"error":{{"code":{},"message":"{}"}}}})", status, msg), v);
  };
  const auto method = req.method();
  if (path == "/healthz") {
    if (method != http::verb::get && method != http::verb::head) co_return err(405, "use GET");
    co_return json(200, R"({"status":"ok"})", v);
  }
  if (!token_.empty() && !token_matches(req[http::field::authorization], token_)) {
    auto res = err(401, "missing or wrong bearer token");
    res.set(http::field::www_authenticate, "Bearer");
    co_return res;
  }
  // ?server=NAME picks the llama-server for session operations (default: the first).
  std::string server_name;
  if (auto q = target.find('?'); q != std::string::npos) {
    std::string_view query = std::string_view(target).substr(q + 1);
    for (std::size_t pos = 0; pos <= query.size();) {
      auto amp = query.find('&', pos);
      auto part = query.substr(pos, amp == std::string_view::npos ? std::string_view::npos : amp - pos);
      if (part.starts_with("server=")) server_name = core::decode_path(part.substr(7));
      if (amp == std::string_view::npos) break;
      pos = amp + 1;
    }
  }
  coordinator* coord = coords_.front();
  if (!server_name.empty()) {
    coord = nullptr;
    for (auto* c : coords_)
      if (c->name() == server_name) coord = c;
    if (!coord) co_return err(404, "unknown server");
  }
  auto on_strand = [&](auto fn) {
    return net::co_spawn(coord->strand(), std::move(fn), net::use_awaitable);
  };
  if (path == "/metrics") {
    if (method != http::verb::get) co_return err(405, "use GET");
    core::prom_writer all;
    for (auto* c : coords_) {
      auto part = co_await net::co_spawn(c->strand(), metrics_of(c), net::use_awaitable);
      all.merge(part);
    }
    std::string text = all.text();
    http::response<http::string_body> res{http::status::ok, v};
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = std::move(text);
    res.prepare_payload();
    co_return res;
  }
  if (path == "/kv/status") {
    if (method != http::verb::get) co_return err(405, "use GET");
    std::string servers;
    for (auto* c : coords_) {
      auto part = co_await net::co_spawn(c->strand(), status_of(c), net::use_awaitable);
      servers += (servers.empty() ? "" : ",") + part;
    }
    co_return json(200, fmt::format(R"({{"version":"{}","servers":[{}]}})", kvp::version, servers), v);
  }
  if (path == "/kv/sessions") {
    if (method != http::verb::get) co_return err(405, "use GET");
    auto s = co_await on_strand(sessions_of(coord));
    co_return json(200, std::move(s), v);
  }
  if (path == "/kv/flush" || path == "/kv/gc") {
    if (method != http::verb::post) co_return err(405, "use POST");
    // One co_await per statement: g++ 12 miscompiles co_await inside ?: (double free).
    admin_reply r;
    if (path == "/kv/flush") {
      r = co_await on_strand(coord->admin_flush());
    } else {
      r = co_await on_strand(coord->admin_gc());
    }
    co_return json(r.status, std::move(r.body), v);
  }
  constexpr std::string_view prefix = "/kv/sessions/";
  const std::string raw_path = target.substr(0, target.find('?'));
  if (raw_path.starts_with(prefix)) {
    // Split before decoding: a session id may contain an encoded '/' (a%2Fb).
    std::string rest = raw_path.substr(prefix.size());
    std::string action;
    if (auto slash = rest.find('/'); slash != std::string::npos) {
      action = core::decode_path(rest.substr(slash + 1));
      rest.resize(slash);
    }
    rest = core::decode_path(rest);
    if (rest.empty()) co_return err(404, "no session id in the path");
    admin_reply r;
    if (action.empty()) {
      if (method == http::verb::get) {
        r = co_await on_strand(session_of(coord, rest));
      } else if (method == http::verb::delete_) {
        r = co_await on_strand(coord->admin_purge(rest));
      } else {
        co_return err(405, "use GET or DELETE");
      }
    } else {
      if (method != http::verb::post) co_return err(405, "use POST");
      if (action == "save" || action == "flush")
        r = co_await on_strand(coord->admin_save(rest));
      else if (action == "restore")
        r = co_await on_strand(coord->admin_restore(rest));
      else if (action == "invalidate")
        r = co_await on_strand(coord->admin_invalidate(rest));
      else
        co_return err(404, "unknown action (save, flush, restore, invalidate)");
    }
    co_return json(r.status, std::move(r.body), v);
  }
  co_return err(404, "not found");
}

}  // namespace kvp::proxy
