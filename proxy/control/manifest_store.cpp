#include "proxy/control/manifest_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <rapidjson/document.h>

#include "core/json.hpp"
#include "core/json_writer.hpp"

namespace kvp::proxy {

namespace {

core::error io_error(std::string_view what, const std::string& path, int err) {
  return core::error{core::errc::metadata_io, 0,
                     fmt::format("{} {}: {}", what, path, std::strerror(err))};
}

// write(2) until done, retrying on EINTR.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// The largest manifest or compatibility.json read: to_json writes well under 4 KiB.
constexpr off_t max_state_file_bytes = 1 << 20;

// The contents of the regular file `name` in `dir`, of at most max_state_file_bytes, never
// through a symlink nor blocking on a FIFO planted there. Error: metadata_io with the reason.
core::result<std::string> read_state_file(const dir_handle& dir, const std::string& name) {
  const std::string path = dir.path() + "/" + name;
  const int dfd = dir.fd();
  if (dfd < 0) return io_error("open", dir.path(), errno);
  int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return io_error("open", path, errno);
  struct stat st {};
  const bool usable =
      ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= max_state_file_bytes;
  std::string out(usable ? static_cast<std::size_t>(st.st_size) : 0, '\0');
  const ssize_t n = usable ? ::pread(fd, out.data(), out.size(), 0) : 0;
  const int err = errno;
  ::close(fd);
  if (!usable)
    return core::error{core::errc::metadata_io, 0,
                       fmt::format("{}: not a regular file of at most {} bytes", path,
                                   max_state_file_bytes)};
  if (n < 0) return io_error("read", path, err);
  out.resize(static_cast<std::size_t>(n));
  return out;
}

}  // namespace

manifest_store::manifest_store(std::string state_dir)
    : state_dir_(std::move(state_dir)),
      sessions_dir_(state_dir_ + "/sessions"),
      state_(state_dir_),
      sessions_(sessions_dir_) {}

std::string manifest_store::path_for(const std::string& hash) const {
  return sessions_dir_ + "/" + hash + ".json";
}

core::result<core::unit> manifest_store::open() const {
  if (auto r = check_private_dir(state_dir_, true, true); !r) return r;
  if (auto r = check_private_dir(sessions_dir_, true, false); !r) return r;
  ::chmod(sessions_dir_.c_str(), 0700);  // ours and writable by nobody else: tighten reads too
  if (sessions_.fd() < 0) return io_error("open", sessions_dir_, errno);
  if (::faccessat(sessions_.fd(), ".", W_OK, 0) != 0)
    return io_error("not writable", sessions_dir_, errno);
  return core::unit{};
}

namespace {

// The names of the entries of `dir` that end in `suffix` (regular files or unknown types).
std::vector<std::string> names_ending(const dir_handle& dir, std::string_view suffix) {
  std::vector<std::string> out;
  // A descriptor of its own (not a dup: that would share the handle's read position with
  // other threads); closedir closes it.
  const int dfd = dir.fd();
  const int own = dfd < 0 ? -1 : ::openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* d = own < 0 ? nullptr : ::fdopendir(own);
  if (!d) {
    if (own >= 0) ::close(own);
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (e->d_type == DT_DIR || name.size() <= suffix.size() ||
        name.substr(name.size() - suffix.size()) != suffix)
      continue;
    out.emplace_back(name);
  }
  ::closedir(d);
  return out;
}

}  // namespace

std::vector<core::manifest> manifest_store::load_all(std::vector<std::string>& skipped) const {
  std::vector<core::manifest> out;
  for (const auto& name : names_ending(sessions_, ".json")) {
    auto text = read_state_file(sessions_, name);
    auto m = text ? core::parse_manifest(text.value()) : core::result<core::manifest>(text.err());
    if (!m) {
      skipped.push_back(fmt::format("{}: {}", name, m.err().message));
      continue;
    }
    if (name != m->session_hash + ".json") {
      skipped.push_back(fmt::format("{}: sessionHash does not match the file name", name));
      continue;
    }
    out.push_back(std::move(m.value()));
  }
  return out;
}

std::optional<core::manifest> manifest_store::read(const std::string& hash) const {
  auto text = read_state_file(sessions_, hash + ".json");
  if (!text) return std::nullopt;
  auto m = core::parse_manifest(text.value());
  if (!m || m->session_hash != hash) return std::nullopt;
  return std::move(m.value());
}

namespace {

// temp file, fsync, rename, fsync of the directory (docs/design.md §11), all relative to the
// directory's descriptor. The temp file is always a new one (O_EXCL) and never a symlink's
// target (O_NOFOLLOW, and O_EXCL refuses any existing name): a stale one left by a crash is
// unlinked first, and whatever sits at the name when the open runs (a symlink planted to
// redirect the write, a directory) fails the write.
core::result<core::unit> write_atomic(const dir_handle& dir, const std::string& name,
                                      const std::string& data) {
  const int dfd = dir.fd();
  if (dfd < 0) return io_error("open", dir.path(), errno);
  const std::string tmp = name + ".tmp";
  const std::string tmp_path = dir.path() + "/" + tmp;
  ::unlinkat(dfd, tmp.c_str(), 0);  // a symlink itself goes, never its target
  int fd = ::openat(dfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("open", tmp_path, errno);
  if (!write_all(fd, data) || ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlinkat(dfd, tmp.c_str(), 0);
    return io_error("write", tmp_path, err);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlinkat(dfd, tmp.c_str(), 0);
    return io_error("close", tmp_path, err);
  }
  if (::renameat(dfd, tmp.c_str(), dfd, name.c_str()) != 0) {
    int err = errno;
    ::unlinkat(dfd, tmp.c_str(), 0);
    return io_error("rename", dir.path() + "/" + name, err);
  }
  ::fsync(dfd);  // the rename is durable only once the directory entry is
  return core::unit{};
}

}  // namespace

core::result<core::unit> manifest_store::write(const core::manifest& m) const {
  return write_atomic(sessions_, m.session_hash + ".json", core::to_json(m));
}

namespace {

// {"runtimeFingerprint": ..., "verdict": ..., "checkedAt": ...} and a newline.
std::string compatibility_json(const std::string& fingerprint, const std::string& verdict,
                               const std::string& checked_at) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "runtimeFingerprint", fingerprint);
  core::write_json_member(w, "verdict", verdict);
  core::write_json_member(w, "checkedAt", checked_at);
  w.EndObject();
  return std::string(sb.GetString(), sb.GetSize()) + "\n";
}

// The string `key` of a top-level object, if it has one.
std::optional<std::string_view> string_member(const rapidjson::Document& d, const char* key) {
  if (!d.IsObject()) return std::nullopt;
  const auto it = d.FindMember(key);
  if (it == d.MemberEnd() || !it->value.IsString()) return std::nullopt;
  return std::string_view(it->value.GetString(), it->value.GetStringLength());
}

}  // namespace

core::result<core::unit> manifest_store::write_compatibility(const std::string& fingerprint,
                                                             const std::string& verdict,
                                                             const std::string& checked_at) const {
  if (auto r = check_private_dir(state_dir_, true, true); !r) return r;
  return write_atomic(state_, "compatibility.json",
                      compatibility_json(fingerprint, verdict, checked_at));
}

// Anything but a record with a known verdict (no file, a file that does not parse or nests
// too deep) is "unknown".
manifest_store::compatibility_record manifest_store::read_compatibility_record() const {
  compatibility_record out;
  auto text = read_state_file(state_, "compatibility.json");
  rapidjson::Document d;
  if (!text || !core::parse_json_bounded(text.value(), d)) return out;
  const auto fingerprint = string_member(d, "runtimeFingerprint");
  const auto verdict = string_member(d, "verdict");
  if (!fingerprint) return out;
  for (const char* known : {"supported", "experimental", "broken"}) {
    if (verdict == known) {
      out.fingerprint = std::string(*fingerprint);
      out.verdict = known;
    }
  }
  return out;
}

namespace {

std::string behaviours_name(const std::string& fingerprint) {
  return "behaviour-" + fingerprint + ".json";
}

}  // namespace

std::vector<core::behaviour_signature> manifest_store::read_behaviours(
    const std::string& fingerprint) const {
  std::vector<core::behaviour_signature> out;
  auto text = read_state_file(state_, behaviours_name(fingerprint));
  rapidjson::Document d;
  if (!text || !core::parse_json_bounded(text.value(), d) || !d.IsObject()) return out;
  if (string_member(d, "runtimeFingerprint") != fingerprint) return out;
  const auto classes = d.FindMember("classes");
  if (classes == d.MemberEnd() || !classes->value.IsArray()) return out;
  for (const auto& c : classes->value.GetArray()) {
    if (out.size() == core::max_behaviour_classes || !c.IsArray()) break;
    core::behaviour_signature s;
    for (const auto& id : c.GetArray())
      if (id.IsInt64() && id.GetInt64() >= 0 && s.top.size() < core::behaviour_ranks)
        s.top.push_back(id.GetInt64());
    if (!s.top.empty()) out.push_back(std::move(s));
  }
  return out;
}

core::result<core::unit> manifest_store::write_behaviours(
    const std::string& fingerprint, const std::vector<core::behaviour_signature>& known) const {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "runtimeFingerprint", fingerprint);
  w.Key("classes");
  w.StartArray();
  // The newest classes are kept: an old one that comes back is probed as new again.
  const auto skip = known.size() > core::max_behaviour_classes
                        ? known.size() - core::max_behaviour_classes
                        : 0;
  for (std::size_t i = skip; i < known.size(); ++i) {
    w.StartArray();
    for (auto id : known[i].top) w.Int64(id);
    w.EndArray();
  }
  w.EndArray();
  w.EndObject();
  if (auto r = check_private_dir(state_dir_, true, true); !r) return r;
  return write_atomic(state_, behaviours_name(fingerprint),
                      std::string(sb.GetString(), sb.GetSize()) + "\n");
}

namespace {

// {"hints": [{"hint", "firstSeenAt", "effect", "fix"}...]} and a newline.
std::string hints_json(const std::vector<manifest_store::hint_record>& hints) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  w.Key("hints");
  w.StartArray();
  for (const auto& h : hints) {
    const auto& text = core::hint_text(h.hint);
    w.StartObject();
    core::write_json_member(w, "hint", text.id);
    core::write_json_member(w, "firstSeenAt", h.first_seen_at);
    core::write_json_member(w, "effect", text.effect);
    core::write_json_member(w, "fix", text.fix);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return std::string(sb.GetString(), sb.GetSize()) + "\n";
}

std::optional<manifest_store::hint_record> hint_of(const rapidjson::Value& v) {
  if (!v.IsObject()) return std::nullopt;
  const auto id = v.FindMember("hint"), at = v.FindMember("firstSeenAt");
  if (id == v.MemberEnd() || !id->value.IsString() || at == v.MemberEnd() || !at->value.IsString())
    return std::nullopt;
  const auto h = core::find_request_hint({id->value.GetString(), id->value.GetStringLength()});
  if (!h) return std::nullopt;
  return manifest_store::hint_record{*h, at->value.GetString()};
}

}  // namespace

core::result<core::unit> manifest_store::write_hints(const std::vector<hint_record>& hints) const {
  if (auto r = check_private_dir(state_dir_, true, true); !r) return r;
  return write_atomic(state_, "hints.json", hints_json(hints));
}

std::vector<manifest_store::hint_record> manifest_store::read_hints() const {
  std::vector<hint_record> out;
  auto text = read_state_file(state_, "hints.json");
  rapidjson::Document d;
  if (!text || !core::parse_json_bounded(text.value(), d) || !d.IsObject()) return out;
  const auto list = d.FindMember("hints");
  if (list == d.MemberEnd() || !list->value.IsArray()) return out;
  for (const auto& v : list->value.GetArray())
    if (auto h = hint_of(v); h && out.size() < core::hint_count) out.push_back(std::move(*h));
  return out;
}

void manifest_store::remove_hints() const {
  if (state_.fd() >= 0) ::unlinkat(state_.fd(), "hints.json", 0);
}

core::result<core::unit> manifest_store::write_learned_sleep(std::chrono::seconds period) const {
  if (auto r = check_private_dir(state_dir_, true, true); !r) return r;
  return write_atomic(state_, "sleep.json",
                      fmt::format("{{\"learnedSleepIdleSeconds\":{}}}\n", period.count()));
}

std::chrono::seconds manifest_store::read_learned_sleep() const {
  auto text = read_state_file(state_, "sleep.json");
  rapidjson::Document d;
  if (!text || !core::parse_json_bounded(text.value(), d) || !d.IsObject())
    return std::chrono::seconds(0);
  const auto v = d.FindMember("learnedSleepIdleSeconds");
  // Bounded: a day at most (llama-server's --sleep-idle-seconds is an int of seconds).
  if (v == d.MemberEnd() || !v->value.IsInt64() || v->value.GetInt64() <= 0 ||
      v->value.GetInt64() > 86'400)
    return std::chrono::seconds(0);
  return std::chrono::seconds(v->value.GetInt64());
}

core::result<core::unit> manifest_store::remove(const std::string& hash) const {
  const int dfd = sessions_.fd();
  if (dfd < 0) return io_error("open", sessions_dir_, errno);
  if (::unlinkat(dfd, (hash + ".json").c_str(), 0) != 0 && errno != ENOENT)
    return io_error("unlink", path_for(hash), errno);
  return core::unit{};
}

}  // namespace kvp::proxy
