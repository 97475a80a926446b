// Manifests on disk: <state_dir>/sessions/<hash>.json, written atomically
// (temp file, fsync, rename, fsync of the directory: docs/design.md §11). Blocking file I/O; called
// only on the save/restore path, never for a resident request.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/behaviour.hpp"
#include "core/manifest.hpp"
#include "core/request_hints.hpp"
#include "core/result.hpp"
#include "proxy/control/private_dir.hpp"

namespace kvp::proxy {

class manifest_store {
 public:
  explicit manifest_store(std::string state_dir);

  // Creates <state_dir>/sessions (mode 0700) and checks both are kvpersist's alone
  // (proxy/control/private_dir.hpp): owned by its user, writable by nobody else, sessions/ no
  // symlink. Files are then reached only through descriptors of the two directories, opened
  // once, never through a symlink. Error: metadata_io with the reason.
  core::result<core::unit> open() const;
  // Every manifest that parses; the others are reported in `skipped` ("file: reason")
  // and left in place (a cache problem costs a cold prefill, never a crash).
  std::vector<core::manifest> load_all(std::vector<std::string>& skipped) const;
  // The session's manifest as it is on disk now, if it exists and parses.
  std::optional<core::manifest> read(const std::string& hash) const;
  // Atomically replaces the session's manifest. On error the previous file is untouched.
  core::result<core::unit> write(const core::manifest& m) const;
  // Removes the session's manifest (purge). Missing is not an error.
  core::result<core::unit> remove(const std::string& hash) const;

  // `doctor --verify`'s verdict for a runtime fingerprint (<state_dir>/compatibility.json).
  core::result<core::unit> write_compatibility(const std::string& fingerprint,
                                               const std::string& verdict,
                                               const std::string& checked_at) const;
  // What compatibility.json records: one runtime fingerprint and its verdict ("unknown" for
  // no file, a file that does not parse, or a verdict not known).
  struct compatibility_record {
    std::string fingerprint;
    std::string verdict = "unknown";
  };
  compatibility_record read_compatibility_record() const;
  // The verdict recorded for `fingerprint`, or "unknown".
  std::string read_compatibility(const std::string& fingerprint) const {
    auto r = read_compatibility_record();
    return r.fingerprint == fingerprint ? r.verdict : "unknown";
  }

  // The behaviour classes seen under a metadata fingerprint (core/behaviour.hpp), oldest
  // first, in <state_dir>/behaviour-<fingerprint>.json. Unreadable or absent: none known.
  std::vector<core::behaviour_signature> read_behaviours(const std::string& fingerprint) const;
  core::result<core::unit> write_behaviours(const std::string& fingerprint,
                                            const std::vector<core::behaviour_signature>& known) const;

  // What the daemon saw that keeps conversations from starting warm (core/request_hints.hpp),
  // for `kvpersist doctor`: <state_dir>/hints.json, rewritten by each process when it first
  // sees a hint and removed when the process starts (so it speaks of the latest process).
  struct hint_record {
    core::hint_id hint = core::hint_id::attribution_header;
    std::string first_seen_at;  // RFC 3339
  };
  core::result<core::unit> write_hints(const std::vector<hint_record>& hints) const;
  // The known hints hints.json records; none for no file or one that does not parse.
  std::vector<hint_record> read_hints() const;
  void remove_hints() const;
  // llama-server's sleep period as the daemon learned it (docs/design.md §4 "Sleep"), for
  // `kvpersist doctor` and the next start: <state_dir>/sleep.json. 0: none learned.
  core::result<core::unit> write_learned_sleep(std::chrono::seconds period) const;
  std::chrono::seconds read_learned_sleep() const;

  // The sessions directory, where a session's manifest is <hash>.json.
  const std::string& dir() const { return sessions_dir_; }

 private:
  std::string path_for(const std::string& hash) const;
  std::string state_dir_;
  std::string sessions_dir_;
  dir_handle state_;
  dir_handle sessions_;
};

}  // namespace kvp::proxy
