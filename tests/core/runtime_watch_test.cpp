// Tests for core/runtime_watch.hpp: what the coordinator's probes of llama-server's runtime
// mean (docs/design.md §4), fed as the coordinator feeds them.
#include "core/runtime_watch.hpp"

#include <catch2/catch.hpp>

namespace runtime_watch_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;
using namespace std::chrono_literals;
using action = probe_decision::action;
using time_point = runtime_watch::time_point;

const time_point t0 = time_point{} + 1000s;

server_probe usable_server(std::string marker = "m1", std::int64_t slots = 1) {
  server_probe p;
  p.runtime.model_path = "/models/a.gguf";
  p.runtime.build_info = "b1";
  p.runtime.n_ctx = 4096;
  p.runtime.total_slots = slots;
  p.runtime.media_marker = std::move(marker);
  p.slot_actions = true;
  return p;
}

full_probe answered(server_probe p) { return full_probe{std::move(p), std::nullopt}; }

full_probe failed(errc code, std::optional<std::string> answering = std::nullopt) {
  return full_probe{error{code, 0, "it failed"}, std::move(answering)};
}

probe_context off() { return probe_context{}; }

probe_context on(std::string marker) {
  probe_context c;
  c.persistence_enabled = true;
  c.current_marker = std::move(marker);
  return c;
}

behaviour_signature sig(std::vector<std::int64_t> ids) { return behaviour_signature{std::move(ids)}; }

}  // namespace

TEST_CASE("a usable probe is adopted with the runtime key; the first one makes it ready",
          "[core][runtime_watch]") {
  runtime_watch w;
  auto ctx = off();
  ctx.runtime_key = "k";
  const auto d = w.judge_probe(answered(usable_server()), ctx, t0);
  REQUIRE(d.what == action::adopt);
  CHECK(d.newly_ready);
  CHECK_FALSE(d.restarted);
  CHECK(d.identity.runtime_key == "k");
  CHECK(d.identity.behaviour.empty());
  CHECK(d.verdict == "unknown");
  CHECK(w.meta_fingerprint() == d.identity.fingerprint());
  CHECK(w.runtime_epoch() == "m1|" + d.identity.fingerprint());
  CHECK_FALSE(w.behaviour_known());
}

TEST_CASE("another media_marker while persistence is on is a restart; the same is not",
          "[core][runtime_watch]") {
  runtime_watch w;
  const auto same = w.judge_probe(answered(usable_server("m1")), on("m1"), t0);
  REQUIRE(same.what == action::adopt);
  CHECK_FALSE(same.restarted);
  CHECK_FALSE(same.newly_ready);
  const auto other = w.judge_probe(answered(usable_server("m2")), on("m1"), t0);
  REQUIRE(other.what == action::adopt);
  CHECK(other.restarted);
  // Persistence off: nothing to reset, it becomes ready.
  const auto after_off = w.judge_probe(answered(usable_server("m3")), off(), t0);
  CHECK_FALSE(after_off.restarted);
  CHECK(after_off.newly_ready);
}

TEST_CASE("a server kvpersist cannot manage turns persistence off with the reason",
          "[core][runtime_watch]") {
  runtime_watch w;
  auto no_actions = usable_server();
  no_actions.slot_actions = false;
  auto d = w.judge_probe(answered(no_actions), off(), t0);
  CHECK(d.what == action::disable);
  CHECK(d.code == errc::backend_unsupported);
  CHECK(d.why == "slot actions are disabled: start llama-server with --slot-save-path DIR");

  d = w.judge_probe(answered(usable_server("m1", 4)), off(), t0);
  CHECK(d.what == action::disable);
  CHECK(d.why == "llama-server has 4 slots; single-slot mode needs -np 1 (mode: auto serves several)");

  auto managed = off();
  managed.single_slot = false;
  CHECK(w.judge_probe(answered(usable_server("m1", 4)), managed, t0).what == action::adopt);

  auto far_slot = off();
  far_slot.slot_id = 1;
  d = w.judge_probe(answered(usable_server()), far_slot, t0);
  CHECK(d.what == action::disable);
  CHECK(d.code == errc::slot_not_found);
  CHECK(d.why == "slotId 1 does not exist: llama-server has 1 slot(s)");
  CHECK(w.probe_failures() == 0);  // none of these backs the probe off
}

TEST_CASE("doctor's verdict applies only to the fingerprint it judged; broken turns it off",
          "[core][runtime_watch]") {
  runtime_watch w;
  const auto fp = w.judge_probe(answered(usable_server()), off(), t0).identity.fingerprint();
  auto ctx = off();
  ctx.compatibility_fingerprint = fp;
  ctx.compatibility_verdict = "ok";
  CHECK(w.judge_probe(answered(usable_server()), ctx, t0).verdict == "ok");
  ctx.compatibility_fingerprint = "another";
  CHECK(w.judge_probe(answered(usable_server()), ctx, t0).verdict == "unknown");
  ctx.compatibility_fingerprint = fp;
  ctx.compatibility_verdict = "broken";
  const auto d = w.judge_probe(answered(usable_server()), ctx, t0);
  CHECK(d.what == action::disable);
  CHECK(d.code == errc::backend_unsupported);
  CHECK(d.why.starts_with("doctor --verify found this runtime broken"));
}

TEST_CASE("a failed probe: unusable answer, failure after /props, or no answer",
          "[core][runtime_watch]") {
  runtime_watch w;
  auto d = w.judge_probe(failed(errc::backend_unsupported, "m1"), on("m1"), t0);
  CHECK(d.what == action::disable);
  CHECK(d.code == errc::backend_unsupported);
  CHECK(d.why == "it failed");
  CHECK(w.probe_failures() == 0);

  d = w.judge_probe(failed(errc::backend_unavailable), on("m1"), t0);
  CHECK(d.what == action::unavailable);
  CHECK(d.code == errc::backend_unavailable);
  CHECK(d.why == "it failed");
  CHECK(w.probe_failures() == 0);

  d = w.judge_probe(failed(errc::backend_disconnected, "m1"), on("m1"), t0);
  CHECK(d.what == action::disable);
  CHECK(d.code == errc::backend_unavailable);
  CHECK(d.why == "the runtime probe failed: it failed");
  CHECK(w.probe_failures() == 1);
  CHECK(w.retry_marker() == "m1");
  CHECK(w.backing_off(false));
  CHECK_FALSE(w.backing_off(true));  // persistence came back: nothing to wait for
}

TEST_CASE("the probe back-off doubles from 1 s up to 30 s", "[core][runtime_watch]") {
  runtime_watch w;
  std::vector<std::chrono::seconds> waits;
  for (int i = 0; i < 7; ++i) {
    w.back_off("m1", t0);
    auto wait = 0s;
    while (!w.retry_time_reached(t0 + wait)) wait += 1s;
    waits.push_back(wait);
  }
  CHECK(waits == std::vector<std::chrono::seconds>{1s, 2s, 4s, 8s, 16s, 30s, 30s});
  w.back_off("m2", t0);
  CHECK(w.retry_marker() == "m2");
}

TEST_CASE("the behaviour class holds for its epoch and ends the back-off",
          "[core][runtime_watch]") {
  runtime_watch w;
  const auto first = w.judge_probe(answered(usable_server("m1")), on("m1"), t0);
  w.back_off("m1", t0);
  w.adopt_behaviour(w.runtime_epoch(), "c1");
  CHECK(w.behaviour_known());
  CHECK(w.probe_failures() == 0);
  // Probed again in the same epoch: the class is part of the identity, no probe is due.
  w.back_off("m1", t0);
  const auto again = w.judge_probe(answered(usable_server("m1")), on("m1"), t0);
  CHECK(again.identity.behaviour == "c1");
  CHECK(again.identity.fingerprint() != first.identity.fingerprint());
  CHECK(w.probe_failures() == 0);
  // A new process: the class is probed again.
  const auto restarted = w.judge_probe(answered(usable_server("m2")), on("m1"), t0);
  CHECK(restarted.identity.behaviour.empty());
  CHECK_FALSE(w.behaviour_known());
  // A restart behind a pinned marker forgets the class.
  w.adopt_behaviour(w.runtime_epoch(), "c2");
  w.forget_behaviour();
  CHECK_FALSE(w.behaviour_known());
}

TEST_CASE("the first behaviour probe: adopt a known class, suspect a silent one, confirm new",
          "[core][runtime_watch]") {
  using j = behaviour_judgement::action;
  const auto a = sig({876, 20881, 10599, 19006, 30564, 10210, 18655, 25625});
  const std::vector<behaviour_signature> none, known{a};
  // A server that cannot tell, and never told: the metadata fingerprint stays.
  auto r = runtime_watch::judge_first_behaviour(none, sig({}));
  CHECK(r.what == j::adopt);
  CHECK(r.class_id.empty());
  // One that told before for this metadata: the probe failed, not the model.
  r = runtime_watch::judge_first_behaviour(known, sig({}));
  CHECK(r.what == j::suspect);
  CHECK(r.why == "the probe answered without token probabilities, which this model's server "
                 "gave before");
  r = runtime_watch::judge_first_behaviour(known, a);
  CHECK(r.what == j::adopt);
  CHECK(r.class_id == behaviour_class_id(a));
  CHECK(runtime_watch::judge_first_behaviour(known, sig({1, 2, 3, 4, 5, 6, 7, 8})).what ==
        j::confirm);
  CHECK(runtime_watch::judge_first_behaviour(none, a).what == j::confirm);
}

}  // namespace runtime_watch_test
