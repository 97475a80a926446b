// Tests for core/identity.hpp: SHA-256, session keys, snapshot filenames (docs/design.md §3,
// invariant 9) and the runtime fingerprint (docs/design.md §4).
#include "core/identity.hpp"

#include <algorithm>
#include <catch2/catch.hpp>

#include <iterator>
#include <set>
#include <string>
#include <utility>

#include "tests/support/runtime.hpp"

namespace identity_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

runtime_info base_runtime() {
  runtime_info rt = kvp::testing::qwen7b_runtime();
  rt.runtime_key = "qwen7b-f16kv";
  rt.model_ftype = "Q4_K_M";
  rt.prompt_format = std::string(64, 'a');
  rt.model_meta = "n_ctx=8192;n_vocab=152064;";
  rt.lora_adapters = "0,/models/lora.gguf,0.5;";
  return rt;
}

}  // namespace

TEST_CASE("sha256_hex matches the FIPS 180-2 test vectors", "[core][identity]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Embedded NUL bytes are data, not terminators.
  CHECK(sha256_hex(std::string_view("a\0b", 3)) != sha256_hex("a"));
}

TEST_CASE("session_hash is stable and separates instance, model and session", "[core][identity]") {
  const auto h = session_hash("default", "/models/m.gguf", "conv-1");
  CHECK(h.size() == 64);
  CHECK(is_lower_hex(h));
  CHECK(h == session_hash("default", "/models/m.gguf", "conv-1"));
  CHECK(h != session_hash("other", "/models/m.gguf", "conv-1"));
  CHECK(h != session_hash("default", "/models/n.gguf", "conv-1"));
  CHECK(h != session_hash("default", "/models/m.gguf", "conv-2"));
  CHECK(h != sha256_hex("conv-1"));  // not a bare hash of the id
  // docs/design.md §20: a credential scopes the session; none keeps the old derivation.
  CHECK(session_hash("default", "/models/m.gguf", "conv-1", "") == h);
  CHECK(session_hash("default", "/models/m.gguf", "conv-1", "k1") != h);
  CHECK(session_hash("default", "/models/m.gguf", "conv-1", "k1") !=
        session_hash("default", "/models/m.gguf", "conv-1", "k2"));

  SECTION("length-prefixed fields: moving a boundary changes the key") {
    CHECK(session_hash("ab", "c", "x") != session_hash("a", "bc", "x"));
    CHECK(session_hash("i", "ab", "c") != session_hash("i", "a", "bc"));
    CHECK(session_hash("i", "m", "") != session_hash("i", "", "m"));
    // Separator look-alikes inside values cannot forge another field layout.
    CHECK(session_hash("a;1:b", "c", "d") != session_hash("a", "b", "c;1:d"));
    CHECK(session_hash("", "", "") != session_hash("", "", ";"));
  }
}

TEST_CASE("a session id over 256 bytes is kept as its digest", "[core][identity]") {
  const std::string at_cap(max_session_id_bytes, 'k');
  CHECK(bounded_session_id(at_cap) == at_cap);
  CHECK(bounded_session_id("A") == "A");
  const std::string over = at_cap + "x";
  CHECK(bounded_session_id(over) == "sha256:" + sha256_hex(over));
  const std::string header_sized(64 * 1024, 'k');
  CHECK(bounded_session_id(header_sized).size() == 7 + 64);
  CHECK(bounded_session_id(header_sized) != bounded_session_id(header_sized + "k"));
  CHECK(bounded_session_id(header_sized) == bounded_session_id(std::string(64 * 1024, 'k')));
}

TEST_CASE("a client's session id in kvpersist's own namespace is kept as its digest",
          "[core][identity]") {
  const std::string own = std::string(own_session_id_head) + std::string(32, 'a');
  CHECK(bounded_session_id(own) == "sha256:" + sha256_hex(own));
  CHECK(bounded_session_id(own) != own);
  CHECK(bounded_session_id("prefi:x") == "prefi:x");
  CHECK(bounded_session_id("my-prefix:x") == "my-prefix:x");
}

TEST_CASE("snapshot filenames are 64 hex digits and a generation, never the raw id",
          "[core][identity]") {
  const std::string hostile[] = {
      "conv-1",
      "../../etc/passwd",
      "..",
      "a/b\\c",
      std::string("nul\0inside", 10),
      " leading and trailing ",
      std::string(10 * 1024, 'x'),
      "\xff\xfe\r\n",
  };
  std::set<std::string> names;
  for (const auto& id : hostile) {
    CAPTURE(id.size());
    const auto h = session_hash("default", "/models/m.gguf", id);
    for (char gen : {'a', 'b'}) {
      const auto f = snapshot_filename(h, gen);
      CHECK(f.size() == 70);
      CHECK(is_lower_hex(std::string_view(f).substr(0, 64)));
      CHECK(std::string_view(f).substr(64) == std::string(".") + gen + ".bin");
      CHECK(f.find('/') == std::string::npos);
      CHECK(f.find("..") == std::string::npos);
      CHECK(f.find('\0') == std::string::npos);
      if (id.size() >= 3) CHECK(f.find(id) == std::string::npos);
      names.insert(f);
    }
  }
  CHECK(names.size() == 2 * std::size(hostile));  // all distinct
  CHECK(abbrev(session_hash("default", "/models/m.gguf", "conv-1")).size() == 8);
}

TEST_CASE("the runtime fingerprint ignores the epoch marker and nothing else", "[core][identity]") {
  const auto base = base_runtime();
  const auto fp = base.fingerprint();
  CHECK(fp.size() == 64);
  CHECK(is_lower_hex(fp));
  CHECK(fp == base_runtime().fingerprint());

  auto rt = base;
  SECTION("media_marker is an epoch, not identity") {
    rt.media_marker = "<__media_2__>";
    CHECK(rt.fingerprint() == fp);
  }
  SECTION("sleeping is a state, not identity") {
    rt.sleeping = true;
    CHECK(rt.fingerprint() == fp);
  }
  SECTION("every other field is identity") {
    const std::pair<const char*, void (*)(runtime_info&)> changes[] = {
        {"model file type", [](runtime_info& r) { r.model_ftype = "Q8_0"; }},
        {"prompt format (chat templates, special tokens)",
         [](runtime_info& r) { r.prompt_format = std::string(64, 'b'); }},
        {"model metadata", [](runtime_info& r) { r.model_meta = "n_ctx=8192;n_vocab=151936;"; }},
        {"LoRA adapters and their scales",
         [](runtime_info& r) { r.lora_adapters = "0,/models/lora.gguf,1;"; }},
        {"runtime_key", [](runtime_info& r) { r.runtime_key = "qwen7b-q8kv"; }},
        {"build", [](runtime_info& r) { r.build_info = "b6124-1234567"; }},
        {"model", [](runtime_info& r) { r.model_path = "/models/other.gguf"; }},
        {"n_ctx", [](runtime_info& r) { r.n_ctx = 4096; }},
        {"slots", [](runtime_info& r) { r.total_slots = 2; }},
        {"behaviour class, once known", [](runtime_info& r) { r.behaviour = "0123456789abcdef"; }},
    };
    for (const auto& [field, change] : changes) {
      CAPTURE(field);
      auto changed = base;
      change(changed);
      CHECK(changed.fingerprint() != fp);
    }
  }
  SECTION("fields cannot be traded against each other") {
    auto x = base;
    auto y = base;
    x.model_path = "m1";
    x.build_info = "b";
    y.model_path = "m";
    y.build_info = "1b";
    CHECK(x.fingerprint() != y.fingerprint());
  }
}

// Golden values: every manifest and snapshot file on disk is named by these derivations. The
// digests were computed independently (Python hashlib over the documented length-prefixed
// layout), so a change to the layout, the tag or a field fails here. If a derivation must
// change, follow docs/design.md §11 ("Changing an identity derivation") before updating them.
TEST_CASE("identity derivations are pinned to golden digests", "[core][identity][golden]") {
  CHECK(session_hash("default", "/models/qwen2.5-7b-instruct-q4_k_m.gguf", "session-1") ==
        "6c78797625f1063d969986318e73f1ee5498f32f3d3e091e7cb4daae91d1d793");
  CHECK(base_runtime().fingerprint() ==
        "9b04d99ce9ba57abb0e848cc78cefc2bb1866121c6ed12ea9f14e908b242aa21");
  auto probed = base_runtime();
  probed.behaviour = "0123456789abcdef";
  CHECK(probed.fingerprint() ==
        "3656a87bb627c3c82f91fdcb12e07f35d0e54f0e95298832cae009e00cdb1ff0");
}

}  // namespace identity_test
