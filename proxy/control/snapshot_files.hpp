// llama-server's snapshot files as kvpersist sees them (docs/design.md §12). In
// shared-filesystem mode kvpersist sees llama-server's --slot-save-path: it checks sizes and
// checksums, fsyncs, and deletes files, each reached through the directory's descriptor and
// never through a symlink. In server-owned mode (no directory) the files are llama-server's
// alone: nothing is checked and nothing is deleted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.hpp"
#include "proxy/control/private_dir.hpp"

namespace kvp::proxy {

class snapshot_files {
 public:
  // `dir`: the snapshot directory as kvpersist sees it; "" in server-owned mode.
  explicit snapshot_files(std::string dir) : dir_(std::move(dir)) {}

  // Shared-filesystem mode: kvpersist sees, checks and deletes the files.
  bool shared() const { return !dir_.path().empty(); }
  // REQUIRES: shared().
  std::string path(std::string_view filename) const;
  // The size of the regular file `filename`; nullopt if there is none (missing, a symlink, or
  // it cannot be read). REQUIRES: shared().
  std::optional<std::uint64_t> size(std::string_view filename) const;
  // After a save: the file has `expected_bytes`, has been fsynced (llama-server does not
  // fsync), and its checksum (snapshot_checksum) is returned for the manifest.
  // Error: save_failed. REQUIRES: shared().
  core::result<std::string> seal(std::string_view filename, std::uint64_t expected_bytes) const;
  // Before a restore: the file is a regular file of `expected_bytes` (when not 0) whose
  // checksum is `checksum` (when not empty). Error: snapshot_not_found (no file),
  // snapshot_corrupt (a symlink, another size, another checksum), metadata_io (unreadable).
  // REQUIRES: shared().
  core::result<core::unit> verify(std::string_view filename, std::uint64_t expected_bytes,
                                  std::string_view checksum) const;
  // The bytes of the session's two generation files (0 in server-owned mode).
  std::uint64_t bytes(std::string_view hash) const;
  // Deletes the session's two generation files; returns the bytes deleted (0 in server-owned
  // mode, where nothing is deleted).
  std::uint64_t remove(std::string_view hash) const;

 private:
  dir_handle dir_;
};

// "xxh3-128:" and the 32 hex digits of XXH3's 128-bit hash of the file's bytes: what a
// manifest's `checksum` holds (core/manifest.hpp).
core::result<std::string> snapshot_checksum(int fd);

}  // namespace kvp::proxy
