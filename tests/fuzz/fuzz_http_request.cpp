// Fuzz target: raw client bytes through the request path kvpersist runs before forwarding:
// Beast's request_parser with kvpersist's limits, classify, session extraction and the
// upstream rewrite (proxy/data/request_identity_reader.cpp: request_identity_reader::identity_of,
// and proxy/data/upstream_table.cpp: upstream_table::prepare_request, mirrored here so that
// this target links no proxy library; keep them in step).
//
// Properties, for any input that parses as one complete request:
//  * the request kvpersist would send upstream re-parses as exactly one complete request, with
//    the same method, target and body, Content-Length equal to the body and no
//    Transfer-Encoding: what llama-server frames is what kvpersist judged (no smuggling);
//  * no session, purpose or stripped header survives; hop-by-hop fields are gone;
//  * the session id is the first configured header present with a non-empty value;
//  * preparing the upstream request never throws (a throw escapes kvpersist's session).
#include <array>
#include <sstream>
#include <string>
#include <string_view>

#include "backends/net.hpp"
#include "core/request_class.hpp"
#include "proxy/http/relay.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using namespace kvp;

// config::session_config defaults
const std::array<std::string, 6> kSessionHeaders = {"X-Session-Id",     "x-claude-code-session-id",
                                                     "session-id",       "x-session-affinity",
                                                     "X-Amp-Thread-Id",  "x-litellm-session-id"};
const std::string kPurpose = "X-Session-Purpose";
const std::array<std::string, 1> kStrip = {"X-Conversation-Id"};

core::request_identity identity_of(const http::request<http::string_body>& req) {
  core::request_identity id;
  for (const auto& name : kSessionHeaders) {
    auto it = req.find(name);
    if (it != req.end() && !it->value().empty()) {
      id.session_id = std::string(it->value());
      break;
    }
  }
  if (auto it = req.find(kPurpose); it != req.end()) id.purpose = std::string(it->value());
  return id;
}

void prepare_upstream_request(http::request<http::string_body>& req) {
  for (const auto& name : kSessionHeaders) req.erase(name);
  req.erase(kPurpose);
  for (const auto& name : kStrip) req.erase(name);
  proxy::strip_hop_by_hop(req.base());
  req.erase(http::field::expect);
  req.set(http::field::host, "127.0.0.1:8080");
  req.version(11);
  req.keep_alive(true);
  req.prepare_payload();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  http::request_parser<http::string_body> p;
  p.header_limit(16 * 1024);
  p.body_limit(64 * 1024);
  p.eager(true);
  beast::error_code ec;
  const std::size_t used = p.put(net::buffer(data, size), ec);
  if (ec || !p.is_done()) return 0;
  (void)used;
  auto req = p.release();

  // session extraction: first configured header with a non-empty value
  const auto who = identity_of(req);
  for (const auto& name : kSessionHeaders) {
    auto it = req.find(name);
    if (it != req.end() && !it->value().empty()) {
      KVP_FUZZ_CHECK(who.session_id == it->value());
      break;
    }
  }
  (void)core::classify(req.method_string(), req.target());

  const std::string method(req.method_string());
  const std::string target(req.target());
  const std::string body = req.body();
  // kvpersist refuses TRACE and CONNECT with 405 before preparing anything (the method
  // allow-list in proxy/http/request_reader.cpp; regression seeds corpus/http_request/regress_trace_*: Beast's prepare_payload throws for
  // TRACE with a body, and that exception used to leak the connection).
  if (req.method() == http::verb::trace || req.method() == http::verb::connect) return 0;
  try {
    prepare_upstream_request(req);
  } catch (const std::exception&) {
    KVP_FUZZ_CHECK(!"prepare_upstream_request threw");
  }

  std::ostringstream os;
  os << req;
  const std::string wire = os.str();

  http::request_parser<http::string_body> q;
  q.header_limit(1024 * 1024);
  q.body_limit(1024 * 1024);
  q.eager(true);
  const std::size_t n = q.put(net::buffer(wire), ec);
  KVP_FUZZ_CHECK(!ec);
  KVP_FUZZ_CHECK(q.is_done());
  KVP_FUZZ_CHECK(n == wire.size());  // one request, nothing after it
  const auto& out = q.get();
  KVP_FUZZ_CHECK(std::string(out.method_string()) == method);
  KVP_FUZZ_CHECK(std::string(out.target()) == target);
  KVP_FUZZ_CHECK(out.body() == body);
  KVP_FUZZ_CHECK(out.find(http::field::transfer_encoding) == out.end());
  if (!body.empty()) {
    KVP_FUZZ_CHECK(out.find(http::field::content_length) != out.end());
    KVP_FUZZ_CHECK(out[http::field::content_length] == std::to_string(body.size()));
  }
  for (const auto& name : kSessionHeaders) KVP_FUZZ_CHECK(out.find(name) == out.end());
  KVP_FUZZ_CHECK(out.find(kPurpose) == out.end());
  KVP_FUZZ_CHECK(out.find(kStrip[0]) == out.end());
  KVP_FUZZ_CHECK(out.find(http::field::expect) == out.end());
  KVP_FUZZ_CHECK(out.find(http::field::upgrade) == out.end());
  KVP_FUZZ_CHECK(out.find(http::field::te) == out.end());
  KVP_FUZZ_CHECK(out.count(http::field::host) == 1);
  return 0;
}
