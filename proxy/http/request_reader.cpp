#include "proxy/http/request_reader.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "proxy/http/relay.hpp"

namespace kvp::proxy {

namespace {

response refusal(core::errc code, std::string message) {
  return error_answer(core::error{code, 0, std::move(message)}, 11, false);
}

bool routed_by_llama_server(http::verb v) {
  switch (v) {
    case http::verb::get:
    case http::verb::head:
    case http::verb::post:
    case http::verb::put:
    case http::verb::delete_:
    case http::verb::options:
    case http::verb::patch:
      return true;
    default:
      return false;
  }
}

// Whether server::prepare_upstream_request keeps field `f` of a request whose Connection field
// is `connection`.
bool forwarded(const http::fields::value_type& f, std::string_view connection,
               const std::vector<std::string>& dropped) {
  if (f.name() == http::field::expect ||
      std::find(std::begin(hop_by_hop_fields), std::end(hop_by_hop_fields), f.name()) !=
          std::end(hop_by_hop_fields))
    return false;
  const auto named = [&](std::string_view n) { return beast::iequals(n, f.name_string()); };
  if (std::any_of(dropped.begin(), dropped.end(), named)) return false;
  for (auto tok : http::token_list{connection})
    if (named(tok)) return false;
  return true;
}

}  // namespace

std::optional<response> refuse_unforwardable(const http::request_header<>& h,
                                             const std::vector<std::string>& dropped) {
  // Beast parses methods case-sensitively, as cpp-httplib does: "get" is verb::unknown here.
  if (!routed_by_llama_server(h.method()))
    return refusal(core::errc::method_not_allowed,
                   "method not allowed (GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH)");
  // "METHOD SP target SP HTTP/1.1 CRLF". The base path of a server URL is not counted: a line it
  // pushes over the limit makes cpp-httplib close the connection, which smuggles nothing.
  if (h.method_string().size() + h.target().size() + 12 > upstream_limits::request_line)
    return refusal(core::errc::target_too_long,
                   fmt::format("request line longer than {} bytes", upstream_limits::request_line));
  const std::string_view connection = h[http::field::connection];
  std::size_t count = upstream_limits::added_fields;
  for (const auto& f : h) {
    if (!forwarded(f, connection, dropped)) continue;
    if (++count > upstream_limits::fields)
      return refusal(core::errc::header_too_large,
                     fmt::format("more than {} header fields",
                                 upstream_limits::fields - upstream_limits::added_fields));
    // Beast has already trimmed the value and joined obs-folds with a space; its name and
    // value bytes are those cpp-httplib accepts (tchar; VCHAR, obs-text, inner SP and HTAB).
    if (f.name_string().size() + f.value().size() + 4 > upstream_limits::field_line)
      return refusal(core::errc::header_too_large,
                     fmt::format("a header field line longer than {} bytes",
                                 upstream_limits::field_line));
  }
  return std::nullopt;
}

std::size_t read_buffer_limit(std::size_t header_limit) {
  // Beast reads at most 64 KiB at a time; the buffer needs no more room than that beyond a
  // whole header.
  return header_limit + 64 * 1024;
}

std::optional<response> read_error_response(const beast::error_code& ec) {
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == net::error::operation_aborted || ec == net::error::connection_reset ||
      ec == net::error::eof || ec == net::error::bad_descriptor)
    return std::nullopt;
  if (ec == http::error::header_limit)
    return refusal(core::errc::header_too_large, "request header too large");
  // A Content-Length above the limit is refused while the header is parsed, a chunked body
  // when its chunk sizes add up past it.
  if (ec == http::error::body_limit)
    return refusal(core::errc::body_too_large, "request body too large");
  if (ec == http::error::buffer_overflow)
    return refusal(core::errc::request_refused,
                   "chunk-size line, chunk extension or trailer section too long");
  return refusal(core::errc::request_refused, fmt::format("malformed request: {}", ec.message()));
}

response body_budget_exhausted(unsigned version) {
  return error_answer({core::errc::over_capacity, 0,
                       "too many request bodies are buffered (limits.maxBufferedBodyBytes)", 2},
                      version, false);
}

}  // namespace kvp::proxy
