#include "proxy/http/listen.hpp"

#include <fmt/format.h>

#include "config/config.hpp"
#include "core/log.hpp"

namespace kvp::proxy {

core::result<std::unique_ptr<acceptor>> listen_on(net::io_context& ioc, const std::string& host_port,
                                                  std::string_view what) {
  std::string host;
  std::uint16_t port = 0;
  config::parse_host_port(host_port, host, port);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec)
    return core::error{core::errc::listen_failed, 0, fmt::format("{}: bad address {}", what, host)};
  tcp::endpoint ep{addr, port};
  auto a = std::make_unique<acceptor>(ioc);
  a->open(ep.protocol(), ec);
  if (!ec) a->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a->bind(ep, ec);
  if (!ec) a->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return core::error{core::errc::listen_failed, 0,
                       fmt::format("cannot listen on {} ({}): {}", host_port, what, ec.message())};
  return a;
}

std::string local_address(const acceptor& a) {
  auto local = a.local_endpoint();
  return local.address().is_v6()
             ? fmt::format("[{}]:{}", local.address().to_string(), local.port())
             : fmt::format("{}:{}", local.address().to_string(), local.port());
}

void log_exception(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    core::log(core::log_level::error, "kv.internal.exception", {{"what", ex.what()}});
  }
}

}  // namespace kvp::proxy
