// Tests for core/session_keys.hpp (docs/design.md §3, §20): a session's key is session_hash
// under the current model, scoped by credential where the scope says so, and none without a
// runtime.
#include "core/session_keys.hpp"

#include <catch2/catch.hpp>

#include "core/identity.hpp"
#include "core/prefix_chain.hpp"

namespace session_keys_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

request_identity of(std::string id, std::string credential) {
  return request_identity{std::move(id), "", {}, std::move(credential)};
}

}  // namespace

TEST_CASE("no key without a runtime; session_hash under the model once it is set",
          "[core][session_keys]") {
  session_keys k("inst", false);
  CHECK(k.key("A").empty());
  k.set_model("/m/a.gguf");
  CHECK(k.key("A") == session_hash("inst", "/m/a.gguf", "A"));
  CHECK(k.key(of("A", "key-1")) == session_hash("inst", "/m/a.gguf", "A"));  // instance scope
  k.set_model("/m/b.gguf");  // a new model: new keys, none kept from the last one
  CHECK(k.key("A") == session_hash("inst", "/m/b.gguf", "A"));
  k.clear();
  CHECK(k.key("A").empty());
  CHECK(k.key(of("A", "key-1")).empty());
}

TEST_CASE("scoped by credential: another key names another session; the admin API's id alone",
          "[core][session_keys]") {
  session_keys k("inst", true);
  k.set_model("/m/a.gguf");
  CHECK(k.key(of("A", "key-1")) == session_hash("inst", "/m/a.gguf", "A", "key-1"));
  CHECK(k.key(of("A", "key-2")) == session_hash("inst", "/m/a.gguf", "A", "key-2"));
  CHECK(k.key(of("A", "key-1")) != k.key(of("A", "key-2")));
  CHECK(k.key("A") == session_hash("inst", "/m/a.gguf", "A"));
  // A content session's id already holds its credential: not scoped again.
  const std::string content_id = "content:0123";
  CHECK(k.key(of(content_id, "key-1")) == session_hash("inst", "/m/a.gguf", content_id));
}

TEST_CASE("more sessions than the memo holds still get their own keys", "[core][session_keys]") {
  session_keys k("inst", true);
  k.set_model("/m/a.gguf");
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 12; ++i) {
      const auto id = "s" + std::to_string(i);
      CHECK(k.key(of(id, "key-1")) == session_hash("inst", "/m/a.gguf", id, "key-1"));
    }
}

}  // namespace session_keys_test
