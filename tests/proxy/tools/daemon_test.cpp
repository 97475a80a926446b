// Tests for proxy/tools/daemon.hpp, the composition root: the descriptor budget both
// listeners' caps fit in; start binds the proxy and admin ports and serves the proxy port
// through the data plane; shutdown drains (an idle client closed, a request past the grace
// cancelled) and checkpoints each server. llama-server is a small fake on 127.0.0.1 that
// answers 404 to everything but GET /slow, which it never answers.
#include "proxy/tools/daemon.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "proxy/http/listen.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/loopback.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace daemon_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using namespace std::chrono_literals;
using kvp::testing::drive_until;
using kvp::testing::run_for;

// llama-server's stand-in: every request's target in `seen`; /slow holds its connection
// without an answer until kvpersist closes it.
struct fake_llama {
  explicit fake_llama(net::io_context& ioc) : acc(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
    net::co_spawn(ioc, accept_loop(), proxy::log_exception);
  }
  acceptor acc;
  std::vector<std::string> seen;

  net::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, sock] = co_await acc.async_accept();
      if (ec) co_return;
      net::co_spawn(acc.get_executor(), serve(std::move(sock)), proxy::log_exception);
    }
  }
  net::awaitable<void> serve(tcp::socket sock) {
    beast::flat_buffer buf;
    for (;;) {
      http::request<http::string_body> req;
      auto [ec, n] = co_await http::async_read(sock, buf, req, token);
      if (ec) co_return;
      seen.emplace_back(req.target());
      if (req.target() == "/slow") {
        char c;
        co_await sock.async_read_some(net::buffer(&c, 1), token);  // until kvpersist closes it
        co_return;
      }
      const std::string not_found = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
      auto [wec, wn] = co_await net::async_write(sock, net::buffer(not_found), token);
      if (wec) co_return;
    }
  }
};

// A client of the proxy port; reads what arrived without blocking.
struct client {
  net::io_context cio;
  tcp::socket sock{cio};
  kvp::testing::received got;
  explicit client(const std::string& address) {
    const auto colon = address.rfind(':');
    sock.connect({net::ip::make_address(address.substr(0, colon)),
                  static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)))});
    sock.non_blocking(true);
  }
  void send(const std::string& bytes) { net::write(sock, net::buffer(bytes)); }
  const kvp::testing::received& poll() {
    got.read_from(sock);
    return got;
  }
};

// A daemon for the fake, both ports on 127.0.0.1:0, a grace of 100 ms.
struct daemon_fixture {
  kvp::testing::temp_dir dir;
  net::io_context ioc;
  fake_llama llama{ioc};
  config::config cfg = [this] {
    config::config c;
    c.state_dir = dir.path();
    c.listen = "127.0.0.1:0";
    c.admin.listen = "127.0.0.1:0";
    c.upstream.url = "http://127.0.0.1:" + std::to_string(llama.acc.local_endpoint().port());
    c.shutdown_grace = 100ms;
    return c;
  }();
  std::unique_ptr<proxy::daemon> d;

  std::string start() {
    REQUIRE_FALSE(config::validate(cfg));
    d = std::make_unique<proxy::daemon>(ioc, cfg);
    auto bound = kvp::testing::run_on(ioc, ioc.get_executor(), d->start());
    REQUIRE(bound);
    return bound.value();
  }
  void shutdown() {
    kvp::testing::run_on(ioc, ioc.get_executor(), d->shutdown(), 10s);
    llama.acc.close();
    run_for(ioc, 50ms);  // the sessions' and the fake's coroutines end
  }
};

}  // namespace

TEST_CASE("the proxy's cap leaves room for the admin cap, upstream pools and files",
          "[proxy][daemon]") {
  using kvp::proxy::proxy_connection_cap;
  using kvp::proxy::reserved_descriptors;
  kvp::config::config cfg;
  for (std::uint64_t nofile : {128u, 256u, 1024u, 8192u}) {
    const auto cap = proxy_connection_cap(cfg, nofile);
    CHECK(2 * cap + reserved_descriptors(cfg) <= nofile);
  }
  CHECK(proxy_connection_cap(cfg, 1'000'000) == cfg.limits.max_connections);
  CHECK(proxy_connection_cap(cfg, 16) == 1);  // never 0: the proxy still serves one client

  const auto with_admin = reserved_descriptors(cfg);
  cfg.admin.max_connections = 100;
  CHECK(reserved_descriptors(cfg) == with_admin + 100 - 16);
  cfg.admin.listen = "";  // no admin listener: nothing reserved for it
  CHECK(reserved_descriptors(cfg) == with_admin - 16 - 1);
  cfg.upstream.max_idle_connections = 40;  // each server's idle pool
  CHECK(reserved_descriptors(cfg) == with_admin - 17 + 24);
}

TEST_CASE("the daemon serves the proxy port and closes an idle client when it shuts down",
          "[proxy][daemon]") {
  kvp::testing::log_capture logs;
  daemon_fixture f;
  const std::string address = f.start();
  CHECK(address.rfind("127.0.0.1:", 0) == 0);
  CHECK(f.d->admin_address().rfind("127.0.0.1:", 0) == 0);
  CHECK(f.d->admin_address() != address);

  client c(address);
  c.send("GET /health HTTP/1.1\r\nHost: kvp\r\n\r\n");
  drive_until(f.ioc, [&] { return c.poll().bytes.find("\r\n\r\n") != std::string::npos; });
  CHECK(c.got.bytes.rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);  // llama-server's answer
  CHECK(f.llama.seen.back() == "/health");
  CHECK_FALSE(c.got.closed);
  run_for(f.ioc, 50ms);  // the session finishes its request and waits for the next

  f.shutdown();
  CHECK(c.poll().closed);
  REQUIRE(logs.of("kv.proxy.draining").size() == 1);
  CHECK(logs.of("kv.proxy.draining")[0].find("in_flight=0") != std::string::npos);
  CHECK(logs.of("kv.proxy.grace_expired").empty());
  REQUIRE(logs.of("kv.shutdown.checkpoint").size() == 1);
  CHECK(logs.of("kv.shutdown.checkpoint")[0].find("server=default result=ok") != std::string::npos);
}

TEST_CASE("a request still running when the grace ends is cancelled, then the checkpoint runs",
          "[proxy][daemon]") {
  kvp::testing::log_capture logs;
  daemon_fixture f;
  client c(f.start());
  c.send("GET /slow HTTP/1.1\r\nHost: kvp\r\n\r\n");
  drive_until(f.ioc, [&] { return !f.llama.seen.empty() && f.llama.seen.back() == "/slow"; });

  f.shutdown();
  CHECK(c.poll().closed);
  CHECK(c.got.bytes.empty());  // nothing was answered: the connection just closed
  REQUIRE(logs.of("kv.proxy.draining").size() == 1);
  CHECK(logs.of("kv.proxy.draining")[0].find("in_flight=1") != std::string::npos);
  REQUIRE(logs.of("kv.proxy.grace_expired").size() == 1);
  CHECK(logs.of("kv.proxy.grace_expired")[0].find("cancelled=1") != std::string::npos);
  CHECK(logs.of("kv.shutdown.checkpoint").size() == 1);
}

}  // namespace daemon_test
