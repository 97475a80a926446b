// Tests for core/tenancy.hpp (docs/design.md §20, §24): the scope the sharing switches name,
// and how the credentials seen change the door.
#include "core/tenancy.hpp"

#include <catch2/catch.hpp>

namespace tenancy_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

const slot_content unknown_slot{content_whose::unknown, {}, {}};
const door_request a_session{"key-A", "session-A", false};

}  // namespace

TEST_CASE("the sharing switches name the scope", "[core][tenancy]") {
  CHECK(sharing_scope(true, false) == door_scope::instance);
  CHECK(sharing_scope(true, true) == door_scope::credential);
  CHECK(sharing_scope(false, false) == door_scope::session);
  CHECK(sharing_scope(false, true) == door_scope::session);
  CHECK_FALSE(tenancy(door_scope::instance).scoped_by_credential());
  CHECK(tenancy(door_scope::credential).scoped_by_credential());
  CHECK(tenancy(door_scope::session).scoped_by_credential());
}

TEST_CASE("unknown content: its erase is tried with one credential seen, required from the second",
          "[core][tenancy]") {
  tenancy t(door_scope::credential);
  CHECK(t.door().ask(unknown_slot, a_session) == door_answer::erase);
  t.note_credential("key-A");
  t.note_credential("key-A");
  CHECK(t.door().ask(unknown_slot, a_session) == door_answer::erase);
  // Asked before a request of key-B is admitted: as if it had been seen.
  CHECK(t.door_with("key-B").ask(unknown_slot, a_session) == door_answer::erase_or_refuse);
  CHECK(t.door_with("key-A").ask(unknown_slot, a_session) == door_answer::erase);
  CHECK(t.door().ask(unknown_slot, a_session) == door_answer::erase);  // door_with noted nothing
  t.note_credential("key-B");
  CHECK(t.door().ask(unknown_slot, a_session) == door_answer::erase_or_refuse);
  t.note_credential("key-A");  // for good
  CHECK(t.door().several_credentials);
  CHECK(t.door().scope == door_scope::credential);
}

TEST_CASE("with no credential seen yet, the first one asked about is no second",
          "[core][tenancy]") {
  tenancy t(door_scope::credential);
  CHECK_FALSE(t.door_with("key-B").several_credentials);
}

}  // namespace tenancy_test
