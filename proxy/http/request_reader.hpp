// Reads client requests, for the proxy and the admin listener alike, with every buffer
// bounded, and refuses before anything is forwarded what llama-server's HTTP parser would
// read differently from Beast.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/net.hpp"
#include "proxy/http/body_budget.hpp"
#include "proxy/http/http_status.hpp"

namespace kvp::proxy {

// llama-server's HTTP server is cpp-httplib (llama.cpp's vendor/cpp-httplib/httplib.{h,cpp};
// scripts/llama-server.sh --src prints where). A request it cannot parse (a method it does not
// know, a field line over CPPHTTPLIB_HEADER_MAX_LENGTH, more than CPPHTTPLIB_HEADER_MAX_COUNT
// fields) gets a 400, but cpp-httplib stays in its keep-alive loop and parses the body kvpersist
// forwarded behind that header as the next request: a body carrying
// `POST /slots/0?action=erase` would run on the slot kvpersist owns. So kvpersist refuses,
// itself, every request cpp-httplib would reject. These limits are constants on purpose, not
// configuration: raising one would reopen that hole.
namespace upstream_limits {
inline constexpr std::size_t field_line = 8192;  // CPPHTTPLIB_HEADER_MAX_LENGTH, CRLF included
inline constexpr std::size_t fields = 100;       // CPPHTTPLIB_HEADER_MAX_COUNT
// CPPHTTPLIB_MAX_LINE_LENGTH, CRLF included. llama.cpp raises CPPHTTPLIB_REQUEST_URI_MAX_LENGTH
// to the same 32768 (its vendor/cpp-httplib/CMakeLists.txt: prompts in a query string), so the
// request line is the binding limit for the target.
inline constexpr std::size_t request_line = 32768;
// Fields kvpersist may add to what the client sent (server::prepare_upstream_request: Host
// and Content-Length); they count against `fields`.
inline constexpr std::size_t added_fields = 2;
}  // namespace upstream_limits

// The answer (405, 414 or 431, Connection: close) to a request whose header llama-server would
// reject, counted as kvpersist forwards it: without the fields in `dropped` (names kvpersist
// removes: session and purpose headers, stripHeaders), hop-by-hop fields and Expect, and with
// Beast's `name: value\r\n`. nullopt when it may be forwarded. The methods are those cpp-httplib
// routes for llama-server; TRACE, CONNECT and anything else are refused.
std::optional<response> refuse_unforwardable(const http::request_header<>& h,
                                             const std::vector<std::string>& dropped);

// The most bytes a connection's read buffer holds: a header of `header_limit` bytes, and room
// for what follows it. A chunk-size line, chunk extension or trailer section must fit in it;
// one that never ends fails the read (http::error::buffer_overflow) instead of growing the
// buffer.
std::size_t read_buffer_limit(std::size_t header_limit);

// The answer to a read that failed with `ec`; nullopt when the client left or timed out
// (nothing to answer).
std::optional<response> read_error_response(const beast::error_code& ec);

// The answer to a body that does not fit limits.maxBufferedBodyBytes (503, Retry-After). The
// connection closes: the body was not read, so the stream has no request boundary left.
response body_budget_exhausted(unsigned version);

struct read_limits {
  std::size_t header_bytes = 64 * 1024;
  std::uint64_t body_bytes = 64ull << 20;
  std::chrono::milliseconds header_timeout{30'000};  // idle keep-alive and slowloris
  std::chrono::milliseconds body_timeout{60'000};    // the whole body
  std::chrono::milliseconds write_timeout{60'000};   // a 100 Continue or an error answer
  std::vector<std::string> dropped_fields;           // see refuse_unforwardable
};

namespace detail {
template <class S>
void expire_after(S& s, std::chrono::milliseconds d) {
  if constexpr (requires { s.expires_after(d); }) s.expires_after(d);
}
}  // namespace detail

// One request from `stream`, parsed from `buf` (which carries pipelined bytes from one request
// to the next; its max_size is set here). Every failure is answered here (a status, a JSON
// body, Connection: close) and ends the connection. A template for tests/fuzz, which reads
// from a beast::test::stream; the proxy and the admin listener use request_reader.
template <class Stream>
class basic_request_reader {
 public:
  basic_request_reader(Stream& stream, beast::flat_buffer& buf, const read_limits& limits)
      : stream_(stream), buf_(buf), limits_(limits) {
    parser_.header_limit(static_cast<std::uint32_t>(limits.header_bytes));
    parser_.body_limit(limits.body_bytes);
    buf_.max_size(read_buffer_limit(limits.header_bytes));
  }

  // The header, checked: false when the connection is to be closed.
  net::awaitable<bool> read_header() {
    detail::expire_after(stream_, limits_.header_timeout);
    auto [ec, n] = co_await http::async_read_header(stream_, buf_, parser_, token);
    if (ec) co_return co_await refuse(read_error_response(ec));
    const auto& h = parser_.get();
    if (auto res = refuse_unforwardable(h, limits_.dropped_fields))
      co_return co_await refuse(std::move(res));
    // RFC 9112 §6.3: a Transfer-Encoding that does not end in chunked cannot frame a request
    // body; reading on would take the body for the next request (request smuggling).
    if (h.count(http::field::transfer_encoding) > 0 && !parser_.chunked())
      co_return co_await refuse(error_answer(
          core::error{core::errc::request_refused, 0, "Transfer-Encoding must end in chunked"},
          11, false));
    co_return true;
  }

  // The body (after a 100 Continue if the client asked for one), without trailer fields:
  // false when the connection is to be closed. With `share`, the body is counted against the
  // total body budget first: a Content-Length that does not fit is refused before its bytes
  // (and before any 100 Continue), a chunked body as soon as a chunk would cross it.
  net::awaitable<bool> read_body(body_budget::hold* share = nullptr) {
    if (share && !share->admit(parser_))
      co_return co_await refuse(body_budget_exhausted(parser_.get().version()));
    if (parser_.is_done()) co_return true;
    if (beast::iequals(parser_.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> cont{http::status::continue_, parser_.get().version()};
      detail::expire_after(stream_, limits_.write_timeout);
      auto [cec, cn] = co_await http::async_write(stream_, cont, token);
      if (cec) co_return false;
    }
    // Beast's parser merges a chunked body's trailer fields into the header: a trailer
    // X-Session-Id would pick the session and a trailer Authorization would reach llama-server.
    // Like nginx, which decodes a chunked request body and discards its trailer section, kvpersist
    // forwards the header as it was before the body (the body goes upstream with a
    // Content-Length, so no trailer is forwarded either).
    std::optional<http::request_header<>> header;
    if (parser_.chunked()) header = parser_.get().base();
    detail::expire_after(stream_, limits_.body_timeout);
    auto [ec, n] = co_await http::async_read(stream_, buf_, parser_, token);
    if (ec && share && share->exceeded())
      co_return co_await refuse(body_budget_exhausted(parser_.get().version()));
    if (ec) co_return co_await refuse(read_error_response(ec));
    if (header) parser_.get().base() = std::move(*header);
    co_return true;
  }

  // The request as read so far: after read_header, its header.
  const http::request<http::string_body>& get() const { return parser_.get(); }
  http::request<http::string_body> release() { return parser_.release(); }

 private:
  // Sends `res` if there is one; always false: the connection ends.
  net::awaitable<bool> refuse(std::optional<response> res) {
    if (res) {
      detail::expire_after(stream_, limits_.write_timeout);
      co_await http::async_write(stream_, *res, token);
    }
    co_return false;
  }

  Stream& stream_;
  beast::flat_buffer& buf_;
  read_limits limits_;
  http::request_parser<http::string_body> parser_;
};

using request_reader = basic_request_reader<tcp_stream>;

}  // namespace kvp::proxy
