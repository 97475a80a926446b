#include "core/runtime_watch.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace kvp::core {

namespace {

probe_decision disable(std::string why, errc code = errc::backend_unsupported) {
  probe_decision d;
  d.what = probe_decision::action::disable;
  d.why = std::move(why);
  d.code = code;
  return d;
}

}  // namespace

std::optional<probe_decision> runtime_watch::unusable(const server_probe& p,
                                                      const probe_context& ctx) {
  const auto& rt = p.runtime;
  if (!p.slot_actions)
    return disable("slot actions are disabled: start llama-server with --slot-save-path DIR");
  if (ctx.single_slot && rt.total_slots != 1)
    return disable(
        fmt::format("llama-server has {} slots; single-slot mode needs -np 1 (mode: auto "
                    "serves several)",
                    rt.total_slots));
  if (ctx.single_slot && ctx.slot_id >= rt.total_slots) {
    // llama-server would wrap the id onto another slot (docs/llama-server.md §1).
    return disable(fmt::format("slotId {} does not exist: llama-server has {} slot(s)",
                               ctx.slot_id, rt.total_slots),
                   errc::slot_not_found);
  }
  return std::nullopt;
}

probe_decision runtime_watch::judge_probe(const full_probe& fp, const probe_context& ctx,
                                          time_point now) {
  const auto& p = fp.probe;
  if (!p && p.err().code == errc::backend_unsupported) {
    // It answered, with something unusable (a /props too deep, without or with too many
    // slots): persistence stays off until a later probe reads a usable answer.
    return disable(p.err().message);
  }
  if (!p && fp.answering_marker) {
    // The server answers /props but the probe failed after it (a proxy that refuses
    // /v1/models, a slot probe that errs): requests run cold, the probe waits for its back-off.
    back_off(*fp.answering_marker, now);
    return disable("the runtime probe failed: " + p.err().message, errc::backend_unavailable);
  }
  if (!p) {
    probe_decision d;
    d.what = probe_decision::action::unavailable;
    d.why = p.err().message;
    d.code = p.err().code;
    return d;
  }
  if (auto refused = unusable(p.value(), ctx)) return std::move(*refused);
  probe_decision d;
  d.identity = p->runtime;
  d.identity.runtime_key = ctx.runtime_key;
  const auto meta_fp = d.identity.fingerprint();  // no behaviour yet: the metadata fingerprint
  d.verdict = ctx.compatibility_fingerprint == meta_fp ? ctx.compatibility_verdict : "unknown";
  if (d.verdict == "broken") {
    // docs/design.md §9: saves and restores would cost time and reuse nothing here.
    return disable("doctor --verify found this runtime broken: llama-server reprocesses "
                   "the whole prompt after a restore (hybrid or sliding-window model?)");
  }
  // The behaviour class holds as long as the epoch and the metadata do.
  meta_fingerprint_ = meta_fp;
  runtime_epoch_ = d.identity.media_marker + "|" + meta_fp;
  if (behaviour_known()) {
    d.identity.behaviour = behaviour_class_;
    probe_failures_ = 0;  // nothing left to probe for this epoch
  }
  d.what = probe_decision::action::adopt;
  d.restarted = ctx.persistence_enabled && d.identity.media_marker != ctx.current_marker;
  d.newly_ready = !ctx.persistence_enabled;
  return d;
}

void runtime_watch::back_off(const std::string& marker, time_point now) {
  ++probe_failures_;
  const int doublings = std::min(probe_failures_ - 1, 5);
  probe_retry_at_ =
      now + std::min<std::chrono::seconds>(probe_retry_first * (1 << doublings), probe_retry_cap);
  probe_retry_marker_ = marker;
}

behaviour_judgement runtime_watch::judge_first_behaviour(
    const std::vector<behaviour_signature>& known, const behaviour_signature& first) {
  behaviour_judgement j;
  if (first.top.empty()) {
    // A server that cannot tell keeps the metadata fingerprint; one that told before, for
    // this metadata, failed this probe: invalidating every snapshot on it would be wrong.
    if (known.empty()) {
      j.what = behaviour_judgement::action::adopt;
    } else {
      j.what = behaviour_judgement::action::suspect;
      j.why = "the probe answered without token probabilities, which this model's server "
              "gave before";
    }
    return j;
  }
  if (auto id = match_behaviour(known, first)) {
    j.what = behaviour_judgement::action::adopt;
    j.class_id = *id;
  }
  return j;  // confirm: another model, or noise
}

void runtime_watch::adopt_behaviour(const std::string& epoch, const std::string& id) {
  behaviour_epoch_ = epoch;
  behaviour_class_ = id;
  probe_failures_ = 0;
}

}  // namespace kvp::core
