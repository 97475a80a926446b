// Tests for core/reuse_stats.hpp: what restores and cold starts earned, fed the way the
// coordinator feeds it (a restore, then the slot's next response).
#include "core/reuse_stats.hpp"

#include <catch2/catch.hpp>

namespace reuse_stats_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::prepare_kind;
using kvp::core::response_timings;
using kvp::core::restore_source;
using kvp::core::reuse_source;
using kvp::core::reuse_stats;

response_timings timings(std::int64_t cache_n, std::int64_t prompt_n = -1, double prompt_ms = -1) {
  return response_timings{cache_n, prompt_n, prompt_ms};
}

}  // namespace

TEST_CASE("a restore reused by its next response counts by source, once", "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "A", 1000, restore_source::content);
  CHECK_FALSE(s.record_response(0, prepare_kind::restored, timings(900, 20)));
  CHECK(s.reused_tokens(restore_source::content) == 900);
  CHECK(s.reused_tokens(restore_source::own) == 0);
  CHECK(s.prefilled_tokens() == 20);
  REQUIRE(s.last_restore("A"));
  CHECK(s.last_restore("A")->restored == 1000);
  CHECK(s.last_restore("A")->reused == 900);
  // The slot's restore is settled: a second restored response counts as the own source.
  CHECK_FALSE(s.record_response(0, prepare_kind::restored, timings(100)));
  CHECK(s.reused_tokens(restore_source::own) == 100);
  CHECK(s.reused_tokens_total() == 1000);
}

TEST_CASE("a restore reused below half did not pay and a seed only when nothing was reused",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(1, "A", 1000, restore_source::own);
  const auto unpaid = s.record_response(1, prepare_kind::restored, timings(499));
  REQUIRE(unpaid);
  CHECK(unpaid->hash == "A");
  CHECK(unpaid->restored == 1000);
  CHECK(unpaid->reused == 499);
  CHECK(s.unpaid_restores() == 1);

  s.note_restore(1, "A", 1000, restore_source::own);
  CHECK_FALSE(s.record_response(1, prepare_kind::restored, timings(500)));  // exactly half pays

  s.note_restore(2, "S", 1000, restore_source::seed);
  CHECK_FALSE(s.record_response(2, prepare_kind::restored, timings(1)));
  s.note_restore(2, "S", 1000, restore_source::seed);
  CHECK(s.record_response(2, prepare_kind::restored, timings(0)));
  CHECK(s.unpaid_restores() == 2);
  CHECK(s.reused_tokens(restore_source::seed) == 1);
}

TEST_CASE("the first own restore its next response reused none of is kept; seeds do not count",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "A", 1000, restore_source::own);
  CHECK(s.record_response(0, prepare_kind::restored, timings(1)));  // unpaid, but reused one
  CHECK_FALSE(s.first_reused_nothing());
  s.note_restore(0, "S", 1000, restore_source::seed);  // a seed shares only a prefix
  CHECK(s.record_response(0, prepare_kind::restored, timings(0)));
  CHECK_FALSE(s.first_reused_nothing());
  s.note_restore(0, "B", 800, restore_source::content);
  CHECK(s.record_response(0, prepare_kind::restored, timings(0)));
  REQUIRE(s.first_reused_nothing());
  CHECK(s.first_reused_nothing()->hash == "B");
  CHECK(s.first_reused_nothing()->restored == 800);
  CHECK(s.first_reused_nothing()->reused == 0);
  s.note_restore(0, "C", 900, restore_source::own);
  CHECK(s.record_response(0, prepare_kind::restored, timings(0)));
  CHECK(s.first_reused_nothing()->hash == "B");  // the first stays
}

TEST_CASE("the prompt speed is a moving average over cold requests of 64 tokens and more",
          "[reuse_stats]") {
  reuse_stats s;
  (void)s.record_response(0, prepare_kind::cold, timings(0, 63, 10));  // too short to tell
  CHECK(s.prompt_tokens_per_s() == 0);
  (void)s.record_response(0, prepare_kind::cold, timings(0, 1000, 1000));
  CHECK(s.prompt_tokens_per_s() == Approx(1000));
  (void)s.record_response(0, prepare_kind::cold_fallback, timings(0, 2000, 1000));
  CHECK(s.prompt_tokens_per_s() == Approx(0.7 * 1000 + 0.3 * 2000));
  (void)s.record_response(0, prepare_kind::restored, timings(0, 4000, 100));  // not cold
  CHECK(s.prompt_tokens_per_s() == Approx(1300));
  CHECK(s.prefilled_tokens() == 63 + 1000 + 2000 + 4000);
}

TEST_CASE("prefill seconds saved: reused tokens at the measured speed, none before one",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "A", 1000, restore_source::own);
  (void)s.record_response(0, prepare_kind::restored, timings(1000));
  CHECK(s.prefill_seconds_saved() == 0);  // no speed measured yet
  (void)s.record_response(1, prepare_kind::cold, timings(0, 500, 1000));  // 500 tokens/s
  s.note_restore(0, "A", 1000, restore_source::own);
  (void)s.record_response(0, prepare_kind::restored, timings(1000));
  CHECK(s.prefill_seconds_saved() == Approx(2.0));
}

TEST_CASE("resident responses and unreported reuse leave the aggregates alone",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "A", 1000, restore_source::own);
  (void)s.record_response(0, prepare_kind::resident, timings(900, 100, 10));
  (void)s.record_response(0, prepare_kind::restored, timings(-1, 100, 10));
  CHECK(s.prefilled_tokens() == 0);
  CHECK(s.reused_tokens_total() == 0);
  CHECK_FALSE(s.last_restore("A"));  // the restore still waits for its response
  (void)s.record_response(0, prepare_kind::restored, timings(800));
  REQUIRE(s.last_restore("A"));
  s.forget("A");
  CHECK_FALSE(s.last_restore("A"));
}

TEST_CASE("every response's reuse counts by where it came from, and the sources add up",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "A", 1000, restore_source::own);
  (void)s.record_response(0, prepare_kind::restored, timings(900));
  (void)s.record_response(0, prepare_kind::resident, timings(950));
  s.note_prepared(0, true);  // a cold start on the slot's content, kept within the scope
  (void)s.record_response(0, prepare_kind::cold, timings(40));
  s.note_prepared(0, false);  // erased first: what llama-server reused was its own doing
  (void)s.record_response(0, prepare_kind::cold, timings(7));
  s.note_prepared(1, true);  // an auxiliary call on the slot's content
  (void)s.record_response(1, prepare_kind::auxiliary, timings(30));
  s.note_prepared(1, false);
  (void)s.record_response(1, prepare_kind::auxiliary, timings(3));
  (void)s.record_response(-1, prepare_kind::none, timings(5));  // placed by llama-server
  s.note_prepared(1, true);
  (void)s.record_response(1, prepare_kind::none, timings(2));  // without persistence: no plan kept it
  (void)s.record_response(0, prepare_kind::resident, timings(-1));  // unreported: nothing
  CHECK(s.response_reused(reuse_source::own) == 900);
  CHECK(s.response_reused(reuse_source::resident) == 950);
  CHECK(s.response_reused(reuse_source::kept) == 70);
  CHECK(s.response_reused(reuse_source::cold) == 17);
  CHECK(s.response_reused_total() == 900 + 950 + 70 + 17);
  // The after-restore counters and the other aggregates are what they were.
  CHECK(s.reused_tokens_total() == 900);
}

TEST_CASE("a prefix snapshot's seed counts as prefix, and as a seed after restores",
          "[reuse_stats]") {
  reuse_stats s;
  s.note_restore(0, "S", 1000, restore_source::seed, true);
  (void)s.record_response(0, prepare_kind::restored, timings(600));
  s.note_restore(0, "T", 1000, restore_source::seed);
  (void)s.record_response(0, prepare_kind::restored, timings(400));
  s.note_restore(1, "C", 500, restore_source::content);
  (void)s.record_response(1, prepare_kind::restored, timings(450));
  CHECK(s.response_reused(reuse_source::prefix) == 600);
  CHECK(s.response_reused(reuse_source::seed) == 400);
  CHECK(s.response_reused(reuse_source::content) == 450);
  CHECK(s.reused_tokens(restore_source::seed) == 1000);
  CHECK(s.reused_tokens(restore_source::content) == 450);
  CHECK(s.response_reused_total() == s.reused_tokens_total());
  // A seed that reused nothing did not pay, from a prefix snapshot too.
  s.note_restore(0, "S", 1000, restore_source::seed, true);
  CHECK(s.record_response(0, prepare_kind::restored, timings(0)));
}

TEST_CASE("auxiliary calls and requests without a plan leave the other aggregates alone",
          "[reuse_stats]") {
  reuse_stats s;
  (void)s.record_response(0, prepare_kind::auxiliary, timings(10, 500, 100));
  (void)s.record_response(-1, prepare_kind::none, timings(10, 500, 100));
  CHECK(s.prefilled_tokens() == 0);
  CHECK(s.prompt_tokens_per_s() == 0);
  CHECK(s.response_reused_total() == 20);
}

}  // namespace reuse_stats_test
