// Tests for proxy/manifest_store.hpp: <state>/sessions/<hash>.json written atomically
// (spec §40), loaded strictly, removed on purge.
#include "proxy/manifest_store.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using kvp::core::manifest;
using kvp::proxy::manifest_store;
using kvp::testing::read_file;
using kvp::testing::temp_dir;
using kvp::testing::write_file;

manifest make_manifest(const std::string& session, std::uint64_t tokens = 2124) {
  manifest m;
  m.session_id = session;
  m.session_hash = kvp::core::session_hash("default", "/models/m.gguf", session);
  m.instance_key = "default";
  m.model_id = "/models/m.gguf";
  m.runtime_fingerprint = kvp::core::sha256_hex("rt");
  m.generation = 'a';
  m.tokens = tokens;
  m.bytes = tokens * 1024;
  m.revision = 1;
  m.created_at = m.updated_at = "2025-06-01T12:00:00Z";
  return m;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("open creates the sessions directory, private to the user", "[proxy][manifest_store]") {
  temp_dir tmp;
  const auto state = tmp.path() + "/state";
  manifest_store store(state);
  REQUIRE(store.open().ok());
  CHECK(store.dir() == state + "/sessions");
  CHECK(fs::is_directory(store.dir()));
  CHECK(mode_of(state) == 0700);
  CHECK(mode_of(store.dir()) == 0700);
  CHECK(store.open().ok());  // idempotent
}

TEST_CASE("open reports a state directory that cannot be created", "[proxy][manifest_store]") {
  temp_dir tmp;
  write_file(tmp.path() + "/file", "x");
  manifest_store store(tmp.path() + "/file");
  auto r = store.open();
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == kvp::core::errc::metadata_io);
}

TEST_CASE("write replaces the manifest atomically with mode 0600", "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  auto m = make_manifest("A");
  const auto path = store.path_for(m.session_hash);
  CHECK(path == tmp.path() + "/sessions/" + m.session_hash + ".json");

  REQUIRE(store.write(m).ok());
  CHECK(read_file(path) == kvp::core::to_json(m));
  CHECK(mode_of(path) == 0600);
  CHECK(dir_entries(store.dir()) == std::vector<std::string>{m.session_hash + ".json"});

  m.generation = 'b';
  m.tokens = 4000;
  m.revision = 2;
  REQUIRE(store.write(m).ok());
  CHECK(read_file(path) == kvp::core::to_json(m));
  CHECK(mode_of(path) == 0600);
  CHECK(dir_entries(store.dir()) == std::vector<std::string>{m.session_hash + ".json"});
}

TEST_CASE("a failed write leaves the previous manifest untouched", "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  auto m = make_manifest("A");
  REQUIRE(store.write(m).ok());
  const auto before = read_file(store.path_for(m.session_hash));

  // The temp file's name is taken by a directory, so the new version cannot be written.
  const auto tmp_path = store.path_for(m.session_hash) + ".tmp";
  fs::create_directory(tmp_path);
  m.tokens = 1;
  auto r = store.write(m);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == kvp::core::errc::metadata_io);
  CHECK(r.err().message.find(".tmp") != std::string::npos);
  CHECK(read_file(store.path_for(m.session_hash)) == before);
}

TEST_CASE("load_all returns valid manifests and reports the others", "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  const auto a = make_manifest("A", 100);
  const auto b = make_manifest("B", 200);
  REQUIRE(store.write(a).ok());
  REQUIRE(store.write(b).ok());

  const auto corrupt_hash = make_manifest("C").session_hash;
  write_file(store.path_for(corrupt_hash), "{\"schemaVersion\": 1, \"sessionId\": ");
  // A valid manifest under another session's name: never trusted.
  const auto renamed_hash = make_manifest("D").session_hash;
  write_file(store.path_for(renamed_hash), kvp::core::to_json(a));
  // Leftovers that are not manifests at all.
  write_file(store.path_for(make_manifest("E").session_hash) + ".tmp", kvp::core::to_json(b));
  write_file(store.dir() + "/README", "hello");
  fs::create_directory(store.dir() + "/nested.json");

  std::vector<std::string> skipped;
  auto all = store.load_all(skipped);
  std::sort(all.begin(), all.end(),
            [](const manifest& x, const manifest& y) { return x.tokens < y.tokens; });
  REQUIRE(all.size() == 2);
  CHECK(all[0].session_id == "A");
  CHECK(all[0].tokens == 100);
  CHECK(all[1].session_id == "B");
  CHECK(all[1].tokens == 200);

  REQUIRE(skipped.size() == 2);
  std::sort(skipped.begin(), skipped.end());
  auto starts_with = [](const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; };
  std::vector<std::string> expected_prefixes = {corrupt_hash + ".json: ", renamed_hash + ".json: "};
  std::sort(expected_prefixes.begin(), expected_prefixes.end());
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(skipped[i]);
    CHECK(starts_with(skipped[i], expected_prefixes[i]));
  }
  const auto& renamed_msg = skipped[0].rfind(renamed_hash, 0) == 0 ? skipped[0] : skipped[1];
  CHECK(renamed_msg.find("does not match") != std::string::npos);

  // Skipped files stay where they are.
  CHECK(fs::exists(store.path_for(corrupt_hash)));
  CHECK(fs::exists(store.path_for(renamed_hash)));
}

TEST_CASE("load_all on a missing directory is empty", "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path() + "/never-opened");
  std::vector<std::string> skipped;
  CHECK(store.load_all(skipped).empty());
  CHECK(skipped.empty());
}

TEST_CASE("remove deletes the manifest, and a missing one is not an error",
          "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  const auto a = make_manifest("A");
  const auto b = make_manifest("B");
  REQUIRE(store.write(a).ok());
  REQUIRE(store.write(b).ok());
  REQUIRE(store.remove(a.session_hash).ok());
  CHECK_FALSE(fs::exists(store.path_for(a.session_hash)));
  CHECK(fs::exists(store.path_for(b.session_hash)));
  CHECK(store.remove(a.session_hash).ok());
  std::vector<std::string> skipped;
  auto all = store.load_all(skipped);
  REQUIRE(all.size() == 1);
  CHECK(all[0].session_id == "B");
}
