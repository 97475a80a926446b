// Tests for proxy/data/client_conn.hpp over a real socket pair on 127.0.0.1 (a hang-up is
// found by a peek): what send writes and whether the connection goes on, a hang-up seen
// without consuming a pipelined request, and a held conversation request that only a stop
// abandons.
#include "proxy/data/client_conn.hpp"

#include <catch2/catch.hpp>

#include <string>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include "tests/support/loopback.hpp"
#include "tests/support/run.hpp"

namespace client_conn_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using namespace std::chrono_literals;
using kvp::testing::drive_until;
using kvp::testing::loopback_pair;
using kvp::testing::run_for;
using kvp::testing::run_on;

proxy::response ok_response(bool keep_alive) {
  proxy::response res{http::status::ok, 11};
  res.keep_alive(keep_alive);
  res.body() = "ok";
  res.prepare_payload();
  return res;
}

// A connection of the proxy port whose client is `pair.peer`.
struct connection {
  net::io_context ioc;
  loopback_pair pair{ioc};
  proxy::client_conn c{std::move(pair.ours), 1s};
};

}  // namespace

TEST_CASE("send writes the response whole and says whether the connection goes on",
          "[proxy][client_conn]") {
  connection t;
  CHECK(run_on(t.ioc, t.ioc.get_executor(), t.c.send(ok_response(true))));
  drive_until(t.ioc, [&] { return t.pair.peer_received().bytes.size() >= 40; });
  CHECK(t.pair.peer_received().bytes ==
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");

  CHECK_FALSE(run_on(t.ioc, t.ioc.get_executor(), t.c.send(ok_response(false))));
  t.pair.peer.close();
  run_for(t.ioc, 20ms);
  // The client is gone: the write fails, and the connection does not go on.
  bool went_on = true;
  for (int i = 0; i < 50 && went_on; ++i)  // the first writes may still fit the socket buffer
    went_on = run_on(t.ioc, t.ioc.get_executor(), t.c.send(ok_response(true)));
  CHECK_FALSE(went_on);
}

TEST_CASE("a hang-up is seen without consuming a pipelined request", "[proxy][client_conn]") {
  connection t;
  CHECK_FALSE(t.c.hung_up());
  CHECK_FALSE(t.c.abandoned());
  net::cancellation_signal cancel;
  auto gone = net::co_spawn(t.ioc, t.c.gone(),
                            net::bind_cancellation_slot(cancel.slot(), net::use_future));
  t.pair.send("GET /next HTTP/1.1\r\n\r\n");  // a pipelined request: the client is still there
  run_for(t.ioc, 50ms);
  CHECK_FALSE(kvp::testing::is_ready(gone));
  CHECK_FALSE(t.c.hung_up());
  std::string left(64, '\0');
  const auto n = t.c.stream.socket().receive(net::buffer(left), tcp::socket::message_peek);
  CHECK(left.substr(0, n) == "GET /next HTTP/1.1\r\n\r\n");  // nothing consumed

  cancel.emit(net::cancellation_type::terminal);  // the watcher waits until cancelled
  drive_until(t.ioc, [&] { return kvp::testing::is_ready(gone); });
  CHECK_FALSE(gone.get());
}

TEST_CASE("a client that hangs up is gone and abandons its request", "[proxy][client_conn]") {
  connection t;
  auto gone = kvp::testing::spawn(t.ioc.get_executor(), t.c.gone());
  run_for(t.ioc, 20ms);
  CHECK_FALSE(kvp::testing::is_ready(gone));
  t.pair.peer.close();
  drive_until(t.ioc, [&] { return kvp::testing::is_ready(gone); });
  CHECK(gone.get());
  CHECK(t.c.hung_up());
  CHECK(t.c.abandoned());
  CHECK(run_on(t.ioc, t.ioc.get_executor(), t.c.departed()));
}

TEST_CASE("a held conversation request outlives its client until a stop names it",
          "[proxy][client_conn]") {
  proxy::stream_directory dir;  // outlives the connection: its hold unholds at the end
  connection t;
  t.c.pending = proxy::stream_hold(dir, "conv-1");
  auto departed = kvp::testing::spawn(t.ioc.get_executor(), t.c.departed());
  t.pair.peer.close();
  run_for(t.ioc, 250ms);  // past two polls of the stop
  CHECK(t.c.hung_up());
  CHECK_FALSE(t.c.abandoned());  // llama-server would run it though its client left
  CHECK_FALSE(kvp::testing::is_ready(departed));

  CHECK(dir.stop_held("conv-1"));
  CHECK(t.c.abandoned());
  drive_until(t.ioc, [&] { return kvp::testing::is_ready(departed); });
  CHECK(departed.get());
}

}  // namespace client_conn_test
