#include "proxy/snapshot_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/identity.hpp"

namespace kvp::proxy {

std::string snapshot_files::path(std::string_view filename) const {
  std::string p = dir_;
  p += '/';
  p += filename;
  return p;
}

std::optional<std::uint64_t> snapshot_files::size(std::string_view filename) const {
  struct stat st {};
  if (::stat(path(filename).c_str(), &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_size);
}

bool snapshot_files::make_durable(std::string_view filename, std::uint64_t expected_bytes) const {
  if (!shared()) return true;  // server-owned: the generation rotation is the safety net
  const int fd = ::open(path(filename).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == expected_bytes;
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

std::uint64_t snapshot_files::bytes(std::string_view hash) const {
  if (!shared()) return 0;
  std::uint64_t total = 0;
  for (char g : {'a', 'b'}) total += size(core::snapshot_filename(hash, g)).value_or(0);
  return total;
}

std::uint64_t snapshot_files::remove(std::string_view hash) const {
  if (!shared()) return 0;
  std::uint64_t deleted = 0;
  for (char g : {'a', 'b'}) {
    const auto p = path(core::snapshot_filename(hash, g));
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && ::unlink(p.c_str()) == 0)
      deleted += static_cast<std::uint64_t>(st.st_size);
  }
  return deleted;
}

}  // namespace kvp::proxy
