// Tests for proxy/data/forwarder.hpp on bytes: a real client socket pair and a scripted
// llama-server on 127.0.0.1 (one step per connection it accepts), so the peek for a pooled
// connection closed meanwhile, the watcher of the client's hang-up and the relay all run as
// in the daemon. What the client receives, how many requests llama-server saw, and the pool
// afterwards are checked for each way a relay ends; the retry rule and the answer for each
// relay_end also as plain functions.
#include "proxy/data/forwarder.hpp"

#include <catch2/catch.hpp>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "proxy/http/listen.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/loopback.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace forwarder_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using namespace std::chrono_literals;
using kvp::proxy::relay_end;
using kvp::proxy::relay_state;
using kvp::testing::drive_until;
using kvp::testing::run_for;
using kvp::testing::run_on;

const std::string ok_reply = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

// What llama-server does on one connection.
enum class upstream_does {
  answer,            // reads the request, writes `reply`, keeps the connection
  answer_and_close,  // reads the request, writes `reply`, closes
  close_unanswered,  // reads the request, closes
  stay_silent,       // reads the request, answers nothing until kvpersist closes
  close_at_once,     // closes before any request (its keep-alive timeout)
};

struct step {
  upstream_does what;
  std::string reply;
};

// llama-server's stand-in: the n-th connection it accepts follows script[n] (stay_silent past
// the end); `targets` lists every request it read, `hung_up_on` the silent connections
// kvpersist closed.
struct scripted_llama {
  explicit scripted_llama(net::io_context& ioc)
      : acc(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
    net::co_spawn(ioc, accept_loop(), proxy::log_exception);
  }
  acceptor acc;
  std::deque<step> script;
  std::vector<std::string> targets;
  int hung_up_on = 0;

  net::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, sock] = co_await acc.async_accept();
      if (ec) co_return;
      step next{upstream_does::stay_silent, ""};
      if (!script.empty()) {
        next = script.front();
        script.pop_front();
      }
      net::co_spawn(acc.get_executor(), serve(std::move(sock), next), proxy::log_exception);
    }
  }

  net::awaitable<void> serve(tcp::socket sock, step s) {
    if (s.what == upstream_does::close_at_once) co_return;  // the socket closes here
    beast::flat_buffer buf;
    http::request<http::string_body> req;
    auto [ec, n] = co_await http::async_read(sock, buf, req, token);
    if (ec) co_return;
    targets.emplace_back(req.target());
    if (s.what == upstream_does::close_unanswered) co_return;
    if (s.what == upstream_does::answer || s.what == upstream_does::answer_and_close) {
      auto [wec, wn] = co_await net::async_write(sock, net::buffer(s.reply), token);
      if (wec || s.what == upstream_does::answer_and_close) co_return;
    }
    char c;
    auto [rec, rn] = co_await sock.async_read_some(net::buffer(&c, 1), token);
    if (rec && s.what == upstream_does::stay_silent) ++hung_up_on;
  }
};

// A header and as many body bytes as its Content-Length says.
bool whole_response(const std::string& wire) {
  const auto end = wire.find("\r\n\r\n");
  const auto length = wire.find("Content-Length: ");
  if (end == std::string::npos || length == std::string::npos || length > end) return false;
  return wire.size() - end - 4 >= std::stoul(wire.substr(length + 16));
}

// A client's POST routed to the scripted llama-server (upstream.idleTimeoutMs 300 ms).
struct forward_fixture {
  kvp::testing::temp_dir dir;
  net::io_context ioc;
  scripted_llama llama{ioc};
  config::config cfg = [this] {
    config::config c;
    c.state_dir = dir.path();
    c.upstream.url = "http://127.0.0.1:" + std::to_string(llama.acc.local_endpoint().port());
    c.upstream.idle_timeout = 300ms;
    return c;
  }();
  proxy::upstream_table table{ioc, cfg};
  proxy::forwarder fwd{table};
  kvp::testing::loopback_pair client_pair{ioc};
  proxy::client_conn client{std::move(client_pair.ours), 1s};
  std::optional<proxy::exchange> x;

  forward_fixture() {
    http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
    req.body() = "{}";
    req.prepare_payload();
    auto rc = core::classify(req.method_string(), req.target());
    x.emplace(client, std::move(req), std::move(rc));
    x->up = &table.route(x->req);
  }

  bool forward(std::optional<proxy::upstream_conn> pre = std::nullopt) {
    return run_on(ioc, ioc.get_executor(), fwd.forward(*x, std::move(pre)));
  }
  // A connection as the pool hands out an idle one: open, reused (not fresh).
  proxy::upstream_conn pooled_connection() {
    auto opened = run_on(ioc, ioc.get_executor(), x->up->pool->acquire(ioc.get_executor()));
    REQUIRE(opened);
    return proxy::upstream_conn{std::move(opened->stream), false};
  }
  // What the client has received once a whole response, or the connection's close, arrived.
  const kvp::testing::received& client_got() {
    drive_until(ioc, [&] {
      const auto& got = client_pair.peer_received();
      return got.closed || whole_response(got.bytes);
    });
    return client_pair.peer_received();
  }
  bool pool_has_idle() {
    auto idle = x->up->pool->take_idle(ioc.get_executor());
    return idle != nullptr;
  }
};

// The JSON body of an error answer in `wire`, and its status line.
std::string status_line(const std::string& wire) { return wire.substr(0, wire.find("\r\n")); }
std::string body_of(const std::string& wire) {
  const auto at = wire.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : wire.substr(at + 4);
}

}  // namespace

TEST_CASE("the retry rule: once, on a reused connection closed before any answer",
          "[proxy][forwarder]") {
  using proxy::retry_on_new_connection;
  relay_state closed;  // the pooled connection was closed: no header, relay_end none or broke
  closed.end = relay_end::upstream_broke;
  CHECK(retry_on_new_connection(closed, false, 0));
  CHECK(retry_on_new_connection(relay_state{}, false, 0));  // the write itself failed
  CHECK_FALSE(retry_on_new_connection(closed, true, 0));    // a new connection: the server is gone
  CHECK_FALSE(retry_on_new_connection(closed, false, 1));   // once only

  relay_state timed_out;  // a slow server has the request: never sent twice
  timed_out.end = relay_end::upstream_timed_out;
  CHECK_FALSE(retry_on_new_connection(timed_out, false, 0));

  relay_state answered = closed;  // a status line came back: the request ran
  answered.header_received = true;
  CHECK_FALSE(retry_on_new_connection(answered, false, 0));
}

TEST_CASE("an upstream failure before the status line is a timeout or a close",
          "[proxy][forwarder]") {
  CHECK(proxy::upstream_failure(relay_end::upstream_timed_out).code ==
        core::errc::upstream_timeout);
  CHECK(proxy::upstream_failure(relay_end::upstream_broke).code == core::errc::upstream_closed);
  CHECK(proxy::upstream_failure(relay_end::none).code == core::errc::upstream_closed);
}

TEST_CASE("a delivered response reaches the client and its connection goes back to the pool",
          "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::answer, ok_reply}};
  CHECK(f.forward());
  CHECK(f.x->relayed.end == relay_end::delivered);
  CHECK(f.x->relayed.request_sent);
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 200 OK");
  CHECK(body_of(got.bytes) == "hello");
  CHECK(f.llama.targets == std::vector<std::string>{"/v1/chat/completions"});
  CHECK(f.pool_has_idle());
}

TEST_CASE("a pooled connection closed unanswered is retried once on a new connection",
          "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::close_unanswered, ""}, {upstream_does::answer, ok_reply}};
  auto pooled = f.pooled_connection();
  CHECK(f.forward(std::move(pooled)));
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 200 OK");
  CHECK(body_of(got.bytes) == "hello");  // one answer: the failed attempt sent the client nothing
  CHECK(f.llama.targets.size() == 2);    // the same request, on the second connection
}

TEST_CASE("a new connection closed unanswered is not retried: 502", "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::close_unanswered, ""}, {upstream_does::answer, ok_reply}};
  CHECK(f.forward());  // the client's connection goes on
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 502 Bad Gateway");
  CHECK(body_of(got.bytes) == R"({"error":{"code":502,"message":"upstream llama-server closed )"
                              R"(the connection","type":"server_error"}})");
  CHECK(f.llama.targets.size() == 1);
  CHECK_FALSE(f.pool_has_idle());
}

TEST_CASE("a pooled connection is retried once only", "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::close_unanswered, ""},
                    {upstream_does::close_unanswered, ""},
                    {upstream_does::answer, ok_reply}};
  auto pooled = f.pooled_connection();
  CHECK(f.forward(std::move(pooled)));
  CHECK(status_line(f.client_got().bytes) == "HTTP/1.1 502 Bad Gateway");
  CHECK(f.llama.targets.size() == 2);
}

TEST_CASE("a read that times out is answered 504 and never sent twice", "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::stay_silent, ""}, {upstream_does::answer, ok_reply}};
  auto pooled = f.pooled_connection();
  CHECK(f.forward(std::move(pooled)));
  CHECK(f.x->relayed.end == relay_end::upstream_timed_out);
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 504 Gateway Timeout");
  CHECK(body_of(got.bytes) ==
        R"({"error":{"code":504,"message":"upstream llama-server timed out",)"
        R"("type":"timeout_error"}})");
  CHECK(f.llama.targets.size() == 1);
  drive_until(f.ioc, [&] { return f.llama.hung_up_on == 1; });  // the timed-out one is closed
}

TEST_CASE("a short reply that breaks before its end is answered 502", "[proxy][forwarder]") {
  forward_fixture f;
  // A small body of known length is read whole before the client sees the header.
  const std::string cut = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial";
  f.llama.script = {{upstream_does::answer_and_close, cut}};
  CHECK(f.forward());
  CHECK(f.x->relayed.end == relay_end::upstream_broke);
  CHECK_FALSE(f.x->relayed.header_sent);
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 502 Bad Gateway");
  CHECK(body_of(got.bytes) == R"({"error":{"code":502,"message":"upstream llama-server closed )"
                              R"(the connection","type":"server_error"}})");
  CHECK(f.llama.targets.size() == 1);  // a status line came back: not retried
}

TEST_CASE("a stream that breaks mid-body closes the client's connection", "[proxy][forwarder]") {
  kvp::testing::log_capture logs;
  forward_fixture f;
  const std::string cut = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\npartial\r\n";
  f.llama.script = {{upstream_does::answer_and_close, cut}};
  CHECK_FALSE(f.forward());
  CHECK(f.x->relayed.end == relay_end::upstream_broke);
  CHECK(f.x->relayed.header_sent);
  f.client.stream.close();  // as the session does when forward says the connection is over
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 200 OK");
  CHECK(body_of(got.bytes) == "7\r\npartial\r\n");  // no last chunk, no error: truncated
  REQUIRE(logs.of("kv.upstream.broken_stream").size() == 1);
  CHECK(logs.of("kv.upstream.broken_stream")[0].find("status=200 bytes=7") != std::string::npos);
}

TEST_CASE("a client that leaves mid-relay has its upstream connection closed",
          "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::stay_silent, ""}};
  auto done = kvp::testing::spawn(f.ioc.get_executor(), f.fwd.forward(*f.x, std::nullopt));
  drive_until(f.ioc, [&] { return f.llama.targets.size() == 1; });
  f.client_pair.peer.close();
  drive_until(f.ioc, [&] { return kvp::testing::is_ready(done); });
  CHECK_FALSE(done.get());
  drive_until(f.ioc, [&] { return f.llama.hung_up_on == 1; });  // the only portable cancel
  CHECK_FALSE(f.pool_has_idle());
}

TEST_CASE("a pooled connection closed while the slot was prepared is replaced before sending",
          "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.script = {{upstream_does::close_at_once, ""}, {upstream_does::answer, ok_reply}};
  auto pooled = f.pooled_connection();
  run_for(f.ioc, 50ms);  // llama-server's close arrives
  CHECK(f.forward(std::move(pooled)));
  CHECK(status_line(f.client_got().bytes) == "HTTP/1.1 200 OK");
  CHECK(f.llama.targets.size() == 1);  // sent once, on the new connection
}

TEST_CASE("an unreachable llama-server is answered 502", "[proxy][forwarder]") {
  forward_fixture f;
  f.llama.acc.close();  // nothing listens on its port any more
  CHECK(f.forward());
  const auto& got = f.client_got();
  CHECK(status_line(got.bytes) == "HTTP/1.1 502 Bad Gateway");
  CHECK(body_of(got.bytes) ==
        R"({"error":{"code":502,"message":"upstream llama-server is unreachable",)"
        R"("type":"server_error"}})");
  CHECK_FALSE(f.x->relayed.request_sent);
}

}  // namespace forwarder_test
