// Tests for proxy/control/manifest_store.hpp: <state>/sessions/<hash>.json written atomically
// (docs/design.md §11), loaded strictly, removed on purge.
#include "proxy/control/manifest_store.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "core/json.hpp"
#include "tests/support/temp_dir.hpp"

namespace manifest_store_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

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

// Where a session's manifest lies: <state_dir>/sessions/<hash>.json.
std::string manifest_path(const manifest_store& store, const std::string& hash) {
  return store.dir() + "/" + hash + ".json";
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

// The verdict a store reads for `fingerprint` when its compatibility.json holds `text`.
std::string verdict_read_from(const std::string& text, const std::string& fingerprint) {
  temp_dir tmp;
  write_file(tmp.path() + "/compatibility.json", text);
  return manifest_store(tmp.path()).read_compatibility(fingerprint);
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
  const auto path = manifest_path(store, m.session_hash);
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
  const auto before = read_file(manifest_path(store, m.session_hash));

  // The temp file's name is taken by a directory, so the new version cannot be written.
  const auto tmp_path = manifest_path(store, m.session_hash) + ".tmp";
  fs::create_directory(tmp_path);
  m.tokens = 1;
  auto r = store.write(m);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == kvp::core::errc::metadata_io);
  CHECK(r.err().message.find(".tmp") != std::string::npos);
  CHECK(read_file(manifest_path(store, m.session_hash)) == before);
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
  write_file(manifest_path(store, corrupt_hash), "{\"schemaVersion\": 1, \"sessionId\": ");
  // A valid manifest under another session's name: never trusted.
  const auto renamed_hash = make_manifest("D").session_hash;
  write_file(manifest_path(store, renamed_hash), kvp::core::to_json(a));
  // Leftovers that are not manifests at all.
  write_file(manifest_path(store, make_manifest("E").session_hash) + ".tmp", kvp::core::to_json(b));
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
  CHECK(fs::exists(manifest_path(store, corrupt_hash)));
  CHECK(fs::exists(manifest_path(store, renamed_hash)));
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
  CHECK_FALSE(fs::exists(manifest_path(store, a.session_hash)));
  CHECK(fs::exists(manifest_path(store, b.session_hash)));
  CHECK(store.remove(a.session_hash).ok());
  std::vector<std::string> skipped;
  auto all = store.load_all(skipped);
  REQUIRE(all.size() == 1);
  CHECK(all[0].session_id == "B");
}

// Item 12: the state directory is writable by whoever runs kvpersist; nothing planted in it
// may redirect a write, block a read, or make one unbounded.
TEST_CASE("a symlink planted at the temp path is never followed", "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path() + "/state");
  REQUIRE(store.open().ok());
  const std::string outside = tmp.path() + "/outside";
  write_file(outside, "precious");
  auto m = make_manifest("A");
  const auto final_path = manifest_path(store, m.session_hash);
  SECTION("manifest") {
    fs::create_symlink(outside, final_path + ".tmp");
    REQUIRE(store.write(m).ok());
    CHECK(read_file(outside) == "precious");
    CHECK_FALSE(fs::is_symlink(final_path));
    CHECK(kvp::core::parse_manifest(read_file(final_path)).ok());
    CHECK_FALSE(fs::exists(fs::symlink_status(final_path + ".tmp")));
  }
  SECTION("compatibility.json") {
    const auto compat = tmp.path() + "/state/compatibility.json";
    fs::create_symlink(outside, compat + ".tmp");
    REQUIRE(store.write_compatibility("fp", "supported", "2025-06-01T12:00:00Z").ok());
    CHECK(read_file(outside) == "precious");
    CHECK_FALSE(fs::is_symlink(compat));
    CHECK(store.read_compatibility("fp") == "supported");
  }
}

TEST_CASE("manifests are read only from regular files of at most 1 MiB",
          "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  const auto a = make_manifest("A"), b = make_manifest("B"), c = make_manifest("C");
  REQUIRE(store.write(a).ok());
  // A symlink to an endless file, a FIFO nobody writes to (reading either used to never end),
  // and a file too large to be a manifest.
  fs::create_symlink("/dev/zero", manifest_path(store, b.session_hash));
  REQUIRE(::mkfifo(manifest_path(store, c.session_hash).c_str(), 0600) == 0);
  const auto big = make_manifest("D");
  write_file(manifest_path(store, big.session_hash), kvp::core::to_json(big));
  fs::resize_file(manifest_path(store, big.session_hash), (1 << 20) + 1);

  CHECK(store.read(a.session_hash));
  CHECK_FALSE(store.read(b.session_hash));
  CHECK_FALSE(store.read(c.session_hash));
  CHECK_FALSE(store.read(big.session_hash));
  std::vector<std::string> skipped;
  auto all = store.load_all(skipped);
  REQUIRE(all.size() == 1);
  CHECK(all[0].session_hash == a.session_hash);
  CHECK(skipped.size() == 3);  // reported, and left in place
}

TEST_CASE("a manifest nested a million levels deep is skipped, not a crash",
          "[proxy][manifest_store]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  REQUIRE(store.open().ok());
  const auto h = make_manifest("A").session_hash;
  write_file(manifest_path(store, h), std::string(1 << 20, '['));
  std::vector<std::string> skipped;
  CHECK(store.load_all(skipped).empty());
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0] == h + ".json: JSON nested deeper than 128 levels");
  CHECK_FALSE(store.read(h));
}

TEST_CASE("compatibility.json keeps its bytes and escapes what it writes",
          "[proxy][manifest_store][compatibility]") {
  temp_dir tmp;
  manifest_store store(tmp.path());
  const auto compat = tmp.path() + "/compatibility.json";
  REQUIRE(store.write_compatibility("fp", "supported", "2025-06-01T12:00:00Z").ok());
  CHECK(read_file(compat) ==
        "{\"runtimeFingerprint\":\"fp\",\"verdict\":\"supported\","
        "\"checkedAt\":\"2025-06-01T12:00:00Z\"}\n");
  REQUIRE(store.write_compatibility("f\"p\\\n", "broken", "2025-06-01T12:00:00Z").ok());
  rapidjson::Document d;
  CHECK(kvp::core::parse_json_bounded(read_file(compat), d).ok());
  CHECK(store.read_compatibility("f\"p\\\n") == "broken");
}

TEST_CASE("read_compatibility compares the parsed fields, not the text",
          "[proxy][manifest_store][compatibility]") {
  SECTION("other whitespace and key order") {
    const std::string text =
        "{ \"verdict\" : \"experimental\",\n  \"runtimeFingerprint\" : \"fp\" }";
    CHECK(verdict_read_from(text, "fp") == "experimental");
    CHECK(verdict_read_from(text, "f") == "unknown");
  }
  SECTION("the fingerprint and a verdict only inside another field") {
    const std::string text =
        "{\"runtimeFingerprint\":\"new\",\"verdict\":\"broken\",\"previous\":"
        "{\"runtimeFingerprint\":\"fp\",\"verdict\":\"supported\"}}";
    CHECK(verdict_read_from(text, "fp") == "unknown");
    CHECK(verdict_read_from(text, "new") == "broken");
  }
  SECTION("a verdict that is not one of the three") {
    CHECK(verdict_read_from("{\"runtimeFingerprint\":\"fp\",\"verdict\":\"supported!\"}", "fp") ==
          "unknown");
    CHECK(verdict_read_from("{\"runtimeFingerprint\":\"fp\",\"verdict\":1}", "fp") == "unknown");
  }
}

TEST_CASE("a compatibility.json that is deep or garbage is no record, not a crash",
          "[proxy][manifest_store][compatibility]") {
  const std::string record = "{\"runtimeFingerprint\":\"fp\",\"verdict\":\"supported\"}";
  std::string nul_inside = record;
  nul_inside.insert(nul_inside.find(','), 1, '\0');
  for (const std::string& text :
       {std::string(1 << 20, '['), std::string(1 << 19, '[') + record, std::string("\xff\xfe{"),
        record + " trailing", record.substr(0, record.size() - 1), std::string("[") + record + "]",
        nul_inside, std::string()})
    CHECK(verdict_read_from(text, "fp") == "unknown");
}

TEST_CASE("hints.json round-trips the hints and names the fix", "[proxy][manifest_store][hints]") {
  temp_dir tmp;
  const manifest_store store(tmp.path());
  CHECK(store.read_hints().empty());  // no file
  REQUIRE(store.write_hints({{kvp::core::hint_id::attribution_header, "2025-06-01T12:00:00Z"}}));
  const auto back = store.read_hints();
  REQUIRE(back.size() == 1);
  CHECK(back[0].hint == kvp::core::hint_id::attribution_header);
  CHECK(back[0].first_seen_at == "2025-06-01T12:00:00Z");
  CHECK(read_file(tmp.path() + "/hints.json").find("CLAUDE_CODE_ATTRIBUTION_HEADER=0") !=
        std::string::npos);
  store.remove_hints();
  CHECK_FALSE(fs::exists(tmp.path() + "/hints.json"));
  store.remove_hints();  // absent: nothing to do
}

TEST_CASE("hints.json entries kvpersist does not know, or garbage, are no hints",
          "[proxy][manifest_store][hints]") {
  temp_dir tmp;
  const manifest_store store(tmp.path());
  write_file(tmp.path() + "/hints.json",
             R"({"hints":[{"hint":"someday","firstSeenAt":"x"},{"hint":"attribution_header"},)"
             R"({"hint":"attribution_header","firstSeenAt":"t"},7]})");
  const auto read = store.read_hints();
  REQUIRE(read.size() == 1);
  CHECK(read[0].first_seen_at == "t");
  for (const char* text : {"", "{", "[]", R"({"hints":{}})", R"({"hints":[[[[]]]]})"}) {
    write_file(tmp.path() + "/hints.json", text);
    CHECK(store.read_hints().empty());
  }
}

}  // namespace manifest_store_test
