// llama-server's snapshot files as kvpersist sees them (docs/design.md §12). In
// shared-filesystem mode kvpersist sees llama-server's --slot-save-path: it checks sizes,
// fsyncs, and deletes files. In server-owned mode (no directory) the files are
// llama-server's alone: nothing is checked and nothing is deleted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvp::proxy {

class snapshot_files {
 public:
  // `dir`: the snapshot directory as kvpersist sees it; "" in server-owned mode.
  explicit snapshot_files(std::string dir) : dir_(std::move(dir)) {}

  // Shared-filesystem mode: kvpersist sees, checks and deletes the files.
  bool shared() const { return !dir_.empty(); }
  // REQUIRES: shared().
  std::string path(std::string_view filename) const;
  // The file's size; nullopt if it does not exist (or cannot be read). REQUIRES: shared().
  std::optional<std::uint64_t> size(std::string_view filename) const;
  // After a save: the file has `expected_bytes` and has been fsynced (llama-server does not
  // fsync), so a manifest may point at it. Always true in server-owned mode.
  bool make_durable(std::string_view filename, std::uint64_t expected_bytes) const;
  // The bytes of the session's two generation files (0 in server-owned mode).
  std::uint64_t bytes(std::string_view hash) const;
  // Deletes the session's two generation files; returns the bytes deleted (0 in server-owned
  // mode, where nothing is deleted).
  std::uint64_t remove(std::string_view hash) const;

 private:
  std::string dir_;
};

}  // namespace kvp::proxy
