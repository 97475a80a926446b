// Fuzz target: the parsers of llama-server's replies (backends::parse_*, error_message). The
// first byte picks the parser, the rest is the body. Never crash; what they accept is sane.
#include <string>
#include <string_view>

#include "backends/llama_http_backend.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace b = kvp::backends;
  switch (data[0] % 6) {
    case 0: {
      auto r = b::parse_props(body);
      if (r) KVP_FUZZ_CHECK(r->fingerprint().size() == 64);
      break;
    }
    case 1: (void)b::parse_save_reply(body); break;
    case 2: (void)b::parse_restore_reply(body); break;
    case 3: (void)b::parse_erase_reply(body); break;
    case 4: {
      auto r = b::parse_slots(body);
      if (r) KVP_FUZZ_CHECK(r->size() <= body.size());
      break;
    }
    default: {
      auto m = b::error_message(body);
      KVP_FUZZ_CHECK(m.size() <= body.size());
      break;
    }
  }
  return 0;
}
