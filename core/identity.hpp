// Snapshot identity: who a snapshot belongs to and which runtime may restore it.
// Filenames are hex SHA-256 digests, never raw session ids (docs/design.md §3, invariant 9).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvp::core {

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// Lowercase hex of `n` bytes.
std::string hex_bytes(const unsigned char* data, std::size_t n);

// The most slots kvpersist manages on one server; /props reporting more is refused.
inline constexpr std::int64_t max_total_slots = 1024;

// What llama-server tells about itself (GET /props, /v1/models, /lora-adapters), plus the
// operator's runtimeKey. KV types and flash attention are invisible to the API: runtimeKey
// stands for them (docs/design.md §4).
struct runtime_info {
  std::string model_path;
  std::string build_info;
  std::int64_t n_ctx = 0;
  std::int64_t total_slots = 0;
  std::string runtime_key;
  std::string model_ftype;        // /props model_ftype
  std::string prompt_format;      // SHA-256 over /props chat templates and special tokens
  std::string model_meta;         // /v1/models meta, canonical "key=value;" in key order
  std::string lora_adapters;      // GET /lora-adapters, canonical "id,path,scale;" per adapter
  std::string behaviour;          // core/behaviour.hpp class id; "" until probed, or unknowable
  std::string media_marker;  // per-process random: an epoch, never part of the fingerprint
  bool sleeping = false;     // is_sleeping: the model and every slot's KV are unloaded

  // Hex SHA-256 over every field except media_marker and sleeping. `behaviour` counts only
  // when known, so a runtime that cannot be probed keeps its metadata-only fingerprint.
  std::string fingerprint() const;
};

// The most bytes of a session id kvpersist keeps (docs/design.md §3): a longer id (a header
// value may be 64 KiB) is replaced by "sha256:" and the hex SHA-256 of the whole id, so one
// id still names one session and what is kept of it (records, manifests) stays small.
// The session ids kvpersist gives its own sessions (prefix snapshots, core/prefix_snapshot.hpp)
// begin with this. A client's id that begins so is kept as its digest too, so no request can
// name, resume or overwrite one of kvpersist's own sessions.
inline constexpr std::size_t max_session_id_bytes = 256;
inline constexpr std::string_view own_session_id_head = "prefix:";
std::string bounded_session_id(std::string_view session_id);

// The session's snapshot key: hash of the server instance, the model and the session id.
// One session talking to two models gets two independent snapshots (docs/design.md §3).
// `credential`: a credential_key() that scopes a header session under `sharing: credential`
// or `session` (docs/design.md §20); "" leaves the derivation as it was before scopes.
std::string session_hash(std::string_view instance_key, std::string_view model_id,
                         std::string_view session_id, std::string_view credential = {});

// The name llama-server writes under --slot-save-path for generation 'a' or 'b' (70 bytes,
// passes llama-server's fs_validate_filename).
std::string snapshot_filename(std::string_view hash, char generation);

// First 8 hex characters, for logs at info level.
inline std::string_view abbrev(std::string_view hash) { return hash.substr(0, 8); }

}  // namespace kvp::core
