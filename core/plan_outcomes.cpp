#include "core/plan_outcomes.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace kvp::core {

result<manifest> plan_outcomes::on_save(const save_step& step, const result<slot_saved>& r,
                                        steady_time now, std::string_view wall_now) {
  auto& rc = st_.records.get(step.hash);
  table_slot* sl = st_.table.find(step.slot);
  const bool owned = sl && sl->owner == step.hash;
  if (!r) {
    ++st_.stats.save_failures;
    st_.health.on_failure(r.err(), now);
    if (owned) sl->state = slot_state::dirty;
    return r.err();
  }
  st_.health.on_success();
  if (r->n_saved == 0) {
    // llama-server cleared the slot behind our back (idle-slot caching): the KV is gone.
    // Keep the previous generation (docs/design.md §8) and stop believing the owner is resident.
    ++st_.stats.empty_saves;
    if (owned) {
      sl->owner.clear();
      sl->state = slot_state::unknown;
    }
    return error{errc::save_empty, 0, "server saved 0 tokens; previous snapshot kept"};
  }
  if (r->n_written == 0) {
    ++st_.stats.save_failures;
    if (owned) sl->state = slot_state::dirty;
    return error{errc::save_failed, 0, "server reported 0 bytes written"};
  }
  ++st_.stats.saves;
  st_.stats.save_bytes += r->n_written;
  manifest m;
  if (rc.snapshot) {
    m = *rc.snapshot;
    // The generation not written now keeps what the previous save wrote there.
    m.previous_bytes = m.generation != step.generation ? m.bytes : m.previous_bytes;
  } else {
    m.session_id = rc.session_id;
    m.session_hash = step.hash;
    m.created_at = std::string(wall_now);
  }
  m.instance_key = st_.opts.instance_key;
  m.model_id = st_.runtime.model_path;
  m.runtime_fingerprint = st_.fingerprint;
  m.generation = step.generation;
  m.tokens = r->n_saved;
  m.bytes = r->n_written;
  m.revision = step.revision;
  m.state = snapshot_state::ready;
  m.invalid_reason.clear();
  m.updated_at = std::string(wall_now);
  m.save_ms = r->save_ms;
  m.compatibility = st_.compatibility;
  m.chain = rc.chain;  // at most max_chain_links (start_inference)
  m.credential = rc.credential;
  if (owned && sl->state == slot_state::saving) sl->state = slot_state::dirty;  // clean once stored
  return m;
}

void plan_outcomes::on_commit_failed(const error& e, steady_time now) {
  ++st_.stats.save_failures;
  --st_.stats.saves;  // counted by on_save, which preceded this
  st_.health.on_failure(e, now);
}

void plan_outcomes::store_manifest(const manifest& m) {
  const session_record& r = st_.records.store_manifest(m);
  for (auto& s : st_.table.slots())
    if (s.owner == m.session_hash && s.state == slot_state::dirty && !r.dirty())
      s.state = slot_state::ready;
}

restore_decision plan_outcomes::on_restore(const restore_step& step,
                                           const result<slot_restored>& r, steady_time now,
                                           std::string_view wall_now) {
  restore_decision d = restore_outcome(step, r, now, wall_now);
  table_slot& sl = *st_.table.find(step.slot);
  if (d.restored) {
    const manifest* m = st_.records.find_manifest(step.hash);
    sl.content = {content_whose::known, m ? m->credential : std::string(), step.hash};
  } else if (sl.state == slot_state::unknown) {
    // docs/design.md §20: what the failed restore left is unknown; where isolation is at
    // stake nobody may run on it before an erase.
    sl.content = {};
    if (st_.tenants.door().ask(sl.content, {}) == door_answer::erase_or_refuse)
      d.need_erase = d.erase_required = true;
  } else {
    sl.content = {content_whose::empty, {}, {}};  // llama-server cleared the slot
  }
  return d;
}

restore_decision plan_outcomes::restore_outcome(const restore_step& step,
                                                const result<slot_restored>& r, steady_time now,
                                                std::string_view wall_now) {
  restore_decision d;
  ++st_.stats.restores;
  auto& rc = st_.records.get(step.hash);
  table_slot& sl = *st_.table.find(step.slot);
  auto invalidate_snapshot = [&](errc code, std::string why) {
    ++st_.stats.invalidations;
    if (rc.snapshot) {
      rc.snapshot->state = snapshot_state::invalid;
      rc.snapshot->invalid_reason = std::string(to_string(code));
      rc.snapshot->updated_at = std::string(wall_now);
      d.write = *rc.snapshot;
    }
    d.err = error{code, 0, std::move(why)};
  };
  if (r) {
    st_.health.on_success();
    st_.stats.restore_bytes += r->n_read;
    const bool plausible = r->n_restored > 0 &&
                           (!st_.opts.verify_restore || r->n_restored == step.expected_tokens);
    if (plausible) {
      ++st_.stats.restore_hits;
      sl.state = slot_state::ready;
      sl.pending_kind = prepare_kind::restored;
      d.restored = true;
      return d;
    }
    // docs/design.md §9, invariant 10: an HTTP 200 is not a verified restore. The slot holds
    // something we can't vouch for: clear it and go cold.
    ++st_.stats.restore_failures;
    invalidate_snapshot(errc::snapshot_corrupt,
                        fmt::format("restored {} tokens, manifest says {}", r->n_restored,
                                    step.expected_tokens));
    d.need_erase = true;
    sl.state = slot_state::unknown;
    sl.pending_kind = prepare_kind::cold_fallback;
    return d;
  }
  ++st_.stats.restore_failures;
  const auto& e = r.err();
  if ((e.code == errc::snapshot_not_found || e.code == errc::snapshot_corrupt) &&
      e.http_status == 0) {
    // Checked before calling the server (shared-filesystem mode): the file is gone or not
    // the size that was saved; the slot was not touched and still holds someone else's
    // state, so erase it.
    invalidate_snapshot(e.code, e.message);
    d.need_erase = true;
    sl.state = slot_state::unknown;
  } else if (e.code == errc::slot_not_found) {
    // The slot is wrong, not the snapshot: keep the file for the next restore, which runs
    // after the coordinator has read the server's slot layout again.
    d.err = e;
    sl.state = slot_state::unknown;
  } else if (e.code == errc::backend_disconnected || e.code == errc::operation_timeout) {
    // The server took the request and then broke off or ran out of time. This snapshot
    // may be what broke it (llama-server aborts on some truncated files) or is too slow to
    // restore within the management timeout: don't offer it again.
    st_.health.on_failure(e, now);
    invalidate_snapshot(errc::restore_failed, e.message);
    sl.state = slot_state::unknown;
  } else if (e.http_status >= 400 && e.http_status < 500) {
    // The server rejected the file (missing, truncated, foreign layout) and, as it does on
    // every failed restore, cleared the slot (docs/llama-server.md §1.3). Never retry this file.
    st_.health.on_success();
    invalidate_snapshot(errc::restore_failed, e.message);
    sl.state = slot_state::idle;
  } else {
    // Transport failure or timeout: we do not know what the slot holds, but whatever it is,
    // llama-server compares tokens before reusing them, so running cold is still correct.
    st_.health.on_failure(e, now);
    d.err = e;
    sl.state = slot_state::unknown;
  }
  sl.pending_kind = prepare_kind::cold_fallback;
  return d;
}

bool plan_outcomes::on_erase(int slot, const result<slot_erased>& r, steady_time now) {
  table_slot& sl = *st_.table.find(slot);
  if (!r) {
    st_.health.on_failure(r.err(), now);
    sl.state = slot_state::unknown;
    sl.content = {};
    return false;
  }
  st_.health.on_success();
  sl.state = slot_state::idle;
  sl.content = {content_whose::empty, {}, {}};
  sl.owner.clear();  // nothing of it is left there (a plan's next step may take the slot)
  sl.idle_deadline.reset();
  return true;
}

// Also with persistence off (a strict-mode refusal): its slots are unowned and unknown, so
// only the pending request is dropped.
void plan_outcomes::abort_prepare(int slot) {
  table_slot& sl = *st_.table.find(slot);
  if (sl.state == slot_state::inference) {
    // Released without end_inference (the request coroutine failed after prepare): the
    // request may have reached the slot, so count it as a new revision (docs/design.md §7)
    // and leave the owner checkpointable.
    if (!sl.pending_aux && !sl.owner.empty()) {
      ++st_.records.get(sl.owner).dirty_rev;
      sl.state = slot_state::dirty;
    } else {
      sl.owner.clear();
      sl.state = slot_state::unknown;
    }
  } else {
    if (sl.state == slot_state::saving || sl.state == slot_state::restoring)
      sl.state = slot_state::unknown;
    if (sl.state == slot_state::unknown || sl.state == slot_state::idle) sl.owner.clear();
  }
  sl.pending_hash.clear();
  sl.pending_aux = false;
  sl.pending_kind = prepare_kind::none;
}

prepare_kind plan_outcomes::start_inference(const request_identity& who, int slot) {
  if (!st_.enabled) return prepare_kind::none;
  table_slot& sl = *st_.table.find(slot);
  const prepare_kind k = sl.pending_kind;
  sl.prepared_content = sl.content;
  sl.content = {content_whose::known, who.credential, sl.pending_aux ? std::string() : sl.pending_hash};
  if (sl.pending_aux) {
    sl.owner.clear();  // invariant 7: auxiliary output never belongs to a session
  } else {
    sl.owner = sl.pending_hash;
    // What the slot holds from now on. A request without a chain (a raw prompt, the admin
    // API's restore) after a restore of the session's own snapshot: the snapshot's.
    auto& r = st_.records.get(sl.owner);
    if (!who.chain.empty())
      r.chain.assign(who.chain.begin(),
                     who.chain.begin() + static_cast<std::ptrdiff_t>(std::min(
                                             who.chain.size(), max_chain_links)));
    else if (k == prepare_kind::restored && r.snapshot)
      r.chain = r.snapshot->chain;
    else
      r.chain.clear();
    r.credential = who.credential;
    if (k == prepare_kind::restored) ++r.reuse.restores;
    if (k == prepare_kind::cold || k == prepare_kind::cold_fallback) {
      ++st_.stats.cold_starts;
      if (st_.records.find_manifest(sl.owner)) ++st_.stats.restore_misses;
    }
  }
  sl.state = slot_state::inference;
  return k;
}

void plan_outcomes::note_reuse(const std::string& hash, prepare_kind kind, std::uint64_t reused,
                               double tokens_per_s) {
  if (kind == prepare_kind::none || kind == prepare_kind::auxiliary) return;
  session_record* rec = st_.records.find(hash);
  if (!rec) return;
  auto& r = rec->reuse;
  r.reused_tokens += reused;
  if (kind != prepare_kind::restored) return;
  r.reused_after_restore += reused;
  if (tokens_per_s > 0) r.prefill_seconds_saved += static_cast<double>(reused) / tokens_per_s;
}

std::optional<save_step> plan_outcomes::end_inference(int slot, bool reached_slot,
                                                      steady_time now, bool turn_end,
                                                      std::size_t session_slots) {
  table_slot& sl = *st_.table.find(slot);
  const bool aux = sl.pending_aux;
  sl.pending_hash.clear();
  sl.pending_aux = false;
  sl.pending_kind = prepare_kind::none;
  st_.table.touch(sl);
  if (!st_.enabled) return std::nullopt;
  if (!reached_slot && sl.prepared_content.whose == content_whose::empty) {
    // Nothing ran on the slot the plan erased (a body that cannot be pinned was refused): it
    // holds nobody's KV, and an owner shown an empty slot would look like a restart.
    sl.content = sl.prepared_content;
    sl.owner.clear();
  }
  if (aux || sl.owner.empty()) {
    sl.state = slot_state::unknown;  // foreign content: the next session restores or erases
    return std::nullopt;
  }
  auto& r = st_.records.get(sl.owner);
  st_.records.mark_used(r);
  // Design note 3: whatever reached the slot changed it, even a cancelled request.
  if (reached_slot) ++r.dirty_rev;
  const bool dirty = r.dirty();
  sl.state = dirty ? slot_state::dirty : slot_state::ready;
  if (!dirty) return std::nullopt;
  st_.checkpoints.note_turn(sl.owner, now);
  const double last_save_ms = r.snapshot ? r.snapshot->save_ms : 0;
  const std::size_t contended_over = session_slots > 0 ? session_slots : st_.table.session_slots();
  const auto idle_for =
      st_.checkpoints.idle_before_checkpoint(last_save_ms, turn_end, now, contended_over);
  if (idle_for.count() > 0) {
    sl.idle_deadline = now + idle_for;
    sl.idle_rev = r.dirty_rev;
  }
  if (st_.checkpoints.saves_at_end(turn_end) && st_.health.allow(now)) return st_.save_of(sl);
  return std::nullopt;
}

}  // namespace kvp::core
