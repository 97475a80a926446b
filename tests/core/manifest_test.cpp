// Tests for core/manifest.hpp: the JSON written per session and the strict parser that
// guards restores (docs/design.md §11, §9: a manifest that does not parse costs a cold prefill).
#include "core/manifest.hpp"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <utility>

#include "core/identity.hpp"

namespace manifest_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

manifest sample() {
  manifest m;
  m.session_id = "sess \"quoted\"\n\xc3\xbc";
  m.session_hash = session_hash("default", "/models/m.gguf", m.session_id);
  m.instance_key = "default";
  m.model_id = "/models/m.gguf";
  m.runtime_fingerprint = sha256_hex("runtime");
  m.generation = 'b';
  m.tokens = 2124;
  m.bytes = 4384076;
  m.revision = 17;
  m.compatibility = "supported";
  m.created_at = "2025-06-01T12:00:00Z";
  m.updated_at = "2025-06-01T12:34:56Z";
  m.save_ms = 1.011;
  return m;
}

rapidjson::Document dom(const std::string& json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  REQUIRE_FALSE(d.HasParseError());
  return d;
}

std::string serialize(const rapidjson::Document& d) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  d.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

// The sample's JSON with one member replaced by `value` (a JSON literal) or removed.
std::string with_member(const char* key, const char* value_json) {
  auto d = dom(to_json(sample()));
  d.RemoveMember(key);
  if (value_json) {
    rapidjson::Document v(&d.GetAllocator());
    v.Parse(value_json);
    REQUIRE_FALSE(v.HasParseError());
    d.AddMember(rapidjson::Value(key, d.GetAllocator()), rapidjson::Value(v, d.GetAllocator()),
                d.GetAllocator());
  }
  return serialize(d);
}

void require_rejected(const std::string& json) {
  CAPTURE(json);
  auto r = parse_manifest(json);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::manifest_invalid);
  CHECK_FALSE(r.err().message.empty());
}

// Requires the sample with each (key, JSON literal) member in turn replaced to be rejected.
void require_rejected_members(std::initializer_list<std::pair<const char*, std::string>> members) {
  for (const auto& [key, value] : members) require_rejected(with_member(key, value.c_str()));
}

}  // namespace

TEST_CASE("a manifest survives a JSON round trip", "[core][manifest]") {
  const auto m = sample();
  const auto json = to_json(m);
  CHECK(json.back() == '\n');

  auto d = dom(json);
  CHECK(d["schemaVersion"].GetInt() == 1);
  CHECK(std::string(d["snapshotFile"].GetString()) == m.session_hash + ".b.bin");
  CHECK(std::string(d["state"].GetString()) == "ready");
  CHECK_FALSE(d.HasMember("invalidReason"));

  auto r = parse_manifest(json);
  REQUIRE(r.ok());
  const auto& p = r.value();
  CHECK(p.session_id == m.session_id);
  CHECK(p.session_hash == m.session_hash);
  CHECK(p.instance_key == m.instance_key);
  CHECK(p.model_id == m.model_id);
  CHECK(p.runtime_fingerprint == m.runtime_fingerprint);
  CHECK(p.generation == 'b');
  CHECK(p.tokens == 2124);
  CHECK(p.bytes == 4384076);
  CHECK(p.revision == 17);
  CHECK(p.state == snapshot_state::ready);
  CHECK(p.invalid_reason.empty());
  CHECK(p.compatibility == "supported");
  CHECK(p.created_at == m.created_at);
  CHECK(p.updated_at == m.updated_at);
  CHECK(p.save_ms == 1.011);
  CHECK(p.snapshot_file() == m.snapshot_file());
  CHECK(to_json(p) == json);
}

TEST_CASE("an invalid manifest keeps its reason", "[core][manifest]") {
  auto m = sample();
  m.state = snapshot_state::invalid;
  m.invalid_reason = "KV_SNAPSHOT_CORRUPT";
  const auto json = to_json(m);
  CHECK(std::string(dom(json)["invalidReason"].GetString()) == "KV_SNAPSHOT_CORRUPT");
  auto r = parse_manifest(json);
  REQUIRE(r.ok());
  CHECK(r->state == snapshot_state::invalid);
  CHECK(r->invalid_reason == "KV_SNAPSHOT_CORRUPT");
  CHECK_FALSE(dom(json).HasMember("invalidNote"));  // only when an operator gave one
}

TEST_CASE("an operator's invalidation note survives a round trip", "[core][manifest]") {
  auto m = sample();
  m.state = snapshot_state::invalid;
  m.invalid_reason = "KV_OPERATOR_INVALIDATED";
  m.invalid_note = "model file replaced";
  const auto json = to_json(m);
  CHECK(std::string(dom(json)["invalidNote"].GetString()) == "model file replaced");
  auto r = parse_manifest(json);
  REQUIRE(r.ok());
  CHECK(r->invalid_note == "model file replaced");
  CHECK(to_json(r.value()) == json);
}

TEST_CASE("next_generation alternates and never names the current file", "[core][manifest]") {
  manifest m;
  m.generation = 'a';
  CHECK(m.next_generation() == 'b');
  m.generation = 'b';
  CHECK(m.next_generation() == 'a');
}

TEST_CASE("parse_manifest rejects what it did not write", "[core][manifest]") {
  SECTION("another schema version") {
    require_rejected_members({
        {"schemaVersion", "2"},
        {"schemaVersion", "0"},
        {"schemaVersion", "\"1\""},
    });
    require_rejected(with_member("schemaVersion", nullptr));
  }
  SECTION("a missing required key") {
    for (const char* key :
         {"sessionId", "sessionHash", "instanceKey", "modelId", "runtimeFingerprint", "generation",
          "tokens", "bytes", "revision", "state", "createdAt", "updatedAt"}) {
      CAPTURE(key);
      require_rejected(with_member(key, nullptr));
    }
  }
  SECTION("a mistyped key") {
    require_rejected_members({
        {"tokens", "\"2124\""},
        {"tokens", "-1"},
        {"bytes", "1.5"},
        {"revision", "null"},
        {"sessionId", "42"},
    });
  }
  SECTION("a count above 2^53: a revision near 2^64 would wrap the dirty counter") {
    require_rejected_members({
        {"revision", "18446744073709551615"},
        {"revision", "9007199254740993"},
        {"tokens", "18446744073709551615"},
        {"bytes", "18446744073709551615"},
    });
    CHECK(parse_manifest(with_member("revision", "9007199254740992")).ok());
  }
  SECTION("a member nested deeper than json_max_depth (the parse must not overflow the stack)") {
    const std::string json = to_json(sample());
    const std::string deep = json.substr(0, json.find_last_of('}')) + ",\"x\":" +
                             std::string(300'000, '[') + std::string(300'000, ']') + "}";
    auto r = parse_manifest(deep);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::manifest_invalid);
    CHECK(r.err().message == "JSON nested deeper than 128 levels");
  }
  SECTION("a hash that is not 64 lower-case hex digits") {
    const auto h = sample().session_hash;
    require_rejected_members({
        {"sessionHash", "\"" + h.substr(1) + "\""},
        {"sessionHash", "\"" + h + "0\""},
        {"sessionHash", "\"" + std::string(64, 'A') + "\""},
        {"sessionHash", "\"" + std::string(64, 'g') + "\""},
        {"sessionHash", "\"../../" + std::string(58, 'a') + "\""},
    });
  }
  SECTION("a generation other than a or b") {
    require_rejected_members({
        {"generation", "\"c\""},
        {"generation", "\"\""},
        {"generation", "\"ab\""},
        {"generation", "\"A\""},
    });
  }
  SECTION("an unknown state") {
    require_rejected_members({
        {"state", "\"READY\""},
        {"state", "\"deleted\""},
    });
  }
  SECTION("garbage") {
    require_rejected("");
    require_rejected("not json");
    require_rejected("[]");
    require_rejected("null");
    require_rejected("{}");
    require_rejected(std::string("\0\0\0\0", 4));
  }
  SECTION("every truncation of a valid manifest") {
    const auto json = to_json(sample());
    // The last byte is the trailing newline: without it the JSON is still complete.
    const auto end = json.find_last_of('}');
    for (std::size_t n = 0; n < end; ++n) {
      auto r = parse_manifest(std::string_view(json).substr(0, n));
      if (r.ok()) FAIL("a manifest truncated to " << n << " bytes parsed");
    }
    CHECK(parse_manifest(std::string_view(json).substr(0, end + 1)).ok());
  }
}

TEST_CASE("parse_manifest tolerates what it does not need", "[core][manifest]") {
  SECTION("no compatibility or saveMs") {
    auto r = parse_manifest(with_member("compatibility", nullptr));
    REQUIRE(r.ok());
    CHECK(r->compatibility == "unknown");
    auto r2 = parse_manifest(with_member("saveMs", nullptr));
    REQUIRE(r2.ok());
    CHECK(r2->save_ms == 0);
  }
  SECTION("an unknown extra key") {
    auto r = parse_manifest(with_member("futureField", "{\"x\":1}"));
    REQUIRE(r.ok());
    CHECK(r->tokens == 2124);
  }
}

TEST_CASE("a snapshot checksum survives a round trip; a manifest without one has none",
          "[core][manifest][checksum]") {
  auto m = sample();
  CHECK(parse_manifest(to_json(m))->checksum.empty());
  CHECK_FALSE(dom(to_json(m)).HasMember("checksum"));
  m.checksum = "xxh3-128:0123456789abcdef0123456789abcdef";
  const auto json = to_json(m);
  CHECK(std::string(dom(json)["checksum"].GetString()) == m.checksum);
  auto r = parse_manifest(json);
  REQUIRE(r.ok());
  CHECK(r->checksum == m.checksum);
  CHECK(to_json(r.value()) == json);
}

TEST_CASE("a manifest whose checksum is not one is refused, never restored unchecked",
          "[core][manifest][checksum]") {
  require_rejected_members({
      {"checksum", "42"},
      {"checksum", "\"\""},
      {"checksum", "\"xxh3-128:\""},
      {"checksum", "\"xxh3-128:0123456789abcdef0123456789abcde\""},    // 31 digits
      {"checksum", "\"xxh3-128:0123456789abcdef0123456789abcdef0\""},  // 33 digits
      {"checksum", "\"xxh3-128:0123456789ABCDEF0123456789abcdef\""},   // not lowercase
      {"checksum", "\"sha256:0123456789abcdef0123456789abcdef\""},
  });
}

// docs/design.md §12, "Disk budget": both generation files count; a manifest written before
// previousBytes counts its other generation as large as the named one.
TEST_CASE("previousBytes survives a round trip; without it the other file counts as `bytes`",
          "[core][manifest]") {
  auto m = sample();
  m.previous_bytes = 4000000;
  auto r = parse_manifest(to_json(m));
  REQUIRE(r.ok());
  CHECK(r.value().previous_bytes == 4000000u);
  CHECK(r.value().disk_bytes() == 8384076u);
  auto old = parse_manifest(with_member("previousBytes", nullptr));
  REQUIRE(old.ok());
  CHECK(old.value().previous_bytes == sample().bytes);
  require_rejected(with_member("previousBytes", "-1"));
  require_rejected(with_member("previousBytes", "\"12\""));
}

}  // namespace manifest_test
