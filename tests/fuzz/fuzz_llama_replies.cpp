// Fuzz target: the parsers of llama-server's replies (backends::parse_*, error_message). The
// first byte picks the parser, the rest is the body. Never crash (seeds deep_*: 300 KB of '['
// once overflowed the stack); what they accept is sane: a slot count kvpersist can manage,
// counts no larger than core::json_max_count.
#include <string>
#include <string_view>

#include "backends/llama_http_backend.hpp"
#include "core/json.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace b = kvp::backends;
  constexpr auto max_count = kvp::core::json_max_count;
  switch (data[0] % 6) {
    case 0: {
      auto r = b::parse_props(body);
      if (r) KVP_FUZZ_CHECK(r->fingerprint().size() == 64);
      if (r) KVP_FUZZ_CHECK(r->total_slots >= 1 && r->total_slots <= kvp::core::max_total_slots);
      break;
    }
    case 1: {
      auto r = b::parse_save_reply(body);
      if (r) KVP_FUZZ_CHECK(r->n_saved <= max_count && r->n_written <= max_count);
      break;
    }
    case 2: {
      auto r = b::parse_restore_reply(body);
      if (r) KVP_FUZZ_CHECK(r->n_restored <= max_count && r->n_read <= max_count);
      break;
    }
    case 3: {
      auto r = b::parse_erase_reply(body);
      if (r) KVP_FUZZ_CHECK(r->n_erased <= max_count);
      break;
    }
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
