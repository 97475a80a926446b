// Tests for proxy/http/relay.hpp over connected pairs of beast::test::stream (docs/conventions.md §5):
// the exact bytes the client receives for chunked SSE, Content-Length, HTTP/1.0 and broken
// upstream responses. read_size(1) on the upstream side reaches the parser's
// chunk-header-only path, where an empty body piece must not end the client's stream
// (beast#3032).
#include "proxy/http/relay.hpp"

#include <algorithm>
#include <boost/asio/write.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/http/string_body.hpp>
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/run.hpp"

namespace relay_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

namespace test = boost::beast::test;
using namespace std::chrono_literals;
using kvp::beast::flat_buffer;
using kvp::proxy::relay_options;
using kvp::proxy::relay_response;
using kvp::proxy::relay_end;
using kvp::proxy::relay_state;
using kvp::testing::run_on;

struct relayed {
  relay_state st;
  std::string wire;  // every byte the client received
  std::string head() const { return wire.substr(0, wire.find("\r\n\r\n") + 4); }
  std::string body() const {
    auto p = wire.find("\r\n\r\n");
    return p == std::string::npos ? std::string() : wire.substr(p + 4);
  }
};

struct relay_setup {
  unsigned client_version = 11;
  bool client_keep_alive = true;
  bool head_request = false;
  std::size_t upstream_read_size = 0;  // 0: unlimited
  bool upstream_closes = false;        // the upstream peer closes after sending its bytes
  bool client_gone = false;            // the client hung up before the response
  std::size_t client_fails_at = 0;     // 0: never; n: the client's n-th write fails
  bool outlives_client = false;        // relay_options::outlives_client
};

// Feeds `upstream_bytes` to the relay's upstream stream and collects what the client gets.
relayed relay(const std::string& upstream_bytes, relay_setup s = {}) {
  kvp::net::io_context ioc;
  test::stream upstream(ioc);
  test::stream upstream_peer(ioc);  // llama-server's end
  upstream.connect(upstream_peer);
  test::fail_count client_fc(s.client_fails_at ? s.client_fails_at : SIZE_MAX);
  test::stream client(ioc, client_fc);
  test::stream client_peer(ioc);  // the harness's end
  client.connect(client_peer);
  if (s.upstream_read_size) upstream.read_size(s.upstream_read_size);
  upstream.append(upstream_bytes);
  if (s.upstream_closes) upstream_peer.close();
  if (s.client_gone) client.close();  // writes now fail with connection_reset

  flat_buffer ubuf;
  relayed out;
  run_on(ioc, ioc.get_executor(),
         relay_response(upstream, ubuf, client, s.client_version, s.client_keep_alive,
                        s.head_request, relay_options{.outlives_client = s.outlives_client}, out.st));
  out.wire = std::string(client_peer.str());
  return out;
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has_header(const std::string& head, const std::string& name) {
  return lower(head).find("\r\n" + lower(name) + ":") != std::string::npos;
}

// A chunked body taken apart: the size of every chunk in order, the data, and whether the
// last-chunk and final CRLF arrived.
struct chunks {
  std::vector<std::size_t> sizes;
  std::string data;
  bool terminated = false;
  bool well_formed = true;
  std::string after;  // bytes after the terminator
};

chunks decode_chunked(std::string_view s) {
  chunks out;
  while (!s.empty()) {
    const auto eol = s.find("\r\n");
    if (eol == std::string_view::npos || eol == 0) {
      out.well_formed = eol != 0;
      break;
    }
    std::size_t size = 0;
    for (char c : s.substr(0, eol)) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) {
        out.well_formed = false;
        return out;
      }
      size = size * 16 + static_cast<std::size_t>(std::isdigit(static_cast<unsigned char>(c))
                                                      ? c - '0'
                                                      : std::tolower(c) - 'a' + 10);
    }
    s.remove_prefix(eol + 2);
    out.sizes.push_back(size);
    if (size == 0) {
      if (s.substr(0, 2) == "\r\n") {
        out.terminated = true;
        s.remove_prefix(2);
      }
      break;
    }
    if (s.size() < size + 2) {  // cut off mid-chunk
      out.data += s.substr(0, std::min(size, s.size()));
      s = {};
      break;
    }
    out.data += s.substr(0, size);
    if (s.substr(size, 2) != "\r\n") {
      out.well_formed = false;
      return out;
    }
    s.remove_prefix(size + 2);
  }
  out.after = std::string(s);
  return out;
}

// Parses the client's bytes as a complete HTTP response with Beast itself.
kvp::http::response<kvp::http::string_body> parse_response(const std::string& wire) {
  kvp::net::io_context ioc;
  test::stream in(ioc, wire);
  flat_buffer buf;
  kvp::http::response_parser<kvp::http::string_body> p;
  p.eager(true);
  kvp::beast::error_code ec;
  kvp::http::read(in, buf, p, ec);
  INFO(wire);
  REQUIRE_FALSE(ec);
  REQUIRE(p.is_done());
  CHECK(buf.size() == 0);  // nothing after the end of the message
  return p.release();
}

const std::string sse_events[] = {
    "data: "
    "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: "
    "{\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: "
    "{\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"object\":\"chat.completion.chunk\"}\n\n",
    "data: [DONE]\n\n",
};

std::string sse_body() {
  std::string b;
  for (const auto& e : sse_events) b += e;
  return b;
}

const std::string sse_head =
    "HTTP/1.1 200 OK\r\n"
    "Keep-Alive: timeout=5, max=100\r\n"
    "Content-Type: text/event-stream\r\n"
    "Server: llama.cpp\r\n"
    "Transfer-Encoding: chunked\r\n"
    "\r\n";

std::string sse_upstream() {
  std::string s = sse_head;
  for (const auto& e : sse_events) s += chunk(e);
  return s + "0\r\n\r\n";
}

}  // namespace

TEST_CASE("a chunked SSE stream reaches the client byte for byte, terminated once",
          "[proxy][relay]") {
  relay_setup s;
  SECTION("upstream read one byte at a time") { s.upstream_read_size = 1; }
  SECTION("upstream read in one piece") { s.upstream_read_size = 0; }
  SECTION("upstream read 7 bytes at a time") { s.upstream_read_size = 7; }
  auto r = relay(sse_upstream(), s);
  INFO(r.wire);

  CHECK(r.st.header_received);
  CHECK(r.st.header_sent);
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.st.upstream_reusable);
  CHECK(r.st.status == 200);
  CHECK(r.st.body_bytes == sse_body().size());

  const auto head = r.head();
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(head.find("\r\nContent-Type: text/event-stream\r\n") != std::string::npos);
  CHECK(head.find("\r\nServer: llama.cpp\r\n") != std::string::npos);
  CHECK(head.find("\r\nTransfer-Encoding: chunked\r\n") != std::string::npos);
  CHECK_FALSE(has_header(head, "Keep-Alive"));
  CHECK_FALSE(has_header(head, "Connection"));
  CHECK_FALSE(has_header(head, "Content-Length"));

  const auto c = decode_chunked(r.body());
  CHECK(c.well_formed);
  CHECK(c.terminated);
  CHECK(c.after.empty());
  CHECK(c.data == sse_body());
  REQUIRE_FALSE(c.sizes.empty());
  // beast#3032: no zero-size chunk before the real end.
  CHECK(std::count(c.sizes.begin(), c.sizes.end(), std::size_t{0}) == 1);
  CHECK(c.sizes.back() == 0);

  const auto res = parse_response(r.wire);
  CHECK(res.body() == sse_body());
}

TEST_CASE("a Content-Length response keeps its length and its bytes", "[proxy][relay]") {
  // Small bodies are read whole and sent with the header; one larger than the relay's
  // buffer (64 KiB) is streamed in pieces.
  const std::string small =
      R"({"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}})";
  std::string large;
  for (int i = 0; large.size() < 150'000; ++i) large += std::to_string(i) + ",";
  const bool big = GENERATE(false, true);
  CAPTURE(big);
  const std::string& body = big ? large : small;
  const std::string upstream =
      "HTTP/1.1 400 Bad Request\r\n"
      "Content-Type: application/json; charset=utf-8\r\n"
      "Content-Length: " +
      std::to_string(body.size()) +
      "\r\n"
      "\r\n" +
      body;
  relay_setup s;
  SECTION("in small pieces") { s.upstream_read_size = big ? 1000 : 1; }
  SECTION("in one piece") {}
  auto r = relay(upstream, s);
  INFO(r.wire);
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.st.status == 400);
  CHECK(r.st.body_bytes == body.size());
  CHECK(r.head().rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  CHECK(r.head().find("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n") !=
        std::string::npos);
  CHECK_FALSE(has_header(r.head(), "Transfer-Encoding"));
  CHECK(r.body() == body);
}

TEST_CASE("hop-by-hop headers are not forwarded", "[proxy][relay]") {
  const std::string upstream =
      "HTTP/1.1 200 OK\r\n"
      "Connection: keep-alive, X-Hop\r\n"
      "X-Hop: secret\r\n"
      "Keep-Alive: timeout=5, max=100\r\n"
      "Proxy-Connection: keep-alive\r\n"
      "TE: trailers\r\n"
      "Trailer: X-Checksum\r\n"
      "Upgrade: h2c\r\n"
      "Proxy-Authenticate: Basic realm=\"llama\"\r\n"
      "X-Request-Id: req-42\r\n"
      "Content-Length: 2\r\n"
      "\r\nok";
  relay_setup s;
  bool keep = true;
  SECTION("client keeps the connection") { keep = true; }
  SECTION("client closes the connection") { keep = false; }
  s.client_keep_alive = keep;
  auto r = relay(upstream, s);
  const auto head = r.head();
  INFO(head);
  CHECK(r.st.end == relay_end::delivered);
  for (const char* h : {"X-Hop", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade",
                        "Proxy-Authenticate"}) {
    CAPTURE(h);
    CHECK_FALSE(has_header(head, h));
  }
  CHECK(head.find("\r\nX-Request-Id: req-42\r\n") != std::string::npos);
  CHECK(head.find("\r\nContent-Length: 2\r\n") != std::string::npos);
  if (keep) {
    CHECK_FALSE(has_header(head, "Connection"));
  } else {
    CHECK(head.find("\r\nConnection: close\r\n") != std::string::npos);
  }
  CHECK(r.body() == "ok");
}

TEST_CASE("an HTTP/1.0 client gets the stream unchunked and the connection closes",
          "[proxy][relay]") {
  relay_setup s;
  s.client_version = 10;
  s.client_keep_alive = true;  // asked for keep-alive; a close-delimited body cannot have it
  s.upstream_read_size = 1;
  auto r = relay(sse_upstream(), s);
  const auto head = r.head();
  INFO(r.wire);
  CHECK(r.st.end == relay_end::delivered);
  CHECK(head.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  CHECK_FALSE(has_header(head, "Transfer-Encoding"));
  CHECK_FALSE(has_header(head, "Content-Length"));
  CHECK(lower(head).find("keep-alive") == std::string::npos);
  CHECK(r.body() == sse_body());  // raw, no chunk framing

  // What the client's parser concludes from the header: the body ends at the close.
  kvp::net::io_context ioc;
  test::stream in(ioc, head);
  flat_buffer buf;
  kvp::http::response_parser<kvp::http::empty_body> p;
  kvp::beast::error_code ec;
  kvp::http::read_header(in, buf, p, ec);
  REQUIRE_FALSE(ec);
  CHECK_FALSE(p.get().keep_alive());
  CHECK_FALSE(p.chunked());
  CHECK_FALSE(p.content_length().has_value());
}

TEST_CASE("an HTTP/1.0 client keeps keep-alive when the length is known", "[proxy][relay]") {
  relay_setup s;
  s.client_version = 10;
  s.client_keep_alive = true;
  auto r = relay("HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}", s);
  INFO(r.wire);
  CHECK(r.head().rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  CHECK(r.head().find("\r\nContent-Length: 15\r\n") != std::string::npos);
  CHECK(lower(r.head()).find("\r\nconnection: keep-alive\r\n") != std::string::npos);
  CHECK(r.body() == "{\"status\":\"ok\"}");
}

TEST_CASE("a close-delimited upstream body is re-framed as chunks for HTTP/1.1", "[proxy][relay]") {
  relay_setup s;
  s.upstream_closes = true;
  s.upstream_read_size = 5;
  auto r = relay(
      "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\n"
      "streamed until the connection closes",
      s);
  INFO(r.wire);
  CHECK(r.st.end == relay_end::delivered);
  CHECK_FALSE(r.st.upstream_reusable);
  CHECK(r.head().find("\r\nTransfer-Encoding: chunked\r\n") != std::string::npos);
  const auto c = decode_chunked(r.body());
  CHECK(c.terminated);
  CHECK(c.data == "streamed until the connection closes");
  CHECK(std::count(c.sizes.begin(), c.sizes.end(), std::size_t{0}) == 1);
}

TEST_CASE("upstream EOF mid-body: no clean end for the client (docs/design.md §17)", "[proxy][relay]") {
  relay_setup s;
  s.upstream_closes = true;

  SECTION("chunked SSE cut inside a chunk") {
    for (std::size_t read_size : {std::size_t{1}, std::size_t{0}}) {
      CAPTURE(read_size);
      s.upstream_read_size = read_size;
      const std::string partial =
          sse_head + chunk(sse_events[0]) + chunk(sse_events[1]).substr(0, 10);
      auto r = relay(partial, s);
      INFO(r.wire);
      CHECK(r.st.header_sent);
      CHECK(r.st.end == relay_end::upstream_broke);
      CHECK_FALSE(r.st.upstream_reusable);
      const auto c = decode_chunked(r.body());
      CHECK(c.well_formed);
      CHECK_FALSE(c.terminated);
      CHECK(std::count(c.sizes.begin(), c.sizes.end(), std::size_t{0}) == 0);
      // Everything that did arrive was passed on.
      const auto payload_in_cut = chunk(sse_events[1]).substr(0, 10);
      const auto got = payload_in_cut.substr(payload_in_cut.find("\r\n") + 2);
      CHECK(c.data == sse_events[0] + got);
      CHECK(r.st.body_bytes == c.data.size());
    }
  }

  SECTION("chunked SSE cut between chunks, after an error event") {
    const std::string partial =
        sse_head + chunk(sse_events[0]) +
        chunk("data: {\"error\":{\"code\":500,\"message\":\"failed to decode\"}}\n\n");
    auto r = relay(partial, s);
    INFO(r.wire);
    CHECK(r.st.end == relay_end::upstream_broke);
    const auto c = decode_chunked(r.body());
    CHECK_FALSE(c.terminated);
    CHECK(c.data.find("failed to decode") != std::string::npos);
  }

  SECTION("Content-Length cut short, body larger than the relay buffer: streamed, then cut") {
    auto r = relay("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n0123456789", s);
    CHECK(r.st.end == relay_end::upstream_broke);
    CHECK(r.st.header_sent);
    CHECK(r.head().find("\r\nContent-Length: 100000\r\n") != std::string::npos);
    CHECK(r.body() == "0123456789");
  }

  SECTION("Content-Length cut short, small body: read whole first, so the client saw nothing") {
    // The caller can still answer 502 instead of a truncated body.
    auto r = relay("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", s);
    CHECK(r.st.end == relay_end::upstream_broke);
    CHECK(r.st.header_received);
    CHECK_FALSE(r.st.header_sent);
    CHECK(r.wire.empty());
  }

  SECTION("no header at all") {
    auto r = relay("HTTP/1.1 200 OK\r\nContent-Ty", s);
    CHECK(r.st.end == relay_end::upstream_broke);
    CHECK_FALSE(r.st.header_received);
    CHECK_FALSE(r.st.header_sent);
    CHECK(r.wire.empty());
  }
}

// RFC 9110 §15.2. Before, a 1xx was relayed as the final response and the connection went
// back to the pool with the real answer still unread, for the next client to receive.
TEST_CASE("1xx interim responses are read past, dropped, and the connection not pooled",
          "[proxy][relay]") {
  const std::string final_response =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"
      "{\"id\":\"A\"}";
  const std::string interim = GENERATE(
      std::string("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"),
      std::string("HTTP/1.1 100 Continue\r\n\r\n"),
      std::string("HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"));
  CAPTURE(interim);
  relay_setup s;
  SECTION("in small pieces") { s.upstream_read_size = 1; }
  SECTION("in one piece") {}
  auto r = relay(interim + final_response, s);
  INFO(r.wire);
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.st.status == 200);
  CHECK(r.wire.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.wire.find("HTTP/1.1 1") == std::string::npos);
  CHECK(r.body() == "{\"id\":\"A\"}");
  CHECK_FALSE(r.st.upstream_reusable);
}

// cpp-httplib's answer to a request it could not parse: it keeps reading that connection, so
// kvpersist must never send another request on it.
TEST_CASE("a 400 with Connection: close is relayed and its connection not pooled",
          "[proxy][relay]") {
  auto r = relay(
      "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.st.status == 400);
  CHECK_FALSE(r.st.upstream_reusable);
}

TEST_CASE("a response without 1xx before it may still be pooled", "[proxy][relay]") {
  auto r = relay("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.st.upstream_reusable);
}

TEST_CASE("101 or an endless 1xx sequence fails the exchange, nothing relayed",
          "[proxy][relay]") {
  std::string upstream;
  SECTION("101 Switching Protocols") {
    upstream = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
               "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
  }
  SECTION("too many 1xx") {
    for (int i = 0; i < 20; ++i) upstream += "HTTP/1.1 103 Early Hints\r\n\r\n";
    upstream += "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
  }
  auto r = relay(upstream);
  INFO(r.wire);
  CHECK(r.st.end == relay_end::upstream_broke);
  CHECK(r.st.header_received);  // the request reached upstream: never retried
  CHECK_FALSE(r.st.header_sent);
  CHECK_FALSE(r.st.upstream_reusable);
  CHECK(r.wire.empty());
}

TEST_CASE("a client that hung up is reported, not retried", "[proxy][relay]") {
  relay_setup s;
  s.client_gone = true;
  auto r = relay(sse_upstream(), s);
  CHECK(r.st.header_received);
  CHECK(r.st.end == relay_end::client_gone);
  CHECK_FALSE(r.st.header_sent);
}

// A resumable stream (X-Conversation-Id): llama-server keeps generating after the client
// left, so the relay reads the response to its end and the slot's lease lasts as long.
TEST_CASE("a generation that outlives its client is read to its end, wherever the client left",
          "[proxy][relay]") {
  const std::string upstream = sse_upstream();
  for (std::size_t n = 1; n <= 6; ++n) {
    relay_setup s;
    s.client_fails_at = n;
    s.upstream_read_size = 7;  // many reads: the client fails mid-body
    s.outlives_client = true;
    auto r = relay(upstream, s);
    if (r.st.end != relay_end::client_gone) break;
    CHECK(r.st.upstream_done);
    CHECK(r.st.upstream_reusable);
  }
  relay_setup gone;
  gone.client_gone = true;
  gone.outlives_client = true;
  auto r = relay(upstream, gone);
  CHECK(r.st.end == relay_end::client_gone);
  CHECK(r.st.upstream_done);
  // without it the relay stops reading at the first failed write
  gone.outlives_client = false;
  CHECK_FALSE(relay(upstream, gone).st.upstream_done);
}

// A client that leaves while the last bytes go out (it read `data: [DONE]` and closed) must
// not hide that upstream finished: the turn-end checkpoint and the timings depend on it.
TEST_CASE("upstream_done and upstream reuse survive a client write that fails late", "[proxy][relay]") {
  const std::string upstream = sse_upstream();
  bool failed_after_upstream_end = false;
  for (std::size_t n = 1; n <= 40; ++n) {
    relay_setup s;
    s.client_fails_at = n;
    auto r = relay(upstream, s);
    if (r.st.end != relay_end::client_gone) {
      CHECK(r.st.end == relay_end::delivered);
      break;
    }
    // The upstream connection is clean once its response was read whole: it may be pooled.
    CHECK(r.st.upstream_reusable == r.st.upstream_done);
    if (r.st.upstream_done) failed_after_upstream_end = true;
  }
  CHECK(failed_after_upstream_end);
  CHECK(relay(upstream).st.upstream_done);
}

TEST_CASE("a HEAD response carries headers only", "[proxy][relay]") {
  relay_setup s;
  s.head_request = true;
  auto r =
      relay("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n", s);
  INFO(r.wire);
  CHECK(r.st.end == relay_end::delivered);
  CHECK(r.head().find("\r\nContent-Length: 15\r\n") != std::string::npos);
  CHECK(r.body().empty());
}

// docs/design.md §17: the relay must not buffer. Each event is forwarded while the upstream is still
// silent about the next one (with eager parsing, Beast 1.81 held whole events back).
TEST_CASE("every SSE event reaches the client before upstream sends the next", "[proxy][relay]") {
  std::size_t read_size = 0;
  SECTION("any read size") { read_size = 0; }
  SECTION("one byte at a time") { read_size = 1; }

  kvp::net::io_context ioc;
  test::stream upstream(ioc);
  test::stream upstream_peer(ioc);
  upstream.connect(upstream_peer);
  test::stream client(ioc);
  test::stream client_peer(ioc);
  client.connect(client_peer);
  if (read_size) upstream.read_size(read_size);

  flat_buffer ubuf;
  relay_state st;
  auto done = kvp::testing::spawn(
      ioc.get_executor(),
      relay_response(upstream, ubuf, client, 11, true, false, relay_options{}, st));
  auto client_body = [&] {
    const std::string wire(client_peer.str());
    const auto p = wire.find("\r\n\r\n");
    return p == std::string::npos ? chunks{} : decode_chunked(wire.substr(p + 4));
  };

  std::string expected;
  for (std::size_t i = 0; i < std::size(sse_events); ++i) {
    const std::string piece = (i == 0 ? sse_head : std::string()) + chunk(sse_events[i]);
    kvp::net::write(upstream_peer, kvp::net::buffer(piece));
    expected += sse_events[i];
    CAPTURE(i);
    kvp::testing::drive_until(
        ioc, [&] { return client_body().data == expected; }, 2s);
    CHECK_FALSE(client_body().terminated);
    CHECK_FALSE(kvp::testing::is_ready(done));
  }
  kvp::net::write(upstream_peer, kvp::net::buffer(std::string("0\r\n\r\n")));
  kvp::testing::drive_until(
      ioc, [&] { return kvp::testing::is_ready(done); }, 2s);
  done.get();
  CHECK(st.end == relay_end::delivered);
  const auto c = client_body();
  CHECK(c.terminated);
  CHECK(c.data == sse_body());
  CHECK(std::count(c.sizes.begin(), c.sizes.end(), std::size_t{0}) == 1);
}

TEST_CASE("the kept body is its first KiB and its last 8-16 KiB", "[relay][tail]") {
  using kvp::proxy::detail::kept_head_bytes;
  REQUIRE(kept_head_bytes == 1024);  // a Messages stream's message_start fits
  std::string kept;
  std::string body;
  for (int i = 0; i < 4000; ++i) {  // 32000 bytes, no 8-byte run repeated
    char digits[16];
    std::snprintf(digits, sizeof digits, "%08d", i);
    body += digits;
  }
  for (std::size_t at = 0; at < body.size(); at += 1000)
    kvp::proxy::detail::keep_tail(&kept, body.data() + at, std::min<std::size_t>(1000, body.size() - at));
  REQUIRE(kept.size() >= 8 * 1024 + kept_head_bytes);
  REQUIRE(kept.size() <= 16 * 1024);
  CHECK(kept.substr(0, kept_head_bytes) == body.substr(0, kept_head_bytes));
  const auto tail_len = kept.size() - kept_head_bytes;
  CHECK(kept.substr(kept_head_bytes) == body.substr(body.size() - tail_len));
}

}  // namespace relay_test
