#include "core/coordinator_core.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace kvp::core {

std::string_view to_string(slot_state s) {
  switch (s) {
    case slot_state::unknown: return "unknown";
    case slot_state::idle: return "idle";
    case slot_state::saving: return "saving";
    case slot_state::restoring: return "restoring";
    case slot_state::ready: return "ready";
    case slot_state::inference: return "inference";
    case slot_state::dirty: return "dirty";
  }
  return "unknown";
}

std::string_view to_string(prepare_kind k) {
  switch (k) {
    case prepare_kind::none: return "none";
    case prepare_kind::resident: return "resident";
    case prepare_kind::cold: return "cold";
    case prepare_kind::restored: return "restored";
    case prepare_kind::cold_fallback: return "cold_fallback";
    case prepare_kind::auxiliary: return "auxiliary";
  }
  return "none";
}

coordinator_core::coordinator_core(core_options opts)
    : opts_(std::move(opts)), breaker_(opts_.max_consecutive_failures, opts_.cooldown) {}

void coordinator_core::set_runtime(const runtime_info& rt) {
  const bool model_changed = enabled_ && rt.model_path != runtime_.model_path;
  runtime_ = rt;
  runtime_.runtime_key = opts_.runtime_key;
  fingerprint_ = runtime_.fingerprint();
  enabled_ = true;
  if (model_changed) on_epoch_change();
}

void coordinator_core::disable_persistence() {
  enabled_ = false;
  on_epoch_change();
}

void coordinator_core::on_epoch_change() {
  owner_.clear();
  state_ = slot_state::unknown;
  idle_deadline_.reset();
}

void coordinator_core::add_manifest(manifest m) {
  auto& r = sessions_[m.session_hash];
  r.session_id = m.session_id;
  if (m.state == snapshot_state::ready) r.saved_rev = r.dirty_rev = m.revision;
  r.snapshot = std::move(m);
}

std::string coordinator_core::hash_for(std::string_view session_id) const {
  if (!enabled_) return {};
  return session_hash(opts_.instance_key, runtime_.model_path, session_id);
}

coordinator_core::session_rec& coordinator_core::rec(const std::string& hash,
                                                     std::string_view session_id) {
  auto& r = sessions_[hash];
  if (r.session_id.empty()) r.session_id = std::string(session_id);
  return r;
}

bool coordinator_core::owner_dirty() const {
  if (owner_.empty()) return false;
  auto it = sessions_.find(owner_);
  return it != sessions_.end() && it->second.dirty_rev > it->second.saved_rev;
}

const manifest* coordinator_core::find_manifest(const std::string& hash) const {
  auto it = sessions_.find(hash);
  if (it == sessions_.end() || !it->second.snapshot) return nullptr;
  return &*it->second.snapshot;
}

std::vector<manifest> coordinator_core::manifests() const {
  std::vector<manifest> out;
  for (const auto& [h, r] : sessions_)
    if (r.snapshot) out.push_back(*r.snapshot);
  return out;
}

std::optional<save_step> coordinator_core::make_save(const std::string& hash) {
  auto& r = sessions_[hash];
  const char gen = r.snapshot ? r.snapshot->next_generation() : 'a';
  state_ = slot_state::saving;
  return save_step{opts_.slot_id, hash, snapshot_filename(hash, gen), gen, r.dirty_rev};
}

// Only failures that say "the server or the wire is unhappy" count towards the breaker.
// A 4xx on restore is the snapshot's fault and is handled by invalidating it.
void coordinator_core::record_backend_failure(const error& e, steady_time now) {
  if (e.code == errc::backend_unavailable || e.code == errc::operation_timeout ||
      e.http_status >= 500)
    breaker_.on_failure(now);
}

void coordinator_core::record_backend_success() { breaker_.on_success(); }

prepare_plan coordinator_core::prepare(const request_identity& who, steady_time now,
                                       std::string_view wall_now) {
  prepare_plan plan;
  plan.slot = opts_.slot_id;
  pending_aux_ = who.session_id.empty() || !who.purpose.empty();
  pending_hash_ = pending_aux_ ? std::string() : hash_for(who.session_id);
  pending_kind_ = pending_aux_ ? prepare_kind::auxiliary : prepare_kind::none;
  if (!enabled_) {
    pending_kind_ = prepare_kind::none;
    return plan;
  }
  idle_deadline_.reset();  // any request supersedes a pending idle checkpoint

  if (!pending_aux_ && owner_ == pending_hash_ && state_ != slot_state::unknown) {
    plan.resident = true;
    pending_kind_ = prepare_kind::resident;
    return plan;
  }

  const bool need_save = opts_.save_on_switch && owner_dirty();
  const bool need_calls = need_save || !pending_aux_;
  if (need_calls && !breaker_.allow(now)) {
    // Persistence is paused: run the request as it is. Whatever the slot held is about to
    // be overwritten, so nobody is resident afterwards except the requester.
    if (opts_.strict) {
      plan.fail = true;
      return plan;
    }
    owner_.clear();
    state_ = slot_state::unknown;
    if (!pending_aux_) {
      rec(pending_hash_, who.session_id);
      pending_kind_ = prepare_kind::cold;
    }
    return plan;
  }

  if (!owner_.empty() && owner_ != pending_hash_) ++stats_.switches;
  if (need_save) plan.save = make_save(owner_);
  if (pending_aux_) return plan;

  auto& r = rec(pending_hash_, who.session_id);
  if (r.snapshot && opts_.restore_enabled && r.snapshot->state == snapshot_state::ready) {
    if (r.snapshot->runtime_fingerprint == fingerprint_) {
      plan.restore = restore_step{opts_.slot_id, pending_hash_, r.snapshot->snapshot_file(),
                                  r.snapshot->tokens};
      if (!plan.save) state_ = slot_state::restoring;
    } else {
      // Spec §31: never restore across runtimes; mark, don't delete.
      r.snapshot->state = snapshot_state::invalid;
      r.snapshot->invalid_reason = std::string(to_string(errc::snapshot_incompatible));
      r.snapshot->updated_at = std::string(wall_now);
      ++stats_.invalidations;
      plan.manifest_writes.push_back(*r.snapshot);
    }
  }
  if (!plan.restore) {
    plan.erase = true;
    pending_kind_ = prepare_kind::cold;
  }
  return plan;
}

save_decision coordinator_core::on_save(const save_step& step, const result<slot_saved>& r,
                                        steady_time now, std::string_view wall_now) {
  save_decision d;
  auto& rc = sessions_[step.hash];
  const bool owned = owner_ == step.hash;
  if (!r) {
    ++stats_.save_failures;
    record_backend_failure(r.err(), now);
    if (owned) state_ = slot_state::dirty;
    d.err = r.err();
    return d;
  }
  record_backend_success();
  if (r->n_saved == 0) {
    // llama-server cleared the slot behind our back (idle-slot caching): the KV is gone.
    // Keep the previous generation (design note 4) and stop believing the owner is resident.
    ++stats_.empty_saves;
    if (owned) {
      owner_.clear();
      state_ = slot_state::unknown;
    }
    d.err = error{errc::save_empty, 0, "server saved 0 tokens; previous snapshot kept"};
    return d;
  }
  if (r->n_written == 0) {
    ++stats_.save_failures;
    if (owned) state_ = slot_state::dirty;
    d.err = error{errc::save_failed, 0, "server reported 0 bytes written"};
    return d;
  }
  ++stats_.saves;
  stats_.save_bytes += r->n_written;
  manifest m;
  if (rc.snapshot) {
    m = *rc.snapshot;
  } else {
    m.session_id = rc.session_id;
    m.session_hash = step.hash;
    m.created_at = std::string(wall_now);
  }
  m.instance_key = opts_.instance_key;
  m.model_id = runtime_.model_path;
  m.runtime_fingerprint = fingerprint_;
  m.generation = step.generation;
  m.tokens = r->n_saved;
  m.bytes = r->n_written;
  m.revision = step.revision;
  m.state = snapshot_state::ready;
  m.invalid_reason.clear();
  m.updated_at = std::string(wall_now);
  m.save_ms = r->save_ms;
  m.compatibility = compatibility_;
  if (owned && state_ == slot_state::saving) state_ = slot_state::dirty;  // clean once stored
  d.ok = true;
  d.write = std::move(m);
  return d;
}

void coordinator_core::store_manifest(const manifest& m) {
  auto& r = sessions_[m.session_hash];
  if (r.session_id.empty()) r.session_id = m.session_id;
  if (m.state == snapshot_state::ready) r.saved_rev = std::max(r.saved_rev, m.revision);
  r.snapshot = m;
  if (owner_ == m.session_hash && state_ == slot_state::dirty && r.dirty_rev <= r.saved_rev)
    state_ = slot_state::ready;
}

restore_decision coordinator_core::on_restore(const restore_step& step,
                                              const result<slot_restored>& r, steady_time now,
                                              std::string_view wall_now) {
  restore_decision d;
  ++stats_.restores;
  auto& rc = sessions_[step.hash];
  auto invalidate = [&](errc code, std::string why) {
    ++stats_.invalidations;
    if (rc.snapshot) {
      rc.snapshot->state = snapshot_state::invalid;
      rc.snapshot->invalid_reason = std::string(to_string(code));
      rc.snapshot->updated_at = std::string(wall_now);
      d.write = *rc.snapshot;
    }
    d.err = error{code, 0, std::move(why)};
  };
  if (r) {
    record_backend_success();
    stats_.restore_bytes += r->n_read;
    const bool plausible = r->n_restored > 0 &&
                           (!opts_.verify_restore || r->n_restored == step.expected_tokens);
    if (plausible) {
      ++stats_.restore_hits;
      state_ = slot_state::ready;
      pending_kind_ = prepare_kind::restored;
      d.restored = true;
      return d;
    }
    // Spec §24, invariant 10: an HTTP 200 is not a verified restore. The slot holds
    // something we can't vouch for: clear it and go cold.
    ++stats_.restore_failures;
    invalidate(errc::snapshot_corrupt,
               fmt::format("restored {} tokens, manifest says {}", r->n_restored,
                           step.expected_tokens));
    d.need_erase = true;
    state_ = slot_state::unknown;
    pending_kind_ = prepare_kind::cold_fallback;
    return d;
  }
  ++stats_.restore_failures;
  const auto& e = r.err();
  if (e.code == errc::snapshot_not_found && e.http_status == 0) {
    // Checked before calling the server (shared-filesystem mode): the file is gone, the
    // slot was not touched and still holds someone else's state, so erase it.
    invalidate(errc::snapshot_not_found, e.message);
    d.need_erase = true;
    state_ = slot_state::unknown;
  } else if (e.http_status >= 400 && e.http_status < 500) {
    // The server rejected the file (missing, truncated, foreign layout) and, as it does on
    // every failed restore, cleared the slot (llama-server.md §1.3). Never retry this file.
    record_backend_success();
    invalidate(errc::restore_failed, e.message);
    state_ = slot_state::idle;
  } else {
    // Transport failure or timeout: we do not know what the slot holds, but whatever it is,
    // llama-server compares tokens before reusing them, so running cold is still correct.
    record_backend_failure(e, now);
    d.err = e;
    state_ = slot_state::unknown;
  }
  pending_kind_ = prepare_kind::cold_fallback;
  return d;
}

bool coordinator_core::on_erase(const result<slot_erased>& r, steady_time now) {
  if (!r) {
    record_backend_failure(r.err(), now);
    state_ = slot_state::unknown;
    return false;
  }
  record_backend_success();
  state_ = slot_state::idle;
  return true;
}

void coordinator_core::abort_prepare() {
  if (!enabled_) return;
  if (state_ == slot_state::inference) {
    // Released without end_inference (the request coroutine failed after prepare): the
    // request may have reached the slot, so count it as a new revision (design note 3)
    // and leave the owner checkpointable.
    if (!pending_aux_ && !owner_.empty()) {
      auto& r = sessions_[owner_];
      ++r.dirty_rev;
      state_ = slot_state::dirty;
    } else {
      owner_.clear();
      state_ = slot_state::unknown;
    }
    pending_hash_.clear();
    pending_aux_ = false;
    pending_kind_ = prepare_kind::none;
    return;
  }
  if (state_ == slot_state::saving || state_ == slot_state::restoring) state_ = slot_state::unknown;
  if (state_ == slot_state::unknown || state_ == slot_state::idle) owner_.clear();
  pending_hash_.clear();
  pending_aux_ = false;
  pending_kind_ = prepare_kind::none;
}

prepare_kind coordinator_core::start_inference(const request_identity& who) {
  (void)who;
  if (!enabled_) return prepare_kind::none;
  const prepare_kind k = pending_kind_;
  if (pending_aux_) {
    owner_.clear();  // invariant 7: auxiliary output never belongs to a session
  } else {
    owner_ = pending_hash_;
    if (k == prepare_kind::cold || k == prepare_kind::cold_fallback) ++stats_.cold_starts;
  }
  state_ = slot_state::inference;
  return k;
}

std::optional<save_step> coordinator_core::end_inference(bool reached_slot, steady_time now) {
  const bool aux = pending_aux_;
  pending_hash_.clear();
  pending_aux_ = false;
  pending_kind_ = prepare_kind::none;
  if (!enabled_) return std::nullopt;
  if (aux || owner_.empty()) {
    state_ = slot_state::unknown;  // foreign content: the next session restores or erases
    return std::nullopt;
  }
  auto& r = sessions_[owner_];
  // Design note 3: whatever reached the slot changed it, even a cancelled request.
  if (reached_slot) ++r.dirty_rev;
  const bool dirty = r.dirty_rev > r.saved_rev;
  state_ = dirty ? slot_state::dirty : slot_state::ready;
  if (!dirty) return std::nullopt;
  if (opts_.idle_checkpoint.count() > 0) {
    idle_deadline_ = now + opts_.idle_checkpoint;
    idle_rev_ = r.dirty_rev;
  }
  if (opts_.save_on_turn_end && breaker_.allow(now)) return make_save(owner_);
  return std::nullopt;
}

std::optional<save_step> coordinator_core::idle_checkpoint(steady_time now) {
  if (!idle_deadline_ || now < *idle_deadline_) return std::nullopt;
  idle_deadline_.reset();
  if (!enabled_ || owner_.empty() || state_ != slot_state::dirty) return std::nullopt;
  const auto& r = sessions_[owner_];
  if (r.dirty_rev != idle_rev_ || r.dirty_rev <= r.saved_rev) return std::nullopt;
  if (!breaker_.allow(now)) return std::nullopt;
  return make_save(owner_);
}

std::optional<save_step> coordinator_core::checkpoint_owner(steady_time now) {
  if (!enabled_ || !owner_dirty() || state_ != slot_state::dirty) return std::nullopt;
  if (!breaker_.allow(now)) return std::nullopt;
  idle_deadline_.reset();
  return make_save(owner_);
}

}  // namespace kvp::core

namespace kvp::core {

std::optional<manifest> coordinator_core::invalidate(const std::string& hash, errc reason,
                                                     std::string_view wall_now) {
  auto it = sessions_.find(hash);
  if (it == sessions_.end() || !it->second.snapshot) return std::nullopt;
  auto& m = *it->second.snapshot;
  m.state = snapshot_state::invalid;
  m.invalid_reason = std::string(to_string(reason));
  m.updated_at = std::string(wall_now);
  ++stats_.invalidations;
  return m;
}

bool coordinator_core::forget(const std::string& hash) {
  const bool known = sessions_.erase(hash) > 0;
  if (owner_ == hash) {
    owner_.clear();
    state_ = slot_state::unknown;
    idle_deadline_.reset();
  }
  return known;
}

std::optional<save_step> coordinator_core::checkpoint_session(const std::string& hash,
                                                              steady_time now) {
  if (owner_ != hash) return std::nullopt;
  return checkpoint_owner(now);
}

std::vector<coordinator_core::session_view> coordinator_core::sessions() const {
  std::vector<session_view> out;
  for (const auto& [h, r] : sessions_) {
    auto v = session(h);
    if (v) out.push_back(std::move(*v));
  }
  return out;
}

std::optional<coordinator_core::session_view> coordinator_core::session(
    const std::string& hash) const {
  auto it = sessions_.find(hash);
  if (it == sessions_.end()) return std::nullopt;
  session_view v;
  v.hash = hash;
  v.session_id = it->second.session_id;
  v.resident = owner_ == hash && state_ != slot_state::unknown;
  v.dirty = it->second.dirty_rev > it->second.saved_rev && v.resident;
  v.snapshot = it->second.snapshot ? &*it->second.snapshot : nullptr;
  return v;
}

}  // namespace kvp::core
