#include "proxy/control/private_dir.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/errc.hpp"

namespace kvp::proxy {

dir_handle::state::~state() {
  if (fd >= 0) ::close(fd);
}

dir_handle::dir_handle(std::string path)
    : path_(std::move(path)), state_(std::make_shared<state>()) {}

int dir_handle::fd() const {
  std::lock_guard lock(state_->mu);
  if (state_->fd < 0)
    state_->fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  return state_->fd;
}

namespace {

core::error unsafe(std::string message) {
  return core::error{core::errc::metadata_io, 0, std::move(message)};
}

std::string user_name(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);  // startup only, before any thread runs
  return pw ? fmt::format("{} ({})", uid, pw->pw_name) : std::to_string(uid);
}

// mkdir -p with mode 0700 for every directory it creates.
bool make_dirs(const std::string& path) {
  for (std::size_t at = 1; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  return true;
}

}  // namespace

core::result<core::unit> check_private_dir(const std::string& path, bool create, bool follow) {
  if (create && !make_dirs(path))
    return unsafe(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  struct stat st {};
  const int rc = follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st);
  if (rc != 0) return unsafe(fmt::format("cannot use {}: {}", path, std::strerror(errno)));
  if (S_ISLNK(st.st_mode))
    return unsafe(fmt::format("{} is a symlink; kvpersist follows none below its state "
                              "directory: remove it (kvpersist creates the directory itself)",
                              path));
  if (!S_ISDIR(st.st_mode)) return unsafe(fmt::format("{} is not a directory", path));
  const uid_t me = ::geteuid();
  const bool owner_ok = st.st_uid == me || st.st_uid == 0;
  const bool mode_ok = (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
  if (owner_ok && mode_ok) return core::unit{};
  return unsafe(fmt::format(
      "{} is unsafe: owner uid {}, mode {:04o}; it must be owned by uid {} (kvpersist's user) "
      "or root and writable by nobody else (chown {} {} && chmod 700 {})",
      path, user_name(st.st_uid), st.st_mode & 07777, user_name(me), me, path, path));
}

core::result<core::unit> check_state_dirs(const config::config& cfg) {
  const std::string root = config::resolve_state_dir(cfg);
  if (auto r = check_private_dir(root, true, true); !r) return r;
  if (!cfg.servers.empty())
    if (auto r = check_private_dir(root + "/servers", true, false); !r) return r;
  for (const auto& sc : config::effective_servers(cfg)) {
    const std::string dir = config::server_state_dir(cfg, sc, root);
    if (dir != root)
      if (auto r = check_private_dir(dir, true, false); !r) return r;
    if (auto r = check_private_dir(dir + "/sessions", true, false); !r) return r;
    const auto& snap = sc.snapshots;
    struct stat st {};
    if (snap.management == config::snapshot_management::shared_filesystem &&
        ::stat(snap.path.c_str(), &st) == 0)
      if (auto r = check_private_dir(snap.path, false, true); !r) return r;
  }
  return core::unit{};
}

}  // namespace kvp::proxy
