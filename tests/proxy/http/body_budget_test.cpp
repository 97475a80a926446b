// Tests for proxy/http/body_budget.hpp: a Content-Length is reserved whole, a chunked body chunk
// by chunk (the chunk that crosses the budget fails the parse before its data is taken), and
// every hold returns its bytes.
#include "proxy/http/body_budget.hpp"

#include <catch2/catch.hpp>

#include <optional>
#include <string>

namespace body_budget_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::proxy::body_budget;
namespace http = kvp::http;
namespace net = kvp::net;

// Feeds `bytes` to `p` until it stops consuming; returns the first error.
kvp::beast::error_code feed(http::request_parser<http::string_body>& p, std::string bytes) {
  kvp::beast::error_code ec;
  while (!bytes.empty() && !ec && !p.is_done()) {
    const auto n = p.put(net::buffer(bytes), ec);
    if (n == 0 && !ec) break;
    bytes.erase(0, n);
  }
  return ec;
}

}  // namespace

TEST_CASE("a Content-Length body is reserved whole and returned", "[proxy][body_budget]") {
  body_budget budget(1000);
  {
    http::request_parser<http::string_body> p;
    CHECK_FALSE(feed(p, "POST / HTTP/1.1\r\nContent-Length: 600\r\n\r\n"));
    body_budget::hold h(budget);
    CHECK(h.admit(p));
    CHECK(budget.in_use() == 600);
    http::request_parser<http::string_body> p2;
    CHECK_FALSE(feed(p2, "POST / HTTP/1.1\r\nContent-Length: 401\r\n\r\n"));
    body_budget::hold h2(budget);
    CHECK_FALSE(h2.admit(p2));
    CHECK(h2.exceeded());
    CHECK(budget.in_use() == 600);
  }
  CHECK(budget.in_use() == 0);
}

TEST_CASE("a chunked body is refused at the chunk that crosses", "[proxy][body_budget]") {
  body_budget budget(100);
  body_budget::hold other(budget);
  http::request_parser<http::string_body> first;
  CHECK_FALSE(feed(first, "POST / HTTP/1.1\r\nContent-Length: 30\r\n\r\n"));
  REQUIRE(other.admit(first));
  {
    http::request_parser<http::string_body> p;
    CHECK_FALSE(feed(p, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"));
    body_budget::hold h(budget);
    REQUIRE(h.admit(p));
    // 40 fit (70 of 100 in use); 31 more would make 101: refused at that chunk's header,
    // before its data is taken
    CHECK(feed(p, "28\r\n" + std::string(40, 'a') + "\r\n1f\r\n" + std::string(31, 'b')) ==
          net::error::no_buffer_space);
    CHECK(budget.in_use() == 70);
    CHECK(h.exceeded());
    CHECK(p.get().body().size() == 40);
  }
  CHECK(budget.in_use() == 30);
}

}  // namespace body_budget_test
