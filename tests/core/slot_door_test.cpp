// Tests for the one door (core/slot_door.hpp, docs/design.md §24): the whole table of who may
// run on a slot's content, and that every inference route of core/request_class reaches a
// slot through the lease, where the door is asked.
#include "core/slot_door.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "core/request_class.hpp"

namespace slot_door_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

const slot_content empty_slot{content_whose::empty, {}, {}};
const slot_content unknown_slot{content_whose::unknown, {}, {}};
const slot_content a_session{content_whose::known, "key-A", "session-A"};
const slot_content a_aux{content_whose::known, "key-A", ""};

const door_request a_same_session{"key-A", "session-A", false};
const door_request a_other_session{"key-A", "session-A2", false};
const door_request a_aux_call{"key-A", "", true};
const door_request b_session{"key-B", "session-B", false};
const door_request b_aux_call{"key-B", "", true};

// "%XX" for `c`, as a client may spell any byte of a path.
std::string percent_encoded(char c) {
  constexpr std::string_view hex = "0123456789ABCDEF";
  const auto b = static_cast<unsigned char>(c);
  return {'%', hex[b >> 4], hex[b & 15]};
}

door_answer ask(door_scope scope, bool several, const slot_content& c, const door_request& r) {
  return slot_door{scope, several}.ask(c, r);
}

}  // namespace

TEST_CASE("door: an empty slot lets every request run, under every scope") {
  for (auto scope : {door_scope::instance, door_scope::credential, door_scope::session})
    for (const auto& r : {a_same_session, a_aux_call, b_session, b_aux_call})
      CHECK(ask(scope, true, empty_slot, r) == door_answer::run);
}

TEST_CASE("door: credential scope, another credential's KV is erased or the request refused") {
  CHECK(ask(door_scope::credential, true, a_session, b_session) == door_answer::erase_or_refuse);
  CHECK(ask(door_scope::credential, true, a_session, b_aux_call) == door_answer::erase_or_refuse);
  CHECK(ask(door_scope::credential, true, a_aux, b_session) == door_answer::erase_or_refuse);
  // the answer does not depend on whether other credentials were counted: known is known
  CHECK(ask(door_scope::credential, false, a_session, b_session) == door_answer::erase_or_refuse);
}

TEST_CASE("door: credential scope, the same credential shares whatever its requests left") {
  CHECK(ask(door_scope::credential, true, a_session, a_same_session) == door_answer::run);
  CHECK(ask(door_scope::credential, true, a_session, a_other_session) == door_answer::run);
  CHECK(ask(door_scope::credential, true, a_session, a_aux_call) == door_answer::run);
  CHECK(ask(door_scope::credential, true, a_aux, a_same_session) == door_answer::run);
}

TEST_CASE("door: unknown content is erased; required once several credentials were seen") {
  for (auto scope : {door_scope::credential, door_scope::session}) {
    CHECK(ask(scope, true, unknown_slot, a_same_session) == door_answer::erase_or_refuse);
    CHECK(ask(scope, true, unknown_slot, b_aux_call) == door_answer::erase_or_refuse);
    // one credential seen: the erase is tried; content of nobody known may still be a
    // client's that bypassed kvpersist, or from before kvpersist started: auxiliary calls too
    CHECK(ask(scope, false, unknown_slot, a_same_session) == door_answer::erase);
    CHECK(ask(scope, false, unknown_slot, a_aux_call) == door_answer::erase);
  }
  CHECK(ask(door_scope::instance, true, unknown_slot, b_session) == door_answer::erase);
  CHECK(ask(door_scope::instance, true, unknown_slot, b_aux_call) == door_answer::run);
}

TEST_CASE("door: unknown content whose credential is known (a stall) is that credential's") {
  const slot_content a_unknown{content_whose::unknown, "key-A", "", true};
  CHECK(ask(door_scope::credential, true, a_unknown, a_same_session) == door_answer::run);
  CHECK(ask(door_scope::credential, true, a_unknown, a_aux_call) == door_answer::run);
  CHECK(ask(door_scope::credential, true, a_unknown, b_session) == door_answer::erase_or_refuse);
  CHECK(ask(door_scope::credential, false, a_unknown, b_aux_call) == door_answer::erase_or_refuse);
  // no session is known to own it: under `session` even its own key erases it first
  CHECK(ask(door_scope::session, true, a_unknown, a_same_session) == door_answer::erase);
  CHECK(ask(door_scope::instance, true, a_unknown, b_session) == door_answer::run);
}

TEST_CASE("door: session scope, another session of the same key is erased, not required") {
  CHECK(ask(door_scope::session, true, a_session, a_same_session) == door_answer::run);
  CHECK(ask(door_scope::session, true, a_session, a_other_session) == door_answer::erase);
  CHECK(ask(door_scope::session, true, a_session, a_aux_call) == door_answer::erase);
  CHECK(ask(door_scope::session, true, a_session, b_session) == door_answer::erase_or_refuse);
}

TEST_CASE("door: instance scope runs on any known content") {
  CHECK(ask(door_scope::instance, true, a_session, b_session) == door_answer::run);
  CHECK(ask(door_scope::instance, true, a_session, b_aux_call) == door_answer::run);
}

// The door is asked under the slot's lease (docs/design.md §24 "Paths"). A route reaches the
// lease only if core::classify marks its POST as needing a slot: a route added to the table
// that classify did not send to the lease, or a table row classify cannot find, fails here.
TEST_CASE("door: every inference route's POST goes through the lease; nothing else does") {
  const auto routes = inference_route_table();
  REQUIRE(routes.size() >= 21);
  for (const auto& route : routes) {
    INFO(std::string(route.path));
    const auto post = classify("POST", route.path);
    CHECK(post.kind == endpoint_kind::inference);
    CHECK(post.needs_slot);
    CHECK(post.route == &route);
    CHECK(post.unpinnable() == !route.pinnable);
    // llama-server registers its inference routes for POST only: other methods make no task
    CHECK_FALSE(classify("GET", route.path).needs_slot);
    // the same route spelled as llama-server's HTTP library decodes it
    std::string encoded(route.path);
    encoded.replace(1, 1, percent_encoded(route.path[1]));
    CHECK(classify("POST", encoded).needs_slot);
  }
}

}  // namespace slot_door_test
