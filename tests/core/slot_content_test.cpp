// Tests for the slot-content model of core/slot_pool.hpp (docs/design.md §20): whose KV a
// slot holds, which requests may run on it, and what a header request that does not continue
// its session becomes.
#include "core/slot_pool.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "core/request_class.hpp"
#include "tests/support/chains.hpp"
#include "tests/support/plan_calls.hpp"
#include "tests/support/runtime.hpp"

namespace slot_content_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

// Single-slot pools (slot_pool_options::slot_id left at its default): their one slot.
constexpr int only_slot = 0;

using namespace std::chrono_literals;
using namespace kvp::core;

const steady_time t0 = steady_time{} + std::chrono::hours(24);
constexpr std::string_view wall = "2025-06-01T12:00:00Z";

using kvp::testing::chain;

enum class scope { instance, credential, session };

slot_pool make_pool(scope s) {
  slot_pool_options o;
  o.instance_key = "test-instance";
  o.idle_checkpoint = 0ms;
  o.seed_across_sessions = s != scope::session;
  o.seed_within_credential = s == scope::credential;
  slot_pool p(o);
  p.set_runtime(kvp::testing::qwen7b_runtime());
  return p;
}

request_identity session(std::string id, std::string credential,
                         std::vector<chain_link> c = chain({1, 2})) {
  return request_identity{std::move(id), "", std::move(c), std::move(credential)};
}

request_identity auxiliary(std::string credential) {
  return request_identity{"", "title", {}, std::move(credential)};
}

// Carries out `plan` as if every call succeeded, then the inference.
void run(slot_pool& p, const request_identity& w, const prepare_plan& plan) {
  kvp::testing::run_plan(p, w, plan, t0, wall);
}

prepare_plan request(slot_pool& p, request_identity w) {
  p.resolve_session(w);
  auto plan = p.plans().prepare(w, only_slot, t0, wall);
  run(p, w, plan);
  return plan;
}

}  // namespace

TEST_CASE("a slot's content is unknown at first, known after a request, empty after an erase",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  CHECK(p.table().content(0).whose == content_whose::unknown);
  const auto first = request(p, session("A", "k1"));
  CHECK(first.erase);                 // unknown content is never shared under a scope
  CHECK_FALSE(first.erase_required);  // ... but with one credential seen, nobody else's
  CHECK(p.table().content(0).whose == content_whose::known);
  CHECK(p.table().content(0).credential == "k1");
  CHECK(p.table().content(0).session == p.hash_for(session("A", "k1")));
  p.table().on_epoch_change();
  CHECK(p.table().content(0).whose == content_whose::empty);  // a new server process holds nothing
}

TEST_CASE("under credential scope another credential never runs on the slot un-erased",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));

  SECTION("an auxiliary call of the same credential runs on A's content") {
    const auto plan = request(p, auxiliary("k1"));
    CHECK(plan.save);  // A is saved first, as before
    CHECK_FALSE(plan.erase);
  }
  SECTION("an auxiliary call of another credential: the erase is required") {
    const auto plan = p.plans().prepare(auxiliary("k2"), only_slot, t0, wall);
    CHECK(plan.save);
    CHECK(plan.erase);
    CHECK(plan.erase_required);
  }
  SECTION("a new session of another credential: no keep, no seed, a required erase") {
    const auto plan = p.plans().prepare(session("B", "k2"), only_slot, t0, wall);
    CHECK_FALSE(plan.kept);
    CHECK_FALSE(plan.restore);
    CHECK(plan.erase);
    CHECK(plan.erase_required);
  }
  SECTION("a new session of the same credential keeps the slot's content") {
    const auto plan = p.plans().prepare(session("B", "k1", chain({7, 8})), only_slot, t0, wall);
    CHECK(plan.kept);
    CHECK_FALSE(plan.erase);
  }
  SECTION("another credential sending A's session id names another session") {
    CHECK(p.hash_for(session("A", "k2")) != p.hash_for(session("A", "k1")));
    const auto plan = p.plans().prepare(session("A", "k2"), only_slot, t0, wall);
    CHECK_FALSE(plan.resident);
    CHECK_FALSE(plan.restore);
    CHECK(plan.erase_required);
  }
}

TEST_CASE("unknown content needs a required erase only once several credentials were seen",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));
  request(p, session("B", "k2"));  // a second credential
  p.table().forget_slot(0);                 // something kvpersist did not plan ran there
  REQUIRE(p.table().content(0).whose == content_whose::unknown);
  const auto plan = p.plans().prepare(session("C", "k1", chain({7, 8})), only_slot, t0, wall);
  CHECK_FALSE(plan.restore);
  CHECK(plan.erase);
  CHECK(plan.erase_required);
}

TEST_CASE("a failed scope erase leaves the content unknown", "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));
  const auto plan = p.plans().prepare(auxiliary("k2"), only_slot, t0, wall);
  REQUIRE(plan.erase_required);
  if (plan.save)
    REQUIRE(p.outcomes().on_save(*plan.save, slot_saved{100, 4096, 1.0}, t0, wall).ok());
  CHECK_FALSE(p.outcomes().on_erase(only_slot, error{errc::erase_failed, 500, "no"}, t0));
  CHECK(p.table().content(0).whose == content_whose::unknown);
}

TEST_CASE("under instance scope any known content is shared; under session only its own",
          "[core][slot_content]") {
  SECTION("instance") {
    auto p = make_pool(scope::instance);
    request(p, session("A", "k1"));
    CHECK_FALSE(p.plans().prepare(auxiliary("k2"), only_slot, t0, wall).erase);
  }
  SECTION("session: another session of the same credential is erased, not required") {
    auto p = make_pool(scope::session);
    request(p, session("A", "k1"));
    const auto plan = p.plans().prepare(session("B", "k1", chain({7})), only_slot, t0, wall);
    CHECK(plan.erase);
    CHECK_FALSE(plan.erase_required);
    CHECK_FALSE(plan.kept);
  }
}

TEST_CASE("a server that did not answer leaves its slots unknown, as their credential's",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));
  request(p, session("B", "k2"));
  request(p, session("A", "k1"));  // the slot holds k1's KV; two credentials seen
  p.table().on_unreachable();  // a stall: the KV may still be there, and will be after SIGCONT
  // Below, chain {7, 8}: a new conversation that no saved snapshot can seed.
  CHECK(p.table().content(0).whose == content_whose::unknown);
  CHECK(p.table().content(0).credential == "k1");
  CHECK(p.table().owner(0).empty());
  p.table().on_unreachable();  // the probe keeps failing: nothing more is forgotten
  CHECK(p.table().content(0).credential_known);
  SECTION("another credential's new conversation erases first, and must") {
    const auto plan = p.plans().prepare(session("C", "k2", chain({7, 8})), only_slot, t0, wall);
    CHECK(plan.erase);
    CHECK(plan.erase_required);
    CHECK_FALSE(plan.kept);
  }
  SECTION("another credential's auxiliary call too") {
    CHECK(p.plans().prepare(auxiliary("k2"), only_slot, t0, wall).erase_required);
  }
  SECTION("the same credential keeps it: no erase") {
    const auto plan = p.plans().prepare(session("C", "k1", chain({7, 8})), only_slot, t0, wall);
    CHECK_FALSE(plan.erase);
    CHECK(plan.kept);
  }
  SECTION("only a new epoch makes it empty") {
    p.table().on_epoch_change();
    CHECK(p.table().content(0).whose == content_whose::empty);
    CHECK_FALSE(p.plans().prepare(session("C", "k2", chain({7, 8})), only_slot, t0, wall).erase);
  }
}

TEST_CASE("an empty slot that went out of sight is unknown, of nobody known",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));
  request(p, session("B", "k2"));
  p.table().on_epoch_change();
  p.table().on_unreachable();
  CHECK(p.table().content(0).whose == content_whose::unknown);
  CHECK_FALSE(p.table().content(0).credential_known);
  CHECK(p.plans().prepare(session("C", "k1", chain({7, 8})), only_slot, t0, wall).erase_required);
}

TEST_CASE("persistence off keeps the slots' credentials: isolation does not depend on it",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("A", "k1"));
  p.disable_persistence();
  CHECK(p.table().content(0).whose == content_whose::unknown);
  CHECK(p.table().content(0).credential == "k1");
  CHECK_FALSE(p.pass_through_needs_erase("k1"));
  CHECK(p.pass_through_needs_erase("k2"));
  p.placed().note_pass_through("k1");
  CHECK_FALSE(p.pass_through_needs_erase("k1"));
  SECTION("another credential after every slot was erased is the new tenant") {
    p.table().on_server_erased();
    CHECK_FALSE(p.pass_through_needs_erase("k2"));
    p.placed().note_pass_through("k2");
    CHECK(p.pass_through_needs_erase("k1"));
    CHECK_FALSE(p.pass_through_needs_erase("k2"));
    SECTION("and persistence back: k1 erases first, k2 keeps its content") {
      p.set_runtime(kvp::testing::qwen7b_runtime());
      CHECK(
          p.plans().prepare(session("C", "k1", chain({1, 2})), only_slot, t0, wall).erase_required);
      p.outcomes().abort_prepare(only_slot);
      CHECK(p.plans().prepare(session("D", "k2", chain({1, 2})), only_slot, t0, wall).kept);
    }
  }
  SECTION("a pass-through of another credential without an erase (isolation off) leaves "
          "content of nobody known") {
    p.placed().note_pass_through("k2");
    CHECK_FALSE(p.table().content(0).credential_known);
    CHECK(p.pass_through_needs_erase("k1"));
    CHECK(p.pass_through_needs_erase("k2"));
  }
}

TEST_CASE("persistence off, one credential: nothing there is another tenant's",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  p.disable_persistence();  // before any request: the slot is unknown
  CHECK_FALSE(p.pass_through_needs_erase("k1"));
  p.placed().note_pass_through("k1");
  CHECK_FALSE(p.pass_through_needs_erase("k1"));
  CHECK(p.pass_through_needs_erase("k2"));
}

TEST_CASE("persistence off under instance scope never asks for an erase", "[core][slot_content]") {
  auto p = make_pool(scope::instance);
  request(p, session("A", "k1"));
  p.disable_persistence();
  p.placed().note_pass_through("k1");
  CHECK_FALSE(p.pass_through_needs_erase("k2"));
}

TEST_CASE("a header request with another preamble than its session's is a sub-session",
          "[core][slot_content]") {
  auto p = make_pool(scope::credential);
  request(p, session("X", "k1", chain({1, 2, 3})));

  SECTION("the next turn continues: the same session, resident") {
    auto next = session("X", "k1", chain({1, 2, 3, 4}));
    p.resolve_session(next);
    CHECK(next.session_id == "X");
    CHECK(p.plans().prepare(next, only_slot, t0, wall).resident);
  }
  SECTION("another first user message with the same preamble: still the header's session") {
    auto other = session("X", "k1", chain({1, 9}));
    p.resolve_session(other);
    CHECK(other.session_id == "X");
  }
  SECTION("a title call with another preamble: the sub-session X#<its preamble link>") {
    auto title = session("X", "k1", chain({9, 2}));
    p.resolve_session(title);
    CHECK(title.session_id == sub_session_id("X", to_hex(title.chain[0]).substr(0, 16)));
    const auto plan = p.plans().prepare(title, only_slot, t0, wall);
    CHECK_FALSE(plan.resident);  // never silently on X's KV while X is thought resident
    CHECK(plan.save);            // X is saved first
    run(p, title, plan);
    // X's next turn restores X.
    auto back = session("X", "k1", chain({1, 2, 3, 4}));
    p.resolve_session(back);
    CHECK(back.session_id == "X");
    const auto again = p.plans().prepare(back, only_slot, t0, wall);
    REQUIRE(again.restore);
    CHECK(again.restore->hash == p.hash_for(back));
  }
  SECTION("an empty preamble names nothing: the header decides") {
    auto bare = session("X", "k1", chain({9, 2}));
    bare.min_shared_links = 2;
    p.resolve_session(bare);
    CHECK(bare.session_id == "X");
  }
  SECTION("an auxiliary request is never renamed") {
    auto aux = auxiliary("k1");
    p.resolve_session(aux);
    CHECK(aux.session_id.empty());
  }
}

TEST_CASE("harness headers: the deciding value of a header", "[core][request_class]") {
  CHECK(harness_header_value("agent-7", "", {}, "") == "agent-7");
  CHECK(harness_header_value("", "", {}, "").empty());
  CHECK(harness_header_value("compact", "", {"compact", "memory_consolidation"}, "") == "compact");
  CHECK(harness_header_value("review", "", {"compact", "memory_consolidation"}, "").empty());
  CHECK(harness_header_value(R"({"request_kind":"compaction","turn":3})", "request_kind",
                             {"compaction", "memory"}, "") == "compaction");
  CHECK(harness_header_value(R"({"request_kind":"turn"})", "request_kind",
                             {"compaction", "memory"}, "")
            .empty());
  CHECK(harness_header_value(R"({"request_kind":7})", "request_kind", {}, "").empty());
  CHECK(harness_header_value("not json", "request_kind", {}, "").empty());
  CHECK(harness_header_value(R"(["request_kind"])", "request_kind", {}, "").empty());
}

TEST_CASE("harness headers: a prefix matches only values that go on after it",
          "[core][request_class]") {
  CHECK(harness_header_value("title-ses_01J9", "", {}, "title-") == "title-ses_01J9");
  // Conversation ids that merely look alike are not side calls.
  CHECK(harness_header_value("title-", "", {}, "title-").empty());
  CHECK(harness_header_value("titles-1", "", {}, "title-").empty());
  CHECK(harness_header_value("Title-s1", "", {}, "title-").empty());
  CHECK(harness_header_value("subtitle-s1", "", {}, "title-").empty());
  CHECK(harness_header_value("ses_title-s1", "", {}, "title-").empty());
  CHECK(harness_header_value("title", "", {}, "title-").empty());
  // With `values` too, the whole value must be one of them.
  CHECK(harness_header_value("title-a", "", {"title-a"}, "title-") == "title-a");
  CHECK(harness_header_value("title-b", "", {"title-a"}, "title-").empty());
  CHECK(harness_header_value(R"({"id":"title-s1"})", "id", {}, "title-") == "title-s1");
}

TEST_CASE("sub-session ids stay bounded", "[core][request_class]") {
  CHECK(sub_session_id("S", "agent-1") == "S#agent-1");
  const std::string long_tag(1000, 'x');
  const auto id = sub_session_id("S", long_tag);
  CHECK(id.size() == 2 + 16);
  CHECK(id == sub_session_id("S", long_tag));  // stable
  CHECK(id != sub_session_id("S", long_tag + "y"));
}

TEST_CASE("a credential is the key as llama-server reads it", "[core][slot_content]") {
  CHECK(credential_key("Bearer k1") == credential_key("k1"));
  CHECK(credential_key("Bearer k1") != credential_key("Bearer k2"));
  CHECK(credential_key("bearer k1") != credential_key("k1"));  // llama-server's exact spelling
  CHECK(credential_key("").empty());
  CHECK(credential_key("Bearer ").empty());
}

namespace {

// Managed mode: a pool of `n` slots; `request_on` plans and runs a request on one of them.
slot_pool make_managed_pool(scope s, int n) {
  auto p = make_pool(s);
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(i);
  p.table().set_ids(ids);
  return p;
}

void request_on(slot_pool& p, const request_identity& w, int slot) {
  const auto plan = p.plans().prepare(w, slot, t0, wall);
  kvp::testing::run_plan(p, w, plan, t0, wall);
}

using erases = std::vector<std::pair<int, bool>>;  // (slot, required)

erases erases_for(slot_pool& p, const request_identity& w) {
  erases out;
  for (const auto& e : p.placed().erases_before_unpinned(w)) out.emplace_back(e.slot, e.required);
  return out;
}

}  // namespace

TEST_CASE("an unpinnable request: every slot it may not run on is erased first, and the slot "
          "that ran it holds its credential's content",
          "[core][slot_content]") {
  auto p = make_managed_pool(scope::credential, 3);
  request_on(p, session("A", "k1"), 0);
  request_on(p, session("B", "k2"), 1);
  // k2's own content stays; A's and the unknown slot 2 (two credentials seen) must go.
  CHECK(erases_for(p, auxiliary("k2")) == erases{{0, true}, {2, true}});
  // The same request under A's session header is no session turn: the same erases.
  CHECK(erases_for(p, session("A", "k2")) == erases{{0, true}, {2, true}});
  REQUIRE(p.outcomes().on_erase(0, slot_erased{100}, t0));
  REQUIRE(p.outcomes().on_erase(2, slot_erased{0}, t0));
  CHECK(p.table().owner(0).empty());  // an erased slot holds nobody's KV
  p.placed().note_unpinned_ran(2, "k2");
  CHECK(p.table().content(2).whose == content_whose::known);
  CHECK(p.table().content(2).credential == "k2");
  CHECK(p.table().content(2).session.empty());
  CHECK(erases_for(p, auxiliary("k2")).empty());  // empty or k2's own everywhere
  CHECK(erases_for(p, auxiliary("k1")) == erases{{1, true}, {2, true}});
}

TEST_CASE("an unpinnable request with one credential seen: its own key's slot is kept, a slot "
          "of nobody known is erased, neither erase required", "[core][slot_content]") {
  auto p = make_managed_pool(scope::credential, 2);
  request_on(p, session("A", "k1"), 0);
  // slot 1 holds whatever llama-server held before kvpersist started: anyone's
  CHECK(erases_for(p, auxiliary("k1")) == erases{{1, false}});
  auto session_scoped = make_managed_pool(scope::session, 2);
  request_on(session_scoped, session("A", "k1"), 0);
  // slot 0: A's own key, but not A
  CHECK(erases_for(session_scoped, auxiliary("k1")) == erases{{0, false}, {1, false}});
}

TEST_CASE("a request refused before it reached llama-server leaves its erased slot unowned",
          "[core][slot_content]") {
  auto p = make_managed_pool(scope::credential, 2);
  request_on(p, session("A", "k1"), 0);
  const auto b = session("B", "k2");
  const auto plan = p.plans().prepare(b, 1, t0, wall);
  REQUIRE(plan.erase);
  REQUIRE(p.outcomes().on_erase(1, slot_erased{0}, t0));
  p.outcomes().start_inference(b, 1);
  (void)p.outcomes().end_inference(1, false, t0);  // e.g. a body that cannot be pinned
  CHECK(p.table().owner(1).empty());
  CHECK(p.table().content(1).whose == content_whose::empty);
  // A resident request refused the same way: the slot still holds A's turns.
  const auto a = session("A", "k1");
  REQUIRE(p.plans().prepare(a, 0, t0, wall).resident);
  p.outcomes().start_inference(a, 0);
  (void)p.outcomes().end_inference(0, false, t0);
  CHECK(p.table().owner(0) == p.hash_for(a));
  CHECK(p.table().content(0).credential == "k1");
}

TEST_CASE("a slot seen empty is forgotten alone", "[core][slot_content]") {
  auto p = make_managed_pool(scope::credential, 2);
  request_on(p, session("A", "k1"), 0);
  request_on(p, session("B", "k2"), 1);
  p.table().forget_emptied_slot(1);
  CHECK(p.table().owner(1).empty());
  CHECK(p.table().content(1).whose == content_whose::empty);
  CHECK(p.table().owner(0) == p.hash_for(session("A", "k1")));
  CHECK(p.table().content(0).credential == "k1");
  CHECK(
      p.plans().prepare(session("C", "k3"), 0, t0, wall).erase_required);  // A's KV is still there
}

}  // namespace slot_content_test
