// Fuzz target: the request target -> endpoint classification (core::classify,
// core::decode_path), differentially against llama-server's own path decoding.
//
// llama-server routes on cpp-httplib's decode_path_component() of the path. Whatever it would
// route to its slot API must be classified `slots` (refused with 403), and whatever it would run
// as an inference endpoint must be classified `inference` (taken through the slot lease);
// otherwise a client gets past kvpersist. The reference decoder below is a transcription of
// cpp-httplib's (vendor/cpp-httplib/httplib.cpp in llama.cpp: decode_path_component,
// detail::from_hex_to_i, detail::to_utf8; MIT licence, Copyright (c) Yuji Hirose).
#include <array>
#include <string>
#include <string_view>

#include "core/request_class.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

bool ref_is_hex(char c, int& v) {
  if (c >= '0' && c <= '9') { v = c - '0'; return true; }
  if (c >= 'A' && c <= 'F') { v = c - 'A' + 10; return true; }
  if (c >= 'a' && c <= 'f') { v = c - 'a' + 10; return true; }
  return false;
}

bool ref_from_hex_to_i(const std::string& s, std::size_t i, std::size_t cnt, int& val) {
  if (i >= s.size()) return false;
  val = 0;
  for (; cnt; ++i, --cnt) {
    if (i >= s.size() || !s[i]) return false;  // s[size()] is '\0' in httplib: same outcome
    int v = 0;
    if (!ref_is_hex(s[i], v)) return false;
    val = val * 16 + v;
  }
  return true;
}

std::size_t ref_to_utf8(int code, char* buff) {
  if (code < 0x0080) { buff[0] = static_cast<char>(code & 0x7F); return 1; }
  if (code < 0x0800) {
    buff[0] = static_cast<char>(0xC0 | ((code >> 6) & 0x1F));
    buff[1] = static_cast<char>(0x80 | (code & 0x3F));
    return 2;
  }
  if (code < 0xD800 || (code >= 0xE000 && code < 0x10000)) {
    buff[0] = static_cast<char>(0xE0 | ((code >> 12) & 0xF));
    buff[1] = static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    buff[2] = static_cast<char>(0x80 | (code & 0x3F));
    return 3;
  }
  return 0;  // D800-DFFF (a UTF-16 surrogate) decodes to nothing
}

std::string ref_decode_path_component(const std::string& component) {
  std::string result;
  for (std::size_t i = 0; i < component.size(); i++) {
    if (component[i] == '%' && i + 1 < component.size()) {
      if (component[i + 1] == 'u') {
        int val = 0;
        if (ref_from_hex_to_i(component, i + 2, 4, val)) {
          char buff[4];
          std::size_t len = ref_to_utf8(val, buff);
          if (len > 0) result.append(buff, len);
          i += 5;
        } else {
          result += component[i];
        }
      } else {
        int val = 0;
        if (ref_from_hex_to_i(component, i + 1, 2, val)) {
          result += static_cast<char>(val);
          i += 2;
        } else {
          result += component[i];
        }
      }
    } else {
      result += component[i];
    }
  }
  return result;
}

// The path llama-server routes: fragment dropped, up to the first '?', decoded.
std::string llama_route_path(std::string_view target) {
  std::string t(target.substr(0, target.find('#')));
  return ref_decode_path_component(t.substr(0, t.find('?')));
}

// llama-server's inference routes (tools/server/server.cpp), exact matches.
constexpr std::array<std::string_view, 21> kInference = {
    "/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
    "/responses", "/v1/responses", "/infill", "/v1/messages", "/embedding", "/embeddings",
    "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/api/chat",
    "/api/generate", "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/infill"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view target(reinterpret_cast<const char*>(data), size);
  const auto rc = kvp::core::classify("POST", target);
  const auto kind = rc.kind;
  const std::string routed = llama_route_path(target);

  // decode_path agrees with llama-server's decoder (a %uD800 mismatch was a /slots bypass)
  const std::string path(target.substr(0, target.find_first_of("?#")));
  KVP_FUZZ_CHECK(kvp::core::decode_path(path) == ref_decode_path_component(path));
  // whatever llama-server would route to /slots is refused
  if (routed == "/slots" || routed.starts_with("/slots/"))
    KVP_FUZZ_CHECK(kind == kvp::core::endpoint_kind::slots);
  // whatever llama-server would run on a slot takes the lease
  for (auto p : kInference)
    if (routed == p) KVP_FUZZ_CHECK(kind == kvp::core::endpoint_kind::inference);
  // the request path and the chain read the same row of the route table
  KVP_FUZZ_CHECK(rc.route == kvp::core::inference_route_of(target));
  KVP_FUZZ_CHECK(rc.needs_slot == (kind == kvp::core::endpoint_kind::inference));
  return 0;
}
