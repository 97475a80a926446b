// Tests for proxy/control/snapshot_files.hpp (checksums, docs/design.md §9) and proxy/control/private_dir.hpp
// (the state directory's owner and mode, descriptors opened once, docs/design.md §11).
#include "proxy/control/snapshot_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "core/errc.hpp"
#include "core/identity.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/private_dir.hpp"
#include "tests/support/temp_dir.hpp"

namespace snapshot_files_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

namespace fs = std::filesystem;
using kvp::core::errc;
using kvp::proxy::check_private_dir;
using kvp::proxy::snapshot_files;
using kvp::testing::read_file;
using kvp::testing::temp_dir;
using kvp::testing::write_file;

std::string checksum_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  auto sum = kvp::proxy::snapshot_checksum(fd);
  ::close(fd);
  REQUIRE(sum.ok());
  return sum.value();
}

// A snapshot-sized file of `n` bytes that are not all alike.
std::string snapshot_bytes(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + 7) & 0xFF);
  return s;
}

}  // namespace

TEST_CASE("snapshot_checksum is XXH3-128 of the file's bytes", "[proxy][snapshot_files]") {
  temp_dir tmp;
  write_file(tmp.path() + "/empty", "");
  write_file(tmp.path() + "/abc", "abc");
  // XXH3-128 reference digests (xxhsum -H2)
  CHECK(checksum_of(tmp.path() + "/empty") == "xxh3-128:99aa06d3014798d86001c324468d497f");
  CHECK(checksum_of(tmp.path() + "/abc") == "xxh3-128:06b05ab6733a618578af5f94892f3950");
}

TEST_CASE("a sealed snapshot verifies; one flipped byte, another size or a missing file does not",
          "[proxy][snapshot_files]") {
  temp_dir tmp;
  const snapshot_files files(tmp.path());
  const std::string name = "f.a.bin";
  const auto data = snapshot_bytes(3 << 20);  // three read buffers
  write_file(tmp.path() + "/" + name, data);
  auto sealed = files.seal(name, data.size());
  REQUIRE(sealed.ok());
  CHECK(sealed.value() == checksum_of(tmp.path() + "/" + name));
  CHECK(files.verify(name, data.size(), sealed.value()).ok());

  SECTION("a byte in the middle changed, same size") {
    auto bad = data;
    bad[bad.size() / 2] ^= 0x01;
    write_file(tmp.path() + "/" + name, bad);
    auto r = files.verify(name, data.size(), sealed.value());
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::snapshot_corrupt);
    CHECK(r.err().http_status == 0);  // checked before llama-server: the slot is untouched
  }
  SECTION("truncated") {
    write_file(tmp.path() + "/" + name, data.substr(0, data.size() / 2));
    CHECK(files.verify(name, data.size(), sealed.value()).err().code == errc::snapshot_corrupt);
  }
  SECTION("missing") {
    fs::remove(tmp.path() + "/" + name);
    CHECK(files.verify(name, data.size(), sealed.value()).err().code == errc::snapshot_not_found);
  }
  SECTION("no checksum recorded (a manifest from before checksums): the size alone") {
    CHECK(files.verify(name, data.size(), "").ok());
  }
  SECTION("seal refuses a size other than llama-server's n_written") {
    CHECK(files.seal(name, data.size() + 1).err().code == errc::save_failed);
  }
}

TEST_CASE("a symlink at a snapshot's name is neither sealed, verified, sized nor deleted through",
          "[proxy][snapshot_files]") {
  temp_dir tmp;
  fs::create_directory(tmp.path() + "/slots");
  const snapshot_files files(tmp.path() + "/slots");
  const auto hash = kvp::core::sha256_hex("s");
  const auto name = kvp::core::snapshot_filename(hash, 'a');
  const auto outside = tmp.path() + "/outside.bin";
  write_file(outside, "not a snapshot of this directory");
  fs::create_symlink(outside, tmp.path() + "/slots/" + name);

  CHECK(files.seal(name, 32).err().code == errc::save_failed);
  CHECK(files.verify(name, 32, "").err().code == errc::snapshot_corrupt);
  CHECK_FALSE(files.size(name).has_value());
  CHECK(files.remove(hash) == 0);
  CHECK(read_file(outside) == "not a snapshot of this directory");
}

TEST_CASE("a private directory is created 0700 and accepted", "[proxy][private_dir]") {
  temp_dir tmp;
  const auto dir = tmp.path() + "/a/b";
  REQUIRE(check_private_dir(dir, true, false).ok());
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  ::chmod(dir.c_str(), 0755);  // readable by others, writable by nobody else: fine
  CHECK(check_private_dir(dir, false, false).ok());
}

TEST_CASE("a directory others can write, or a symlink, is refused with the path and mode",
          "[proxy][private_dir]") {
  temp_dir tmp;
  const auto dir = tmp.path() + "/state";
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  for (mode_t mode : {0777, 0770, 0702, 01777}) {
    CAPTURE(mode);
    REQUIRE(::chmod(dir.c_str(), mode) == 0);
    auto r = check_private_dir(dir, true, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::metadata_io);
    CHECK(r.err().message.find(dir) != std::string::npos);
    CHECK(r.err().message.find(fmt::format("mode {:04o}", mode)) != std::string::npos);
  }
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  fs::create_directory_symlink(dir, tmp.path() + "/link");
  CHECK(check_private_dir(tmp.path() + "/link", false, true).ok());  // the operator's own path
  auto r = check_private_dir(tmp.path() + "/link", false, false);    // one kvpersist names
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().message.find("symlink") != std::string::npos);
}

TEST_CASE("a directory owned by another account is refused, naming its owner",
          "[proxy][private_dir]") {
  if (::geteuid() != 0) {
    WARN("not run: needs root to chown");
    return;
  }
  temp_dir tmp;
  const auto dir = tmp.path() + "/state";
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  auto r = check_private_dir(dir, false, true);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().message.find("owner uid 65534") != std::string::npos);
}

TEST_CASE("manifests go to the sessions directory opened first, not to a symlink swapped in",
          "[proxy][manifest_store][private_dir]") {
  temp_dir tmp;
  kvp::proxy::manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  kvp::core::manifest m;
  m.session_id = "A";
  m.session_hash = kvp::core::sha256_hex("A");
  m.instance_key = "default";
  m.model_id = "m";
  m.runtime_fingerprint = kvp::core::sha256_hex("rt");
  m.created_at = m.updated_at = "2025-06-01T12:00:00Z";
  REQUIRE(store.write(m).ok());
  // Another account swaps sessions/ for a symlink to its own directory.
  fs::rename(tmp.path() + "/sessions", tmp.path() + "/sessions.kept");
  fs::create_directory(tmp.path() + "/theirs");
  fs::create_directory_symlink(tmp.path() + "/theirs", tmp.path() + "/sessions");
  m.tokens = 7;
  REQUIRE(store.write(m).ok());
  CHECK(fs::is_empty(tmp.path() + "/theirs"));
  CHECK(read_file(tmp.path() + "/sessions.kept/" + m.session_hash + ".json") ==
        kvp::core::to_json(m));
  REQUIRE(store.read(m.session_hash).has_value());
  CHECK(store.read(m.session_hash)->tokens == 7);
}

TEST_CASE("checksum speed on a 512 MiB snapshot in the page cache",
          "[proxy][snapshot_files][.cost]") {
  temp_dir tmp;
  const snapshot_files files(tmp.path());
  const auto data = snapshot_bytes(std::size_t{512} << 20);
  write_file(tmp.path() + "/big.a.bin", data);
  const auto sum = files.seal("big.a.bin", data.size());  // also warms the page cache
  REQUIRE(sum.ok());
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(files.verify("big.a.bin", data.size(), sum.value()).ok());
  const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
  WARN("verify (read + XXH3-128) of " << (data.size() >> 20) << " MiB: " << s.count() * 1000
                                      << " ms, " << (data.size() >> 20) / s.count() << " MiB/s");
}

}  // namespace snapshot_files_test
