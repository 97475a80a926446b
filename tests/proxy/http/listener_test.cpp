// Tests for proxy/http/listener.hpp: a port's connection cap, wait or refuse.
#include "proxy/http/listener.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "proxy/http/listen.hpp"
#include "tests/support/run.hpp"

namespace listener_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::proxy::listener;
using kvp::proxy::listener_options;
using kvp::proxy::when_full;
using kvp::testing::drive_until;
using kvp::testing::run_for;
namespace net = kvp::net;
using kvp::tcp;

// A listener on 127.0.0.1:0 whose sessions hold their connection until the client closes it;
// `served` counts the sessions started.
struct test_port {
  net::io_context ioc;
  int served = 0;
  std::unique_ptr<listener> port;
  std::uint16_t port_number = 0;

  test_port(std::size_t cap, when_full at_cap, std::string refusal = {}) {
    auto bound = kvp::proxy::listen_on(ioc, "127.0.0.1:0", "test");
    REQUIRE(bound);
    port_number = bound.value()->local_endpoint().port();
    listener_options opts{"test", "test.maxConnections", cap, at_cap, std::move(refusal)};
    port = std::make_unique<listener>(ioc, std::move(bound.value()), std::move(opts),
                                      [this](kvp::tcp_stream s) { return hold(std::move(s)); });
    port->start();
  }

  net::awaitable<void> hold(kvp::tcp_stream s) {
    ++served;
    char c;
    co_await s.async_read_some(net::buffer(&c, 1));  // until the client closes
  }
};

// A blocking client socket, connected through the kernel's backlog (nobody needs to accept).
struct client {
  net::io_context ioc;
  tcp::socket sock{ioc};
  explicit client(std::uint16_t port) {
    sock.connect({net::ip::make_address("127.0.0.1"), port});
    sock.non_blocking(true);
  }
  // What has arrived so far, and whether the server closed the connection.
  std::string received;
  bool closed = false;
  void poll() {
    char buf[512];
    for (;;) {
      boost::system::error_code ec;
      const auto n = sock.read_some(net::buffer(buf), ec);
      if (ec == net::error::would_block) return;
      if (ec) {
        closed = true;
        return;
      }
      received.append(buf, n);
    }
  }
};

}  // namespace

TEST_CASE("at its cap a waiting listener leaves clients in the backlog until one closes",
          "[proxy][listener]") {
  test_port t(2, when_full::wait);
  std::vector<std::unique_ptr<client>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(std::make_unique<client>(t.port_number));
  drive_until(t.ioc, [&] { return t.served == 2; });
  run_for(t.ioc, 200ms);
  CHECK(t.served == 2);  // the third waits, accepted by nobody
  CHECK(t.port->open_connections() == 2);
  clients[0]->sock.close();
  drive_until(t.ioc, [&] { return t.served == 3; });
  CHECK(t.port->open_connections() == 2);
  clients[2]->poll();
  CHECK_FALSE(clients[2]->closed);
  t.port->stop();
  run_for(t.ioc, 50ms);
}

TEST_CASE("at its cap a refusing listener answers the client beyond it and closes it",
          "[proxy][listener]") {
  test_port t(1, when_full::refuse, "HTTP/1.1 503 Service Unavailable\r\n\r\n");
  client first(t.port_number);
  drive_until(t.ioc, [&] { return t.served == 1; });
  client second(t.port_number);
  drive_until(t.ioc, [&] {
    second.poll();
    return second.closed;
  });
  CHECK(second.received == "HTTP/1.1 503 Service Unavailable\r\n\r\n");
  first.poll();
  CHECK(first.received.empty());
  CHECK_FALSE(first.closed);
  CHECK(t.served == 1);
  first.sock.close();  // room again: the next client is served
  drive_until(t.ioc, [&] { return t.port->open_connections() == 0; });
  client third(t.port_number);
  drive_until(t.ioc, [&] { return t.served == 2; });
  t.port->stop();
  run_for(t.ioc, 50ms);
}

TEST_CASE("a stopped listener accepts nothing more", "[proxy][listener]") {
  test_port t(4, when_full::wait);
  t.port->stop();
  run_for(t.ioc, 50ms);
  net::io_context cio;
  tcp::socket s(cio);
  boost::system::error_code ec;
  s.connect({net::ip::make_address("127.0.0.1"), t.port_number}, ec);
  CHECK(ec == net::error::connection_refused);
}

}  // namespace listener_test
