// The per-session manifest: kvpersist's own record of a snapshot that llama-server wrote.
// Parse and serialize only; proxy/control/manifest_store writes it atomically.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/prefix_chain.hpp"
#include "core/result.hpp"

namespace kvp::core {

enum class snapshot_state { ready, invalid };

struct manifest {
  static constexpr int schema_version = 1;

  std::string session_id;    // the harness's id; kept here (not in logs) for the admin API
  std::string session_hash;  // hex SHA-256; names the files
  std::string instance_key;
  std::string model_id;
  std::string runtime_fingerprint;
  char generation = 'a';     // the file holding the last completed snapshot
  std::uint64_t tokens = 0;  // n_saved reported by the server
  std::uint64_t bytes = 0;   // n_written reported by the server
  // n_written of the other generation's file, the previous save (0: none written yet). In a
  // manifest written before this field, taken to be `bytes`. What the disk budget counts
  // (docs/design.md §12, "Disk budget") with `bytes`.
  std::uint64_t previous_bytes = 0;
  std::uint64_t revision = 0;
  snapshot_state state = snapshot_state::ready;
  std::string invalid_reason;                   // an errc name when state is invalid
  std::string invalid_note;                     // the operator's words (admin invalidate), or ""
  static constexpr std::size_t max_note_bytes = 256;
  std::string compatibility = "unknown";        // supported | experimental | broken | unknown
  std::string created_at;                       // RFC 3339 UTC, from the caller's wall clock
  std::string updated_at;
  double save_ms = 0;
  // The prefix chain of the saved content (core/prefix_chain.hpp), its first max_chain_links
  // links; empty when the requests had none. What seeding ranks snapshots by.
  std::vector<chain_link> chain;
  std::string credential;  // credential_key() of the requests that made it ("" without one)
  // The snapshot file's checksum when it was saved, checked before each restore: "xxh3-128:"
  // and 32 hex digits (proxy/control/snapshot_files.hpp); "" where kvpersist cannot read the file
  // (server-owned mode) and in manifests written before checksums.
  std::string checksum;
  static constexpr std::string_view checksum_prefix = "xxh3-128:";

  std::string snapshot_file() const;  // "<hash>.<generation>.bin"
  // Both generation files as llama-server reported them when it wrote them.
  std::uint64_t disk_bytes() const { return bytes + previous_bytes; }
  // The generation the next save writes: never the one this manifest points at.
  char next_generation() const { return generation == 'a' ? 'b' : 'a'; }
};

// `s` if it is valid UTF-8, else a copy with each invalid byte replaced by U+FFFD, so that
// JSON built from harness-supplied bytes (session ids) stays valid.
std::string valid_utf8(std::string_view s);

// Pretty-printed JSON with the keys documented in README (camelCase).
std::string to_json(const manifest& m);

// Parses what to_json wrote. Rejects text parse_json_bounded refuses (too deep), unknown
// schema versions, missing or mistyped keys, counts (tokens, bytes, revision) above
// json_max_count and a hash that is not 64 hex digits (errc::manifest_invalid, with a reason).
result<manifest> parse_manifest(std::string_view json);

}  // namespace kvp::core
