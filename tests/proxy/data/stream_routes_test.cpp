// Tests for proxy/data/stream_routes.hpp (docs/design.md §21): conversation ids namespaced per
// credential and remembered with their server; replays, stops and lookups namespaced the
// same way and sent to that server, or answered while kvpersist holds the stream. The
// client's side is a recording stream_route_io; a lookup's llama-server is a one-request
// listener on 127.0.0.1.
#include "proxy/data/stream_routes.hpp"

#include <catch2/catch.hpp>

#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "core/prefix_chain.hpp"
#include "tests/support/run.hpp"
#include "tests/support/temp_dir.hpp"

namespace stream_routes_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using request = http::request<http::string_body>;

// What the routes asked of the client's connection.
struct recorded_io {
  std::vector<proxy::response> answers;
  struct forwarded {
    std::string server;
    std::string target;
  };
  std::vector<forwarded> forwards;
};

net::awaitable<bool> record_answer(recorded_io* rec, proxy::response res) {
  rec->answers.push_back(std::move(res));
  co_return true;
}

net::awaitable<bool> record_forward(recorded_io* rec, proxy::upstream_entry* up,
                                    std::string target) {
  rec->forwards.push_back({up->cfg.name, std::move(target)});
  co_return true;
}

proxy::stream_route_io io_of(recorded_io& rec) {
  return {
      .answer = [&rec](proxy::response res) { return record_answer(&rec, std::move(res)); },
      .forward = [&rec](proxy::upstream_entry& up, request& req) {
        return record_forward(&rec, &up, std::string(req.target()));
      },
  };
}

// Servers "a" (the default route) and "b" (for X-Tenant: b) at `b_port`.
config::config two_servers(const std::string& state_dir, std::uint16_t b_port) {
  config::config cfg;
  cfg.state_dir = state_dir;
  config::server_config a, b;
  a.name = "a";
  a.upstream.url = "http://127.0.0.1:8080";
  b.name = "b";
  b.upstream.url = "http://127.0.0.1:" + std::to_string(b_port);
  cfg.servers = {a, b};
  config::route_config tenant;
  tenant.header = "X-Tenant";
  tenant.header_value = "b";
  tenant.server = "b";
  cfg.routes = {tenant};
  return cfg;
}

request chat_with_conversation(std::string_view credential, std::string_view conversation) {
  request req{http::verb::post, "/v1/chat/completions", 11};
  req.set(http::field::authorization, credential);
  req.insert(core::conversation_header, conversation);
  req.body() = R"({"messages":[{"role":"user","content":"hi"}]})";
  req.prepare_payload();
  return req;
}

request stream_request(http::verb method, std::string target, std::string_view credential) {
  request req{method, target, 11};
  req.set(http::field::authorization, credential);
  return req;
}

std::string upstream_id(std::string_view credential, std::string_view conversation) {
  return core::upstream_conversation_id(core::credential_key(credential), conversation);
}

struct routes_fixture {
  kvp::testing::temp_dir dir;
  net::io_context ioc;
  acceptor server_b{ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)};
  proxy::upstream_table table{ioc, two_servers(dir.path(), server_b.local_endpoint().port())};
  proxy::stream_routes routes{table};
  recorded_io rec;

  bool forward(core::stream_route kind, request req) {
    return kvp::testing::run_on(ioc, ioc.get_executor(), routes.forward(kind, req, io_of(rec)));
  }
};

TEST_CASE("a conversation id is namespaced for its credential and held until forwarded",
          "[proxy][stream_routes]") {
  routes_fixture f;
  auto& a = *f.table.server_named("a");

  request plain{http::verb::post, "/v1/chat/completions", 11};
  CHECK_FALSE(f.routes.hold_conversation(a, plain).active());
  CHECK(plain.find(core::conversation_header) == plain.end());

  auto one = chat_with_conversation("Bearer k1", "c1");
  one.insert(core::conversation_header, "c1-again");  // llama-server would read only one
  auto hold = f.routes.hold_conversation(a, one);
  CHECK(hold.active());
  CHECK_FALSE(hold.stopped());
  CHECK(one.count(core::conversation_header) == 1);
  CHECK(one[core::conversation_header] == upstream_id("Bearer k1", "c1"));
  CHECK(one[core::conversation_header] == upstream_id("k1", "c1"));  // one key, one namespace

  auto other = chat_with_conversation("Bearer k2", "c1");
  auto other_hold = f.routes.hold_conversation(a, other);
  CHECK(other[core::conversation_header] != one[core::conversation_header]);
}

TEST_CASE("a replay or stop of a held stream is answered by kvpersist", "[proxy][stream_routes]") {
  routes_fixture f;
  auto req = chat_with_conversation("Bearer k1", "c1");
  auto hold = f.routes.hold_conversation(*f.table.server_named("b"), req);

  CHECK(f.forward(core::stream_route::replay,
                  stream_request(http::verb::get, "/v1/stream?conv_id=c1", "Bearer k1")));
  REQUIRE(f.rec.answers.size() == 1);
  CHECK(f.rec.answers[0].result() == http::status::service_unavailable);
  CHECK(f.rec.answers[0][http::field::retry_after] == "1");
  CHECK(f.rec.forwards.empty());
  CHECK_FALSE(hold.stopped());

  // Another credential's stop names another stream: it goes to llama-server (route()).
  CHECK(f.forward(core::stream_route::stop,
                  stream_request(http::verb::delete_, "/v1/stream?conv_id=c1", "Bearer k2")));
  REQUIRE(f.rec.forwards.size() == 1);
  CHECK(f.rec.forwards[0].server == "a");
  CHECK_FALSE(hold.stopped());

  CHECK(f.forward(core::stream_route::stop,
                  stream_request(http::verb::delete_, "/v1/stream?conv_id=c1", "Bearer k1")));
  REQUIRE(f.rec.answers.size() == 2);
  CHECK(f.rec.answers[1].result() == http::status::no_content);
  CHECK(f.rec.forwards.size() == 1);
  CHECK(hold.stopped());
}

TEST_CASE("stream routes reach the server that ran the stream, namespaced",
          "[proxy][stream_routes]") {
  routes_fixture f;
  auto req = chat_with_conversation("Bearer k1", "c1");
  f.routes.hold_conversation(*f.table.server_named("b"), req).end();  // forwarded to "b"

  const std::string ns = upstream_id("Bearer k1", "c1");
  f.forward(core::stream_route::replay,
            stream_request(http::verb::get, "/v1/stream?conv_id=c1&from=3", "Bearer k1"));
  f.forward(core::stream_route::stop,
            stream_request(http::verb::delete_, "/v1/stream?conv_id=c1", "Bearer k1"));
  REQUIRE(f.rec.forwards.size() == 2);
  CHECK(f.rec.forwards[0].server == "b");  // though route() picks "a"
  CHECK(f.rec.forwards[0].target == "/v1/stream?conv_id=" + ns + "&from=3");
  CHECK(f.rec.forwards[1].server == "b");
  CHECK(f.rec.forwards[1].target == "/v1/stream?conv_id=" + ns);
  CHECK(f.rec.answers.empty());

  // An id kvpersist never saw (or another credential's): the routes decide.
  f.forward(core::stream_route::replay,
            stream_request(http::verb::get, "/v1/stream?conv_id=c1", "Bearer k2"));
  auto tenant_b = stream_request(http::verb::get, "/v1/stream?conv_id=c9", "Bearer k1");
  tenant_b.set("X-Tenant", "b");
  f.forward(core::stream_route::replay, tenant_b);
  REQUIRE(f.rec.forwards.size() == 4);
  CHECK(f.rec.forwards[2].server == "a");
  CHECK(f.rec.forwards[2].target == "/v1/stream?conv_id=" + upstream_id("Bearer k2", "c1"));
  CHECK(f.rec.forwards[3].server == "b");
}

TEST_CASE("a lookup body of another shape is refused", "[proxy][stream_routes]") {
  routes_fixture f;
  auto req = stream_request(http::verb::post, "/v1/streams/lookup", "Bearer k1");
  req.body() = R"({"conversation_ids":"c1"})";
  req.prepare_payload();
  CHECK(f.forward(core::stream_route::lookup, req));
  REQUIRE(f.rec.answers.size() == 1);
  CHECK(f.rec.answers[0].result() == http::status::bad_request);
  CHECK(f.rec.forwards.empty());
}

// Accepts one connection, answers its one request with `reply`; returns the request.
net::awaitable<request> answer_once(acceptor& acc, std::string reply) {
  auto [aec, sock] = co_await acc.async_accept();
  beast::flat_buffer buf;
  request got;
  co_await http::async_read(sock, buf, got, token);
  http::response<http::string_body> res{http::status::ok, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(reply);
  res.prepare_payload();
  co_await http::async_write(sock, res, token);
  co_return got;
}

TEST_CASE("a lookup asks the stream's server with namespaced ids and answers with the client's",
          "[proxy][stream_routes]") {
  routes_fixture f;
  auto req = chat_with_conversation("Bearer k1", "c1");
  f.routes.hold_conversation(*f.table.server_named("b"), req).end();

  const std::string ns = upstream_id("Bearer k1", "c1");
  auto upstream = kvp::testing::spawn(
      f.ioc.get_executor(),
      answer_once(f.server_b, R"([{"conversation_id":")" + ns + R"(","is_done":false},)"
                        R"({"conversation_id":"kvp-someone-else","is_done":true}])"));
  auto lookup = stream_request(http::verb::post, "/v1/streams/lookup", "Bearer k1");
  lookup.body() = R"({"conversation_ids":["c1"]})";
  lookup.set("X-Session-Id", "s");  // kvpersist's own header: not sent upstream
  lookup.prepare_payload();
  CHECK(f.forward(core::stream_route::lookup, lookup));
  kvp::testing::drive_until(f.ioc, [&] { return kvp::testing::is_ready(upstream); });
  const auto asked = upstream.get();

  CHECK(asked.target() == "/v1/streams/lookup");
  CHECK(asked.body() == R"({"conversation_ids":[")" + ns + R"("]})");
  CHECK(asked.find("X-Session-Id") == asked.end());
  CHECK(f.rec.forwards.empty());  // read whole, not relayed
  REQUIRE(f.rec.answers.size() == 1);
  CHECK(f.rec.answers[0].result() == http::status::ok);
  CHECK(f.rec.answers[0].body() == R"([{"conversation_id":"c1","is_done":false}])");
}

}  // namespace

}  // namespace stream_routes_test
