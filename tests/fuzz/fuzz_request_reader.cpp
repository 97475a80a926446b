// Fuzz target: client bytes through proxy/http/request_reader.hpp, the reader the proxy and the admin
// listener run, over a beast::test::stream: the header checks, the chunked body with its
// chunk-size lines, extensions and trailer section, pipelined requests.
//
// Input: byte 0: bits 0-6 the stream's read size (0: unlimited), bit 7 the client closes after
// its bytes; byte 1: how many KiB of the input's last byte follow it (a line that never ends:
// an endless chunk extension, chunk-size line or trailer); the rest: the client's bytes.
//
// Properties:
//  * the read buffer never holds more than read_buffer_limit (no growth from one endless line);
//  * an accepted header, as kvpersist forwards it (Host and Content-Length added), is one
//    cpp-httplib accepts: its method, request line, field names and values, line lengths and
//    field count (llama.cpp's vendor/cpp-httplib/httplib.cpp: stream_line_reader::getline,
//    parse_request_line, read_headers, fields::is_field_name/is_field_value);
//  * a read body leaves the header exactly as it was (trailer fields are dropped) and stays
//    within the body limit;
//  * a refused request gets exactly one final answer: 400, 405, 413, 414 or 431, with a JSON
//    error body carrying that code and Connection: close.
#include <boost/beast/_experimental/test/stream.hpp>
#include <rapidjson/document.h>

#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include "proxy/http/relay.hpp"
#include "proxy/http/request_reader.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using namespace kvp;
using test_stream = beast::test::stream;

const proxy::read_limits kLimits = [] {
  proxy::read_limits l;
  l.header_bytes = 4096;
  l.body_bytes = 16 * 1024;
  l.dropped_fields = {"X-Session-Id"};  // as the proxy drops its session headers
  return l;
}();

template <class Header>
std::string serialized(const Header& h) {
  std::ostringstream os;
  os << h;
  return os.str();
}

// cpp-httplib's fields::is_token_char.
bool is_tchar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// cpp-httplib's fields::is_field_vchar.
bool is_field_vchar(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 33 && u <= 126) || u >= 128;
}

// cpp-httplib's fields::is_field_content: vchars, inner SP and HTAB.
bool is_field_content(std::string_view v) {
  if (v.empty()) return true;
  if (!is_field_vchar(v.front()) || !is_field_vchar(v.back())) return false;
  for (char c : v.substr(1, v.size() - 1))
    if (c != ' ' && c != '\t' && !is_field_vchar(c)) return false;
  return true;
}

// What llama-server's parser checks in a request's header (its own 400s that keep reading).
void check_cpp_httplib_accepts(std::string_view wire) {
  static const std::set<std::string_view> methods = {"GET",    "HEAD",    "POST", "PUT",
                                                     "DELETE", "OPTIONS", "PATCH"};
  auto eol = wire.find("\r\n");
  const auto line = wire.substr(0, eol);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.find(' ', sp1 + 1);
  KVP_FUZZ_CHECK(sp1 != std::string_view::npos && sp2 != std::string_view::npos);
  KVP_FUZZ_CHECK(line.find(' ', sp2 + 1) == std::string_view::npos);
  KVP_FUZZ_CHECK(methods.count(line.substr(0, sp1)) == 1);
  KVP_FUZZ_CHECK(eol + 2 <= proxy::upstream_limits::request_line);
  KVP_FUZZ_CHECK(line.substr(sp2 + 1) == "HTTP/1.1");
  std::size_t count = 0;
  for (auto rest = wire.substr(eol + 2); !rest.starts_with("\r\n"); ++count) {
    eol = rest.find("\r\n");
    KVP_FUZZ_CHECK(eol != std::string_view::npos);
    KVP_FUZZ_CHECK(eol + 2 <= proxy::upstream_limits::field_line);
    const auto field = rest.substr(0, eol);
    const auto colon = field.find(':');
    KVP_FUZZ_CHECK(colon != std::string_view::npos && colon > 0);
    for (char c : field.substr(0, colon)) KVP_FUZZ_CHECK(is_tchar(c));
    auto value = field.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    KVP_FUZZ_CHECK(is_field_content(value));
    rest.remove_prefix(eol + 2);
  }
  KVP_FUZZ_CHECK(count <= proxy::upstream_limits::fields);
}

// The header as server::prepare_upstream_request sends it, at its largest: dropped and
// hop-by-hop fields gone, Host and Content-Length added.
std::string as_forwarded(http::request_header<> h) {
  for (const auto& name : kLimits.dropped_fields) h.erase(name);
  proxy::strip_hop_by_hop(h);
  h.erase(http::field::expect);
  h.set(http::field::host, "127.0.0.1:8080");
  h.set(http::field::content_length, "16384");
  h.version(11);
  return serialized(h);
}

void check_buffer(const beast::flat_buffer& buf) {
  KVP_FUZZ_CHECK(buf.max_size() == proxy::read_buffer_limit(kLimits.header_bytes));
  KVP_FUZZ_CHECK(buf.capacity() <= buf.max_size());
}

struct outcome {
  bool refused = false;
};

net::awaitable<void> read_requests(test_stream& s, outcome& out) {
  beast::flat_buffer buf;
  for (int i = 0; i < 8; ++i) {
    proxy::basic_request_reader<test_stream> reader(s, buf, kLimits);
    const bool header_ok = co_await reader.read_header();
    check_buffer(buf);
    if (!header_ok) {
      out.refused = true;
      co_return;
    }
    const std::string header = serialized(reader.get().base());
    check_cpp_httplib_accepts(as_forwarded(reader.get().base()));
    const bool body_ok = co_await reader.read_body();
    check_buffer(buf);
    if (!body_ok) {
      out.refused = true;
      co_return;
    }
    const auto req = reader.release();
    KVP_FUZZ_CHECK(serialized(req.base()) == header);
    KVP_FUZZ_CHECK(req.body().size() <= kLimits.body_bytes);
    if (!req.keep_alive()) co_return;
  }
}

// The bytes the client got after a refusal: interim 100 Continue answers, then one error.
void check_refusal(std::string_view wire) {
  beast::error_code ec;
  for (;;) {
    http::response_parser<http::string_body> p;
    p.eager(true);
    const std::size_t n = p.put(net::buffer(wire.data(), wire.size()), ec);
    KVP_FUZZ_CHECK(!ec && p.is_done());
    wire.remove_prefix(n);
    const auto& res = p.get();
    if (res.result() == http::status::continue_) continue;
    const unsigned code = res.result_int();
    KVP_FUZZ_CHECK(code == 400 || code == 405 || code == 413 || code == 414 || code == 431);
    KVP_FUZZ_CHECK(!res.keep_alive());
    rapidjson::Document d;
    d.Parse(res.body().data(), res.body().size());
    KVP_FUZZ_CHECK(!d.HasParseError() && d.IsObject() && d.HasMember("error"));
    KVP_FUZZ_CHECK(d["error"]["code"].GetUint() == code);
    KVP_FUZZ_CHECK(wire.empty());
    return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::size_t read_size = data[0] & 0x7f;
  const bool client_closes = (data[0] & 0x80) != 0;
  std::string in(reinterpret_cast<const char*>(data + 2), size - 2);
  in.append(std::size_t(data[1]) * 1024, in.back());

  net::io_context ioc;
  test_stream server_side(ioc);
  test_stream client(ioc);
  server_side.connect(client);
  if (read_size) server_side.read_size(read_size);
  server_side.append(in);
  if (client_closes) client.close();
  outcome out;
  net::co_spawn(ioc, read_requests(server_side, out), [](std::exception_ptr e) {
    if (e) KVP_FUZZ_CHECK(!"the reader threw");
  });
  // Until the reader is done or waits for bytes the client never sends.
  while (ioc.poll() > 0) {
  }
  if (out.refused && !client_closes) check_refusal(client.str());
  return 0;
}
