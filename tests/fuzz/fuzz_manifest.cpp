// Fuzz target: the manifest parser (core::parse_manifest). Whatever it accepts has a 64-hex
// session hash and a generation of a or b, and survives to_json -> parse_manifest unchanged
// (a manifest kvpersist rewrites means what it read; sessionId as valid UTF-8). Its counts are
// at most core::json_max_count (a revision near 2^64 once wrapped the dirty counter), and deep
// nesting is refused, not a crash (seeds deep_*).
#include <string>
#include <string_view>

#include "core/json.hpp"
#include "core/manifest.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = kvp::core::parse_manifest(text);
  if (!r) {
    KVP_FUZZ_CHECK(r.err().code == kvp::core::errc::manifest_invalid);
    return 0;
  }
  const auto& m = r.value();
  KVP_FUZZ_CHECK(m.session_hash.size() == 64);
  KVP_FUZZ_CHECK(m.generation == 'a' || m.generation == 'b');
  KVP_FUZZ_CHECK(m.snapshot_file() == m.session_hash + "." + m.generation + ".bin");
  constexpr auto max_count = kvp::core::json_max_count;
  KVP_FUZZ_CHECK(m.tokens <= max_count && m.bytes <= max_count && m.revision <= max_count);
  auto again = kvp::core::parse_manifest(kvp::core::to_json(m));
  KVP_FUZZ_CHECK(again.ok());
  const auto& n = again.value();
  // sessionId is written through valid_utf8 (a manifest is UTF-8 JSON even for a session id
  // with obs-text bytes); it is informational, the hash names the files.
  KVP_FUZZ_CHECK(n.session_id == kvp::core::valid_utf8(m.session_id));
  KVP_FUZZ_CHECK(n.session_hash == m.session_hash);
  KVP_FUZZ_CHECK(n.instance_key == m.instance_key && n.model_id == m.model_id);
  KVP_FUZZ_CHECK(n.runtime_fingerprint == m.runtime_fingerprint && n.generation == m.generation);
  KVP_FUZZ_CHECK(n.tokens == m.tokens && n.bytes == m.bytes && n.revision == m.revision);
  KVP_FUZZ_CHECK(n.state == m.state && n.compatibility == m.compatibility);
  KVP_FUZZ_CHECK(n.created_at == m.created_at && n.updated_at == m.updated_at);
  if (m.state == kvp::core::snapshot_state::invalid) KVP_FUZZ_CHECK(n.invalid_reason == m.invalid_reason);
  return 0;
}
