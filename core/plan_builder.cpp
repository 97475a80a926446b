#include "core/plan_builder.hpp"

namespace kvp::core {

namespace {

bool is_auxiliary(const request_identity& who) { return who.session_id.empty() || !who.purpose.empty(); }

// The slot is erased before the request; a required erase (the door's erase_or_refuse) that
// fails fails the request.
void plan_erase_first(prepare_plan& plan, door_answer answer) {
  plan.erase = true;
  plan.erase_required = answer == door_answer::erase_or_refuse;
}

}  // namespace

door_answer plan_builder::door_for(int slot, const request_identity& who) const {
  const table_slot* sl = st_.table.find(slot);
  if (!sl) return door_answer::erase_or_refuse;
  const bool aux = is_auxiliary(who);
  const std::string hash = aux ? std::string() : st_.keys.key(who);
  return st_.tenants.door().ask(sl->content, {who.credential, hash, aux});
}

prepare_plan plan_builder::prepare(const request_identity& who, int slot, steady_time now,
                                   std::string_view wall_now) {
  prepare_plan plan;
  plan.slot = slot;
  table_slot& sl = *st_.table.find(slot);
  sl.pending_aux = is_auxiliary(who);
  sl.pending_hash = sl.pending_aux ? std::string() : st_.keys.key(who);
  sl.pending_kind = sl.pending_aux ? prepare_kind::auxiliary : prepare_kind::none;
  if (!st_.enabled) {
    // Strict mode promises that a session's turns are persisted: without persistence its
    // requests are refused. Auxiliary output is never persisted, so it runs.
    plan.fail = st_.opts.strict && !sl.pending_aux;
    plan.fail_code = st_.disabled_reason;
    sl.pending_kind = prepare_kind::none;
    return plan;
  }
  sl.idle_deadline.reset();  // any request supersedes a pending idle checkpoint

  if (!sl.pending_aux && sl.owner == sl.pending_hash && sl.state != slot_state::unknown) {
    plan.resident = true;
    sl.pending_kind = prepare_kind::resident;
    return plan;
  }

  // docs/design.md §20, §24: the door says whether the request may run on what the slot
  // holds; if not, it is erased first on every path, and a required erase that fails fails
  // the request.
  st_.tenants.note_credential(who.credential);
  const auto answer =
      st_.tenants.door().ask(sl.content, {who.credential, sl.pending_hash, sl.pending_aux});
  const bool need_save = st_.checkpoints.saves_on_switch() && st_.records.dirty(sl.owner);
  if ((need_save || !sl.pending_aux) && !st_.health.allow(now))
    return paused_plan(std::move(plan), sl, who, answer);

  // What the slot holds now counts as a candidate (docs/design.md §3); a save below marks it.
  const std::size_t in_slot = st_.seeds().shared_with_slot(sl, who);
  if (!sl.owner.empty() && sl.owner != sl.pending_hash) ++st_.stats.switches;
  if (need_save) plan.save = st_.save_of(sl);
  // An auxiliary call runs on what the slot holds within the scope. Content nobody knows
  // of with one credential seen (a slot no request used yet) is no other tenant's: no erase.
  if (sl.pending_aux) {
    if (answer != door_answer::run) plan_erase_first(plan, answer);
    return plan;
  }
  choose_content(plan, sl, who, answer, in_slot, wall_now);
  return plan;
}

// Persistence is paused (the breaker is open): run the request as it is. Whatever the slot
// held is about to be overwritten, so nobody is resident afterwards except the requester.
// Isolation is no persistence: an erase it requires is tried even now.
prepare_plan plan_builder::paused_plan(prepare_plan plan, table_slot& sl,
                                       const request_identity& who, door_answer answer) {
  if (st_.opts.strict) {
    plan.fail = true;
    plan.fail_code = errc::backend_unavailable;
    return plan;
  }
  sl.owner.clear();
  sl.state = slot_state::unknown;
  if (answer == door_answer::erase_or_refuse) plan_erase_first(plan, answer);
  if (!sl.pending_aux) {
    touch_record(sl.pending_hash, who.session_id);
    sl.pending_kind = prepare_kind::cold;
  }
  return plan;
}

// docs/design.md §3, §20: a session request's candidates, ranked. A seed that shares more than
// the slot's content; else the session's own snapshot when it shares at least as much (or the
// overlap cannot be told); else the slot's content, kept when the scope allows it (llama-server
// reuses the exact common token prefix, never worse than an empty slot); else an erase.
void plan_builder::choose_content(prepare_plan& plan, table_slot& sl, const request_identity& who,
                                  door_answer answer, std::size_t in_slot,
                                  std::string_view wall_now) {
  auto& r = touch_record(sl.pending_hash, who.session_id);
  const auto own = own_snapshot_usable(r, plan, who, wall_now);
  const auto seed = own && *own == unknown_overlap
                        ? std::nullopt
                        : st_.seeds().best_seed(who, sl.pending_hash, own.value_or(0));
  if (seed && seed->common > in_slot) {
    const manifest& m = *st_.records.find_manifest(seed->hash);
    plan.restore = restore_step{sl.id,   seed->hash, m.snapshot_file(), m.tokens,
                                m.bytes, sl.pending_hash, seed->common};
  } else if (own && (*own >= in_slot || *own == unknown_overlap)) {
    plan.restore = restore_step{sl.id, sl.pending_hash, r.snapshot->snapshot_file(),
                                r.snapshot->tokens, r.snapshot->bytes, {}, 0};
  } else if (answer == door_answer::run && st_.keeps_content()) {
    sl.pending_kind = prepare_kind::cold;
    plan.kept = true;
    plan.kept_links = in_slot;
    return;
  }
  if (plan.restore && !plan.save) sl.state = slot_state::restoring;
  if (!plan.restore) {
    plan_erase_first(plan, answer);
    sl.pending_kind = prepare_kind::cold;
  }
}

// The session's own snapshot, when it may be restored: nullopt, or how many links it shares
// with the request (unknown_overlap when either chain is unknown: then it is restored as
// before seeding existed). One from another runtime is marked invalid here (§9).
std::optional<std::size_t> plan_builder::own_snapshot_usable(session_record& r, prepare_plan& plan,
                                                             const request_identity& who,
                                                             std::string_view wall_now) {
  if (!r.snapshot || !st_.opts.restore_enabled || r.snapshot->state != snapshot_state::ready)
    return std::nullopt;
  if (r.snapshot->runtime_fingerprint != st_.fingerprint) {
    // docs/design.md §9: never restore across runtimes; mark, don't delete.
    r.snapshot->state = snapshot_state::invalid;
    r.snapshot->invalid_reason = std::string(to_string(errc::snapshot_incompatible));
    r.snapshot->updated_at = std::string(wall_now);
    ++st_.stats.invalidations;
    plan.manifest_writes.push_back(*r.snapshot);
    return std::nullopt;
  }
  if (r.snapshot->chain.empty() || who.chain.empty()) return unknown_overlap;
  return common_links(r.snapshot->chain, who.chain);
}

session_record& plan_builder::touch_record(const std::string& hash, std::string_view session_id) {
  return st_.records.touch(hash, session_id,
                           [this](const std::string& h) { return st_.table.in_use(h); });
}

std::optional<save_step> plan_builder::idle_checkpoint(int slot, steady_time now) {
  table_slot& sl = *st_.table.find(slot);
  if (!sl.idle_deadline || now < *sl.idle_deadline) return std::nullopt;
  sl.idle_deadline.reset();
  if (!st_.enabled || sl.owner.empty() || sl.state != slot_state::dirty) return std::nullopt;
  const auto& r = st_.records.get(sl.owner);
  if (r.dirty_rev != sl.idle_rev || !r.dirty()) return std::nullopt;
  if (!st_.health.allow(now)) return std::nullopt;
  return st_.save_of(sl);
}

std::optional<save_step> plan_builder::checkpoint_slot(int slot, steady_time now) {
  table_slot* sl = st_.table.find(slot);
  if (!sl || !st_.enabled || !st_.records.dirty(sl->owner) || sl->state != slot_state::dirty)
    return std::nullopt;
  if (!st_.health.allow(now)) return std::nullopt;
  sl->idle_deadline.reset();
  return st_.save_of(*sl);
}

std::optional<save_step> plan_builder::checkpoint_session(const std::string& hash,
                                                          steady_time now) {
  const int slot = st_.table.slot_of(hash);
  if (slot < 0) return std::nullopt;
  return checkpoint_slot(slot, now);
}

bool plan_builder::release_session(const std::string& hash) {
  const int slot = st_.table.slot_of(hash);
  if (slot < 0) return true;
  if (st_.records.dirty(st_.table.owner(slot))) return false;
  st_.table.forget_slot(slot);
  return true;
}

std::optional<manifest> plan_builder::invalidate(const std::string& hash, errc reason,
                                                 std::string_view wall_now, std::string_view note) {
  auto m = st_.records.invalidate(hash, reason, wall_now, note);
  if (m) ++st_.stats.invalidations;
  return m;
}

bool plan_builder::forget(const std::string& hash) {
  const bool known = st_.records.forget(hash);
  const int slot = st_.table.slot_of(hash);
  if (slot >= 0) st_.table.forget_slot(slot);
  return known;
}

}  // namespace kvp::core
