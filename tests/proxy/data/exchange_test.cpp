// Tests for proxy/data/exchange.hpp: kvpersist's own answers keep the client's HTTP version
// and keep-alive after the request is prepared for llama-server (HTTP/1.1 keep-alive), and
// are error_answer's bytes. The client is a real socket pair on 127.0.0.1.
#include "proxy/data/exchange.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "tests/support/loopback.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace exchange_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using namespace std::chrono_literals;
using kvp::testing::drive_until;
using kvp::testing::run_on;

// A request `client_version` HTTP/1.x client sent, routed to the only configured server.
struct routed_exchange {
  kvp::testing::temp_dir dir;
  net::io_context ioc;
  kvp::testing::loopback_pair pair{ioc};
  proxy::client_conn client{std::move(pair.ours), 1s};
  config::config cfg = [this] {
    config::config c;
    c.state_dir = dir.path();
    c.upstream.url = "http://127.0.0.1:8080/base";
    return c;
  }();
  proxy::upstream_table table{ioc, cfg};
  std::optional<proxy::exchange> x;

  explicit routed_exchange(unsigned client_version) {
    http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", client_version};
    req.body() = "{}";
    req.prepare_payload();
    auto rc = core::classify(req.method_string(), req.target());
    x.emplace(client, std::move(req), std::move(rc));
    x->up = &table.route(x->req);
  }
};

}  // namespace

TEST_CASE("an exchange answers in the client's version after the request is prepared",
          "[proxy][exchange]") {
  routed_exchange t(10);  // HTTP/1.0 without keep-alive
  CHECK(t.x->rc.needs_slot);
  t.table.prepare_request(*t.x->up, t.x->req);
  CHECK(t.x->req.version() == 11);  // what llama-server is sent
  CHECK(t.x->req.keep_alive());
  CHECK(t.x->req.target() == "/base/v1/chat/completions");
  CHECK(t.x->version == 10);
  CHECK_FALSE(t.x->keep_alive);

  const core::error busy{core::errc::slot_busy, 0, "timed out waiting for the slot", 2};
  CHECK_FALSE(run_on(t.ioc, t.ioc.get_executor(), proxy::answer_error(*t.x, busy)));
  const std::string expected = [&] {
    auto res = proxy::error_response(busy, 10, false);
    std::ostringstream out;
    out << res;
    return out.str();
  }();
  drive_until(t.ioc, [&] { return t.pair.peer_received().bytes.size() >= expected.size(); });
  CHECK(t.pair.peer_received().bytes == expected);
  CHECK(expected.rfind("HTTP/1.0 503 Service Unavailable\r\n", 0) == 0);
  CHECK(expected.find("Retry-After: 2\r\n") != std::string::npos);
}

TEST_CASE("an HTTP/1.1 client's error answer keeps its connection", "[proxy][exchange]") {
  routed_exchange t(11);
  const kvp::core::error unauthorized{kvp::core::errc::credential_refused, 0, "Invalid API Key"};
  CHECK(run_on(t.ioc, t.ioc.get_executor(), proxy::answer_error(*t.x, unauthorized)));
  drive_until(t.ioc, [&] { return t.pair.peer_received().bytes.find("Invalid API Key") != std::string::npos; });
  CHECK(t.pair.peer_received().bytes.rfind("HTTP/1.1 401 Unauthorized\r\n", 0) == 0);
  CHECK_FALSE(t.pair.peer_received().closed);
}

}  // namespace exchange_test
