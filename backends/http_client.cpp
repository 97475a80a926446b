#include "backends/http_client.hpp"

#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

namespace kvp::backends {

std::string host_field(const http_endpoint& ep) {
  const bool ipv6 = ep.host.find(':') != std::string::npos;
  const auto host = ipv6 ? fmt::format("[{}]", ep.host) : ep.host;
  return ep.port == 80 ? host : fmt::format("{}:{}", host, ep.port);
}

net::awaitable<core::result<http_reply>> http_call(http_endpoint ep, http::verb method,
                                                   std::string target, std::string body,
                                                   std::chrono::milliseconds timeout) {
  auto ex = co_await net::this_coro::executor;
  bool sent = false;  // failures after the request went out may be the request's fault
  auto fail = [&](const beast::error_code& ec) {
    const auto code = ec == beast::error::timeout ? core::errc::operation_timeout
                      : sent                      ? core::errc::backend_disconnected
                                                  : core::errc::backend_unavailable;
    return core::error{code, 0, fmt::format("{} {}: {}", http::to_string(method), target,
                                            ec.message())};
  };
  resolver res(ex);
  auto [rec, endpoints] = co_await res.async_resolve(ep.host, std::to_string(ep.port));
  if (rec) co_return fail(rec);

  tcp_stream stream(ex);
  stream.expires_after(timeout);  // one deadline for connect, write and read
  auto [cec, _] = co_await stream.async_connect(endpoints);
  if (cec) co_return fail(cec);
  beast::error_code nodelay_ec;  // an optimisation: a socket that refuses it still works
  stream.socket().set_option(tcp::no_delay(true), nodelay_ec);

  http::request<http::string_body> req{method, ep.base_path + target, 11};
  req.set(http::field::host, host_field(ep));
  req.set(http::field::user_agent, "kvpersist");
  if (!ep.api_key.empty()) req.set(http::field::authorization, "Bearer " + ep.api_key);
  // POST and DELETE always say JSON: kvpersist's admin API refuses them otherwise (CSRF).
  if (!body.empty() || method == http::verb::post || method == http::verb::delete_) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(body);
    req.prepare_payload();
  }
  req.keep_alive(false);
  auto [wec, wn] = co_await http::async_write(stream, req);
  if (wec) co_return fail(wec);
  sent = true;

  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(16 * 1024 * 1024);  // /slots of a big server is still far below this
  auto [ren, rn] = co_await http::async_read(stream, buf, p);
  if (ren) co_return fail(ren);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  co_return http_reply{static_cast<int>(p.get().result_int()), std::move(p.get().body())};
}

}  // namespace kvp::backends
