// Tests for proxy/control/prefix_maker.hpp (docs/design.md §3, "Prefix snapshots"): after a
// seed that reused under 80% of what it restored, once nothing is leased or waiting and the
// slot's owner is saved, the maker runs the cut request pinned to the slot and saves the
// prefix session, whose manifest is the shared links alone; a seed that reused most of what it
// read asks for nothing; a held lease defers the work; a failed cut request saves nothing and
// leaves the slot's content nobody's.
#include "proxy/control/prefix_maker.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/identity.hpp"
#include "core/prefix_chain.hpp"
#include "core/prefix_snapshot.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"
#include "tests/support/runtime.hpp"

namespace prefix_maker_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::request_identity;
using kvp::proxy::lease_queue;
using kvp::proxy::lease_ticket;
using kvp::testing::backend_call;
using calls = std::vector<backend_call>;

constexpr const char* route = "/v1/chat/completions";

// A chat request: the shared system prompt, then `users` with an assistant "ok" between them.
std::string chat_body(const std::vector<std::string>& users) {
  std::string b = R"({"model":"m","messages":[{"role":"system","content":"You are the shared agent."})";
  for (std::size_t i = 0; i < users.size(); ++i) {
    if (i > 0) b += R"(,{"role":"assistant","content":"ok"})";
    b += R"(,{"role":"user","content":")" + users[i] + R"("})";
  }
  return b + "]}";
}

kvp::core::slot_pool_options seeding_pool_options() {
  auto o = kvp::testing::control_pool_options();
  o.seed_across_sessions = true;  // sharing: credential
  o.seed_within_credential = true;
  return o;
}

struct harness : kvp::testing::control_parts {
  lease_queue leases{8, kvp::testing::one_slot_chooser(),
                     [](const std::shared_ptr<lease_ticket>&) {}};
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::prefix_maker maker{ioc.get_executor(), {pool, leases, actions, fake}};

  harness() : control_parts(std::chrono::seconds(5), seeding_pool_options()) {
    REQUIRE(store.open().ok());
    pool.set_runtime(kvp::testing::qwen7b_runtime());
    REQUIRE(pool.persistence_enabled());
  }
  ~harness() {
    maker.stop();
    kvp::testing::run_for(ioc, 20ms);
  }

  static request_identity who(const std::string& id, const std::string& body) {
    request_identity w;
    w.session_id = id;
    w.credential = kvp::core::credential_key("key-1");
    w.chain = kvp::core::prefix_chain_of(route, body)->links;
    return w;
  }
  // `w` runs on slot 0 as planned (the maker told of the plan), leaves `tokens` there and is
  // saved; returns how it was prepared.
  kvp::core::prepare_kind turn(request_identity w, std::uint64_t tokens) {
    pool.resolve_session(w);
    const auto plan =
        pool.plans().prepare(w, 0, std::chrono::steady_clock::now(), "2026-06-01T00:00:00Z");
    maker.note_plan(0, plan, w);
    REQUIRE(kvp::testing::run_on(ioc, ioc.get_executor(), actions.execute(plan, false)).ok());
    const auto kind = pool.outcomes().start_inference(w, 0);
    fake.run_inference(tokens);
    (void)pool.outcomes().end_inference(0, true, std::chrono::steady_clock::now());
    const auto step = pool.plans().checkpoint_slot(0, std::chrono::steady_clock::now());
    REQUIRE(step);
    REQUIRE(kvp::testing::run_on(ioc, ioc.get_executor(), actions.run_save(*step)).ok());
    return kind;
  }
  // The donor (4,000 tokens, saved), then the slot emptied; then B, whose chain shares only
  // the system prompt with it, seeded from the donor and reusing `reused` tokens.
  std::shared_ptr<const std::string> donor_then_seed(std::uint64_t reused) {
    const auto donor = chat_body({"first question", "second question", "third question"});
    turn(who("D", donor), 4000);
    pool.table().forget_slot(0);
    fake.clear_slot();
    auto b = std::make_shared<const std::string>(chat_body({"another question"}));
    CHECK(turn(who("B", *b), 1200) == kvp::core::prepare_kind::restored);
    maker.note_reply(0, {kvp::core::prepare_kind::restored, static_cast<std::int64_t>(reused), b,
                         route});
    fake.clear_calls();
    return b;
  }
  std::string prefix_hash() const {
    auto p = who(kvp::core::prefix_session_id(
                     kvp::core::prefix_chain_of(route, chat_body({"x"}))->links.front()),
                 chat_body({"x"}));
    return pool.hash_for(p);
  }
};

TEST_CASE("prefix_maker: a seed that reused little has the shared prefix cut and saved alone",
          "[proxy][prefix_maker]") {
  harness h;
  h.fake.leave_after_run(310);
  h.donor_then_seed(300);  // 300 of 4,000 restored tokens reused
  h.maker.arm();
  kvp::testing::run_for(h.ioc, 100ms);
  // B's saved content holds the prefix: no restore, the cut request pinned to slot 0, its save.
  const auto file = kvp::core::snapshot_filename(h.prefix_hash(), 'a');
  CHECK(h.fake.slot_calls() == calls{{"run", 0, route}, {"save", 0, file}});
  CHECK(h.fake.last_run_body().find(R"("id_slot":0)") != std::string::npos);
  CHECK(h.fake.last_run_body().find(R"("max_tokens":1)") != std::string::npos);
  const auto m = h.store.read(h.prefix_hash());
  REQUIRE(m);
  CHECK(kvp::core::is_prefix_session(m->session_id));
  CHECK(m->chain.size() == 1);  // the system prompt's link alone
  CHECK(m->tokens == 310);
  CHECK_FALSE(h.leases.is_leased(0));

  // Made once: arming again makes nothing more.
  h.fake.clear_calls();
  h.maker.arm();
  kvp::testing::run_for(h.ioc, 50ms);
  CHECK(h.fake.slot_calls().empty());
}

TEST_CASE("prefix_maker: a seed that reused most of what it read asks for nothing",
          "[proxy][prefix_maker]") {
  harness h;
  h.donor_then_seed(3600);  // 90% of the 4,000 restored tokens
  h.maker.arm();
  kvp::testing::run_for(h.ioc, 100ms);
  CHECK(h.fake.slot_calls().empty());
}

TEST_CASE("prefix_maker: a leased slot waits for its release", "[proxy][prefix_maker]") {
  harness h;
  h.fake.leave_after_run(310);
  h.donor_then_seed(300);
  const auto held = kvp::testing::hold_slot(h.leases, h.ioc, 0);
  h.maker.arm();
  kvp::testing::run_for(h.ioc, 100ms);
  CHECK(h.fake.slot_calls().empty());

  h.leases.release(held);
  h.maker.arm();  // as the coordinator does after every release
  kvp::testing::run_for(h.ioc, 100ms);
  CHECK(h.fake.slot_calls().size() == 2);
}

TEST_CASE("prefix_maker: a failed cut request saves nothing and leaves the slot nobody's",
          "[proxy][prefix_maker]") {
  harness h;
  h.donor_then_seed(300);
  h.fake.fail_next_run(kvp::testing::failure::http(500));
  h.maker.arm();
  kvp::testing::run_for(h.ioc, 100ms);
  CHECK(h.fake.slot_calls() == calls{{"run", 0, route}});
  CHECK_FALSE(h.store.read(h.prefix_hash()));
  CHECK(h.pool.table().owner(0).empty());  // what the failed request left is nobody's
  CHECK_FALSE(h.leases.is_leased(0));
}

}  // namespace

}  // namespace prefix_maker_test
