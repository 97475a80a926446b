#include "proxy/control/snapshot_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/errc.hpp"
#include "core/identity.hpp"
#include "core/manifest.hpp"

namespace kvp::proxy {

namespace {

core::error file_error(core::errc code, std::string message) {
  return core::error{code, 0, std::move(message)};
}

// The open regular file `filename` of `dir`, never through a symlink, nor blocking on a FIFO.
// -1 with errno (ELOOP for a symlink, EINVAL for anything but a regular file).
int open_regular(const dir_handle& dir, std::string_view filename, int flags) {
  const int dfd = dir.fd();
  if (dfd < 0) return -1;
  const std::string name(filename);
  const int fd = ::openat(dfd, name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

std::uint64_t file_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

}  // namespace

core::result<std::string> snapshot_checksum(int fd) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  std::vector<char> buf(std::size_t{1} << 20);
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return file_error(core::errc::metadata_io, fmt::format("read: {}", std::strerror(errno)));
    if (n == 0) break;
    XXH3_128bits_update(&state, buf.data(), static_cast<std::size_t>(n));
    at += n;
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return fmt::format("{}{:016x}{:016x}", core::manifest::checksum_prefix, h.high64, h.low64);
}

std::string snapshot_files::path(std::string_view filename) const {
  return fmt::format("{}/{}", dir_.path(), filename);
}

std::optional<std::uint64_t> snapshot_files::size(std::string_view filename) const {
  const int fd = open_regular(dir_, filename, O_RDONLY);
  if (fd < 0) return std::nullopt;
  const auto bytes = file_size(fd);
  ::close(fd);
  return bytes;
}

core::result<std::string> snapshot_files::seal(std::string_view filename,
                                               std::uint64_t expected_bytes) const {
  const int fd = open_regular(dir_, filename, O_RDONLY);
  if (fd < 0)
    return file_error(core::errc::save_failed,
                      fmt::format("{}: {}", path(filename), std::strerror(errno)));
  core::result<std::string> out = std::string();
  const auto bytes = file_size(fd);
  if (bytes != expected_bytes)
    out = file_error(core::errc::save_failed,
                     fmt::format("the snapshot file has {} bytes, llama-server's n_written says {}",
                                 bytes, expected_bytes));
  else if (::fsync(fd) != 0)
    out = file_error(core::errc::save_failed, fmt::format("fsync: {}", std::strerror(errno)));
  else
    out = snapshot_checksum(fd);
  ::close(fd);
  return out;
}

core::result<core::unit> snapshot_files::verify(std::string_view filename,
                                                std::uint64_t expected_bytes,
                                                std::string_view checksum) const {
  const int fd = open_regular(dir_, filename, O_RDONLY);
  if (fd < 0 && errno == ENOENT)
    return file_error(core::errc::snapshot_not_found, "snapshot file is missing");
  if (fd < 0 && (errno == ELOOP || errno == EINVAL))
    return file_error(core::errc::snapshot_corrupt, "snapshot file is not a regular file");
  if (fd < 0)
    return file_error(core::errc::metadata_io,
                      fmt::format("{}: {}", path(filename), std::strerror(errno)));
  core::result<core::unit> out = core::unit{};
  const auto bytes = file_size(fd);
  if (expected_bytes > 0 && bytes != expected_bytes) {
    // Truncated or replaced: some llama-server builds abort on a truncated file.
    out = file_error(core::errc::snapshot_corrupt,
                     fmt::format("snapshot file has {} bytes, {} were saved", bytes,
                                 expected_bytes));
  } else if (!checksum.empty()) {
    const auto sum = snapshot_checksum(fd);
    if (!sum) out = sum.err();
    else if (sum.value() != checksum)
      out = file_error(core::errc::snapshot_corrupt,
                       "snapshot file's checksum differs from the one recorded at its save");
  }
  ::close(fd);
  return out;
}

std::uint64_t snapshot_files::bytes(std::string_view hash) const {
  if (!shared()) return 0;
  std::uint64_t total = 0;
  for (char g : {'a', 'b'}) total += size(core::snapshot_filename(hash, g)).value_or(0);
  return total;
}

std::uint64_t snapshot_files::remove(std::string_view hash) const {
  if (!shared() || dir_.fd() < 0) return 0;
  std::uint64_t deleted = 0;
  for (char g : {'a', 'b'}) {
    const auto name = core::snapshot_filename(hash, g);
    struct stat st {};
    if (::fstatat(dir_.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        ::unlinkat(dir_.fd(), name.c_str(), 0) == 0)
      deleted += S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0;
  }
  return deleted;
}

}  // namespace kvp::proxy
