// Directories kvpersist writes: checked before use (owner and mode, as OpenSSH's StrictModes
// checks ~/.ssh) and opened once, so that nobody else can swap what kvpersist reads and writes
// (docs/design.md §11, "The state directory").
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "config/config.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

// A directory reached through a descriptor opened once (O_DIRECTORY | O_NOFOLLOW); files
// below it are opened with openat(fd(), name, ... | O_NOFOLLOW), so a symlink planted at the
// directory's name after the first use, or at a file's name, is never followed. Copies share
// the descriptor (cheap to copy into file-pool lambdas); it is closed with the last copy.
class dir_handle {
 public:
  explicit dir_handle(std::string path);
  const std::string& path() const { return path_; }
  // The descriptor, opened on the first call that finds the directory; -1 (errno set) while
  // it cannot be opened (missing, a symlink, not a directory).
  int fd() const;

 private:
  struct state {
    std::mutex mu;
    int fd = -1;
    ~state();
  };
  std::string path_;
  std::shared_ptr<state> state_;
};

// The directory at `path` (created 0700 when missing, with any missing parents, if `create`)
// is one only this process's user can change: owned by the effective user (or root) and not
// writable by group or others. `follow`: the operator's own path (the state directory, which
// systemd's StateDirectory= may make a symlink) is followed; a directory kvpersist names
// itself (sessions/, servers/<name>) must not be a symlink. Error: metadata_io naming the
// path, its owner and mode, and the fix.
core::result<core::unit> check_private_dir(const std::string& path, bool create, bool follow);

// `serve`'s check before it starts (docs/design.md §11): every state directory it will write
// (the root, servers/<name>, each sessions/) is created 0700 where missing and passes
// check_private_dir, and so does each shared-filesystem snapshot directory that exists (a
// missing one is warned about by the coordinator, as before).
core::result<core::unit> check_state_dirs(const config::config& cfg);

}  // namespace kvp::proxy
