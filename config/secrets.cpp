#include "config/secrets.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace kvp::config {
namespace {

bool is_control(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && c != '\t') || u == 0x7f;
}

secret_read refused(std::string why) { return secret_read{{}, std::move(why)}; }

// Up to `limit` bytes of the open regular file `fd`; nullopt on a read error.
std::optional<std::string> read_at_most(int fd, std::size_t limit) {
  std::string out(limit, '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

std::string getenv_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// `value` from the environment, else from the credential `name` in `directory`, when empty.
std::optional<std::string> fill_secret(std::string& value, const std::string& from_env,
                                       const std::string& directory, std::string_view name) {
  if (!value.empty()) return std::nullopt;
  if (!from_env.empty()) {
    value = from_env;
    return std::nullopt;
  }
  if (directory.empty()) return std::nullopt;
  const std::string path = fmt::format("{}/{}", directory, name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
  auto read = read_secret_file(path);
  if (read.empty) return std::nullopt;  // the unit's fallback: no key
  if (!read.error.empty()) return fmt::format("systemd credential {}: {}", name, read.error);
  value = std::move(read.value);
  return std::nullopt;
}

}  // namespace

secret_read read_secret_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO put there by mistake must not hang startup.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return refused(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  struct stat st {};
  std::optional<std::string> text;
  // Room for the key, a trailing CRLF, and one byte that tells a longer file.
  const std::size_t room = max_secret_bytes + 3;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) text = read_at_most(fd, room);
  const int read_errno = errno;
  ::close(fd);
  if (!S_ISREG(st.st_mode)) return refused(fmt::format("{} is not a regular file", path));
  if (!text) return refused(fmt::format("cannot read {}: {}", path, std::strerror(read_errno)));
  while (text->size() < room && !text->empty() && (text->back() == '\n' || text->back() == '\r'))
    text->pop_back();
  if (text->size() > max_secret_bytes)
    return refused(fmt::format("{} holds more than {} bytes: not a key", path, max_secret_bytes));
  if (text->empty()) return secret_read{{}, fmt::format("{} is empty", path), true};
  if (std::any_of(text->begin(), text->end(), is_control))
    return refused(fmt::format("{} holds a line break or another control character inside "
                               "the key (it is sent in an HTTP header)",
                               path));
  return secret_read{std::move(*text), {}};
}

bool readable_by_others(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0;
}

std::vector<exposed_secret> exposed_secrets(const config& cfg, const std::string& config_path) {
  std::vector<exposed_secret> out;
  auto check = [&](std::string key, const std::string& value, const std::string& file) {
    const std::string& holder = file.empty() ? config_path : file;
    if ((!value.empty() || !file.empty()) && !holder.empty() && readable_by_others(holder))
      out.push_back({std::move(key), holder});
  };
  check("upstream.apiKey", cfg.upstream.api_key, cfg.upstream.api_key_file);
  for (const auto& sv : cfg.servers)
    check(fmt::format("servers.{}.apiKey", sv.name), sv.upstream.api_key, sv.upstream.api_key_file);
  check("admin.token", cfg.admin.token, cfg.admin.token_file);
  return out;
}

secret_environment read_secret_environment() {
  return {getenv_or_empty("KVP_UPSTREAM_API_KEY"), getenv_or_empty("KVP_ADMIN_TOKEN"),
          getenv_or_empty("CREDENTIALS_DIRECTORY")};
}

std::optional<std::string> apply_secret_sources(config& cfg, const secret_environment& env) {
  if (cfg.servers.empty()) {
    if (auto err = fill_secret(cfg.upstream.api_key, env.upstream_api_key,
                               env.credentials_directory, upstream_api_key_credential))
      return err;
  }
  return fill_secret(cfg.admin.token, env.admin_token, env.credentials_directory,
                     admin_token_credential);
}

}  // namespace kvp::config
