#include "core/slot_pool.hpp"

#include "core/log.hpp"
#include "core/prefix_snapshot.hpp"

#include <algorithm>
#include <utility>
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

namespace {

// Revisions compare as serial numbers (RFC 1982): `a` is after `b` when it is less than 2^63
// steps ahead, so a counter that wraps past 2^64-1 still reads as newer than the saved one.
bool rev_after(std::uint64_t a, std::uint64_t b) { return static_cast<std::int64_t>(a - b) > 0; }
std::uint64_t rev_latest(std::uint64_t a, std::uint64_t b) { return rev_after(a, b) ? a : b; }

}  // namespace

bool slot_pool::session_rec::dirty() const { return rev_after(dirty_rev, saved_rev); }

namespace {

checkpoint_options checkpoint_options_of(const slot_pool_options& o) {
  return {o.save_on_switch,   o.save_on_turn_end, o.save_on_step_end,
          o.idle_checkpoint, o.early_checkpoint,  o.contention_window};
}

}  // namespace

slot_pool::slot_pool(slot_pool_options opts)
    : opts_(std::move(opts)),
      health_(opts_.max_consecutive_failures, opts_.cooldown),
      checkpoints_(checkpoint_options_of(opts_)),
      tenancy_(sharing_scope(opts_.seed_across_sessions, opts_.seed_within_credential)),
      keys_(opts_.instance_key, tenancy_.scoped_by_credential()) {
  slots_.push_back(make_slot(opts_.slot_id));
}

slot_pool::slot_rec slot_pool::make_slot(int id) {
  slot_rec s;
  s.id = id;
  return s;
}

slot_pool::slot_rec* slot_pool::find_slot(int id) {
  for (auto& s : slots_)
    if (s.id == id) return &s;
  return nullptr;
}

const slot_pool::slot_rec* slot_pool::find_slot(int id) const {
  for (const auto& s : slots_)
    if (s.id == id) return &s;
  return nullptr;
}

void slot_pool::set_slots(const std::vector<int>& ids) {
  if (ids.empty()) return;
  bool same = ids.size() == slots_.size();
  for (std::size_t i = 0; same && i < ids.size(); ++i) same = slots_[i].id == ids[i];
  if (same) return;
  slots_.clear();
  for (int id : ids) slots_.push_back(make_slot(id));
}

std::vector<int> slot_pool::slot_ids() const {
  std::vector<int> out;
  for (const auto& s : slots_) out.push_back(s.id);
  return out;
}

int slot_pool::aux_slot() const {
  return opts_.reserve_aux_slot && slots_.size() > 1 ? slots_.back().id : -1;
}

void slot_pool::set_runtime(const runtime_info& rt) {
  const bool model_changed = enabled_ && rt.model_path != runtime_.model_path;
  const std::string before = fingerprint_;
  runtime_ = rt;
  runtime_.runtime_key = opts_.runtime_key;
  keys_.set_model(runtime_.model_path);
  fingerprint_ = runtime_.fingerprint();
  // Another runtime in the same process (LoRA scales changed): no slot holds KV it can use.
  const bool runtime_changed = enabled_ && fingerprint_ != before;
  enabled_ = true;
  if (model_changed || runtime_changed) {
    on_epoch_change();
    // Adapters changed in the same process: the slots keep KV that nobody may reuse blindly.
    if (!model_changed)
      for (auto& s : slots_) s.content = {};
  }
}

// Requests now run without a plan: what the slots hold is unknown, as after a stall.
void slot_pool::disable_persistence(errc why) {
  enabled_ = false;
  disabled_reason_ = why;
  keys_.clear();
  on_unreachable();
}

void slot_pool::on_epoch_change() {
  for (auto& s : slots_) {
    s.owner.clear();
    s.state = slot_state::unknown;
    s.idle_deadline.reset();
    s.content = {content_whose::empty, {}, {}};  // a new process holds nothing
  }
}

namespace {

// What may be in a slot after kvpersist lost sight of it: known content stays its
// credential's; an empty slot is unknown, of nobody known.
slot_content unknown_since(const slot_content& c) {
  switch (c.whose) {
    case content_whose::known: return {content_whose::unknown, c.credential, {}, true};
    case content_whose::unknown: return c;
    case content_whose::empty: break;
  }
  return {};
}

}  // namespace

void slot_pool::on_unreachable() {
  for (auto& s : slots_) {
    s.owner.clear();
    s.state = slot_state::unknown;
    s.idle_deadline.reset();
    s.content = unknown_since(s.content);
  }
}

bool slot_pool::pass_through_needs_erase(const std::string& credential) const {
  // docs/design.md §24: the whole server is one slot's worth of content.
  const slot_door d = tenancy_.door_with(credential);
  return std::any_of(slots_.begin(), slots_.end(), [&](const slot_rec& s) {
    return d.ask(s.content, {credential, {}, true}) == door_answer::erase_or_refuse;
  });
}

void slot_pool::note_pass_through(const std::string& credential) {
  tenancy_.note_credential(credential);
  for (auto& s : slots_) {
    const auto& c = s.content;
    const bool its_own = c.whose == content_whose::empty ||
                         ((c.whose == content_whose::known || c.credential_known) &&
                          c.credential == credential);
    s.owner.clear();
    s.state = slot_state::unknown;
    s.content = its_own ? slot_content{content_whose::unknown, credential, {}, true}
                        : slot_content{};
  }
}

void slot_pool::on_server_erased() {
  for (auto& s : slots_) s.content = {content_whose::empty, {}, {}};
}

void slot_pool::forget_slot(int slot) {
  if (auto* s = find_slot(slot)) {
    s->owner.clear();
    s->state = slot_state::unknown;
    s->idle_deadline.reset();
    s->content = {};
  }
}

void slot_pool::forget_emptied_slot(int slot) {
  forget_slot(slot);
  if (auto* s = find_slot(slot)) s->content = {content_whose::empty, {}, {}};
}

std::vector<isolating_erase> slot_pool::erases_before_unpinned(const request_identity& who) {
  tenancy_.note_credential(who.credential);
  // No session's turn runs there: the door asks as for an auxiliary call (docs/design.md §24).
  const door_request unpinned{who.credential, {}, true};
  std::vector<isolating_erase> out;
  for (const auto& s : slots_) {
    const auto answer = tenancy_.door().ask(s.content, unpinned);
    if (answer != door_answer::run) out.push_back({s.id, answer == door_answer::erase_or_refuse});
  }
  return out;
}

void slot_pool::note_unpinned_ran(int slot, const std::string& credential) {
  forget_slot(slot);
  if (auto* s = find_slot(slot)) s->content = {content_whose::known, credential, {}};
}

void slot_pool::add_manifest(manifest m) {
  if (slot_of(m.session_hash) >= 0) return;  // resident here: our record is newer
  auto [it, fresh] = sessions_.try_emplace(m.session_hash);
  auto& r = it->second;
  r.session_id = m.session_id;
  if (r.credential.empty()) r.credential = m.credential;
  tenancy_.note_credential(m.credential);
  if (m.state == snapshot_state::ready)
    r.saved_rev = r.dirty_rev = fresh ? m.revision : rev_latest(r.dirty_rev, m.revision);
  set_snapshot(it->first, r, std::move(m));
}

// Every change of a session's snapshot goes through here, so the chain index stays current.
void slot_pool::set_snapshot(const std::string& hash, session_rec& r, manifest m) {
  if (m.state == snapshot_state::ready)
    index_.put(hash, m.chain);
  else
    index_.erase(hash);
  r.snapshot = std::move(m);
}

std::string slot_pool::hash_for(std::string_view session_id) const { return keys_.key(session_id); }

std::string slot_pool::hash_for(const request_identity& who) const { return keys_.key(who); }

// docs/design.md §20: a header names a conversation by its preamble (tools, options, system
// prompt: link 0). A request under the header with another preamble (a title call, a
// sub-agent) is the sub-session `<id>#<its link 0>`. An empty preamble names nothing: the
// header decides, as it does before the session's first request is known.
void slot_pool::resolve_session(request_identity& who) const {
  if (!enabled_ || who.session_id.empty() || !who.purpose.empty() ||
      is_content_session(who.session_id) || who.chain.empty() || who.min_shared_links > 1)
    return;
  const auto it = sessions_.find(hash_for(who));
  if (it == sessions_.end()) return;
  const session_rec& r = it->second;
  const auto& held = !r.chain.empty() || !r.snapshot ? r.chain : r.snapshot->chain;
  if (held.empty() || held.front() == who.chain.front()) return;
  who.session_id = sub_session_id(who.session_id, to_hex(who.chain.front()).substr(0, 16));
}

door_answer slot_pool::door_for(int slot, const request_identity& who) const {
  const slot_rec* sl = find_slot(slot);
  if (!sl) return door_answer::erase_or_refuse;
  const bool aux = who.session_id.empty() || !who.purpose.empty();
  const std::string hash = aux ? std::string() : hash_for(who);
  return tenancy_.door().ask(sl->content, {who.credential, hash, aux});
}


const slot_content& slot_pool::content(int slot) const {
  static const slot_content none;
  const slot_rec* sl = find_slot(slot);
  return sl ? sl->content : none;
}

// A kept slot pays only for model kinds that reuse a prefix of foreign KV; the others
// (`doctor --verify`: experimental or broken) reprocess it anyway, so they get an erase.
bool slot_pool::keeps_content() const {
  return compatibility_ != "experimental" && compatibility_ != "broken";
}

slot_pool::session_rec& slot_pool::rec(const std::string& hash,
                                                     std::string_view session_id) {
  auto [it, fresh] = sessions_.try_emplace(hash);
  auto& r = it->second;
  if (r.session_id.empty()) r.session_id = std::string(session_id);
  r.last_used = ++record_clock_;
  if (fresh) forget_least_recent_records(hash);
  return r;
}

// docs/design.md §12: records without a snapshot beyond max_records_without_snapshot go, the
// least recently used first. One that a slot holds or is being prepared for stays (so does
// `keep`, the record just made): nothing a resident or leased session needs is dropped.
void slot_pool::forget_least_recent_records(const std::string& keep) {
  const std::size_t limit = opts_.max_records_without_snapshot;
  if (sessions_.size() <= limit) return;
  std::vector<std::pair<std::uint64_t, const std::string*>> idle;
  std::size_t without = 0;
  for (const auto& [h, r] : sessions_) {
    if (r.snapshot) continue;
    ++without;
    if (h != keep && !in_use(h)) idle.emplace_back(r.last_used, &h);
  }
  if (without <= limit) return;
  const auto n = static_cast<std::ptrdiff_t>(std::min(without - limit, idle.size()));
  std::partial_sort(idle.begin(), idle.begin() + n, idle.end());
  std::vector<std::string> victims;
  for (auto it = idle.begin(); it != idle.begin() + n; ++it) victims.push_back(*it->second);
  for (auto& h : victims) {
    forget(h);
    forgotten_records_.push_back(std::move(h));
  }
}

std::vector<std::string> slot_pool::take_forgotten_records() {
  return std::exchange(forgotten_records_, {});
}

int slot_pool::slot_of(const std::string& hash) const {
  if (hash.empty()) return -1;
  for (const auto& s : slots_)
    if (s.owner == hash) return s.id;
  return -1;
}

const std::string& slot_pool::owner(int slot) const {
  static const std::string none;
  const auto* s = find_slot(slot);
  return s ? s->owner : none;
}

slot_state slot_pool::state(int slot) const {
  const auto* s = find_slot(slot);
  return s ? s->state : slot_state::unknown;
}

bool slot_pool::owner_dirty(int slot) const {
  const auto* s = find_slot(slot);
  if (!s || s->owner.empty()) return false;
  auto it = sessions_.find(s->owner);
  return it != sessions_.end() && it->second.dirty();
}

const manifest* slot_pool::find_manifest(const std::string& hash) const {
  auto it = sessions_.find(hash);
  if (it == sessions_.end() || !it->second.snapshot) return nullptr;
  return &*it->second.snapshot;
}

std::vector<manifest> slot_pool::manifests() const {
  std::vector<manifest> out;
  for (const auto& [h, r] : sessions_)
    if (r.snapshot) out.push_back(*r.snapshot);
  return out;
}

std::optional<save_step> slot_pool::make_save(slot_rec& s) {
  auto& r = sessions_[s.owner];
  const char gen = r.snapshot ? r.snapshot->next_generation() : 'a';
  s.state = slot_state::saving;
  return save_step{s.id, s.owner, snapshot_filename(s.owner, gen), gen, r.dirty_rev};
}

std::optional<int> slot_pool::choose_slot(const request_identity& who,
                                                 const std::vector<int>& free_slots) const {
  auto is_free = [&](int id) {
    return std::find(free_slots.begin(), free_slots.end(), id) != free_slots.end();
  };
  const bool aux = who.session_id.empty() || !who.purpose.empty();
  const int reserved = aux_slot();
  if (aux && reserved >= 0) return is_free(reserved) ? std::optional<int>(reserved) : std::nullopt;
  if (!aux && enabled_) {
    const std::string h = hash_for(who);
    int own = slot_of(h);
    for (const auto& s : slots_)
      if (own < 0 && s.pending_hash == h) own = s.id;  // being prepared for this session
    if (own >= 0) return is_free(own) ? std::optional<int>(own) : std::nullopt;
  }
  const slot_rec* best = nullptr;
  auto rank = [&](const slot_rec& s) {
    if (s.owner.empty()) return 0;           // empty (or unknown) first
    return owner_dirty(s.id) ? 2 : 1;        // then clean, then dirty
  };
  for (const auto& s : slots_) {
    if (s.id == reserved || !is_free(s.id)) continue;
    if (!best || rank(s) < rank(*best) || (rank(s) == rank(*best) && s.last_used < best->last_used))
      best = &s;
  }
  if (!best) return std::nullopt;
  return best->id;
}

prepare_plan slot_pool::prepare(const request_identity& who, int slot, steady_time now,
                                       std::string_view wall_now) {
  prepare_plan plan;
  plan.slot = slot;
  slot_rec& sl = *find_slot(slot);
  sl.pending_aux = who.session_id.empty() || !who.purpose.empty();
  sl.pending_hash = sl.pending_aux ? std::string() : hash_for(who);
  sl.pending_kind = sl.pending_aux ? prepare_kind::auxiliary : prepare_kind::none;
  if (!enabled_) {
    // Strict mode promises that a session's turns are persisted: without persistence its
    // requests are refused. Auxiliary output is never persisted, so it runs.
    plan.fail = opts_.strict && !sl.pending_aux;
    plan.fail_code = disabled_reason_;
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
  tenancy_.note_credential(who.credential);
  const auto answer = tenancy_.door().ask(sl.content, {who.credential, sl.pending_hash, sl.pending_aux});
  const bool shareable = answer == door_answer::run;
  const bool must_erase = answer == door_answer::erase_or_refuse;
  auto isolate = [&] {
    plan.erase = true;
    plan.erase_required = must_erase;
  };
  const bool need_save = checkpoints_.saves_on_switch() && owner_dirty(slot);
  const bool need_calls = need_save || !sl.pending_aux;
  if (need_calls && !health_.allow(now)) {
    // Persistence is paused: run the request as it is. Whatever the slot held is about to
    // be overwritten, so nobody is resident afterwards except the requester. Isolation is no
    // persistence: an erase it requires is tried even now.
    if (opts_.strict) {
      plan.fail = true;
      plan.fail_code = errc::backend_unavailable;
      return plan;
    }
    sl.owner.clear();
    sl.state = slot_state::unknown;
    if (must_erase) isolate();
    if (!sl.pending_aux) {
      rec(sl.pending_hash, who.session_id);
      sl.pending_kind = prepare_kind::cold;
    }
    return plan;
  }

  // What the slot holds now counts as a candidate (docs/design.md §3); a save below marks it.
  const std::size_t in_slot = shared_with_slot(sl, who);
  if (!sl.owner.empty() && sl.owner != sl.pending_hash) ++stats_.switches;
  if (need_save) plan.save = make_save(sl);
  // An auxiliary call runs on what the slot holds within the scope. Content nobody knows
  // of with one credential seen (a slot no request used yet) is no other tenant's: no erase.
  if (sl.pending_aux) {
    if (!shareable) isolate();
    return plan;
  }

  auto& r = rec(sl.pending_hash, who.session_id);
  const auto own = own_snapshot_usable(r, plan, who, wall_now);
  const auto seed = own && *own == unknown_overlap
                        ? std::nullopt
                        : best_seed(who, sl.pending_hash, own.value_or(0));
  if (seed && seed->common > in_slot) {
    const manifest& m = *sessions_.at(seed->hash).snapshot;
    plan.restore = restore_step{slot,    seed->hash, m.snapshot_file(), m.tokens,
                                m.bytes, sl.pending_hash, seed->common};
  } else if (own && (*own >= in_slot || *own == unknown_overlap)) {
    plan.restore = restore_step{slot, sl.pending_hash, r.snapshot->snapshot_file(),
                                r.snapshot->tokens, r.snapshot->bytes, {}, 0};
  } else if (shareable && keeps_content()) {
    // docs/design.md §20: no erase; llama-server reuses the exact common token prefix, which
    // is never worse than an empty slot.
    sl.pending_kind = prepare_kind::cold;
    plan.kept = true;
    plan.kept_links = in_slot;
    return plan;
  }
  if (plan.restore && !plan.save) sl.state = slot_state::restoring;
  if (!plan.restore) {
    plan.erase = true;
    plan.erase_required = must_erase;
    sl.pending_kind = prepare_kind::cold;
  }
  return plan;
}

// The session's own snapshot, when it may be restored: nullopt, or how many links it shares
// with the request (unknown_overlap when either chain is unknown: then it is restored as
// before seeding existed). One from another runtime is marked invalid here (§9).
std::optional<std::size_t> slot_pool::own_snapshot_usable(session_rec& r, prepare_plan& plan,
                                                          const request_identity& who,
                                                          std::string_view wall_now) {
  if (!r.snapshot || !opts_.restore_enabled || r.snapshot->state != snapshot_state::ready)
    return std::nullopt;
  if (r.snapshot->runtime_fingerprint != fingerprint_) {
    // docs/design.md §9: never restore across runtimes; mark, don't delete.
    r.snapshot->state = snapshot_state::invalid;
    r.snapshot->invalid_reason = std::string(to_string(errc::snapshot_incompatible));
    r.snapshot->updated_at = std::string(wall_now);
    ++stats_.invalidations;
    plan.manifest_writes.push_back(*r.snapshot);
    return std::nullopt;
  }
  if (r.snapshot->chain.empty() || who.chain.empty()) return unknown_overlap;
  return common_links(r.snapshot->chain, who.chain);
}

// Seeding needs: the scope allows it, restores are on, and the model kind reuses a prefix of
// restored KV (a sliding-window or recurrent model judged experimental or broken by
// `doctor --verify` reprocesses everything unless the prompt continues the snapshot exactly).
bool slot_pool::seeding_allowed() const {
  return opts_.seed_across_sessions && opts_.restore_enabled &&
         compatibility_ != "experimental" && compatibility_ != "broken";
}

// Links the slot's current content shares with the request, when it is another session's,
// known, and within the sharing scope; 0 otherwise.
std::size_t slot_pool::shared_with_slot(const slot_rec& sl, const request_identity& who) const {
  if (!seeding_allowed() || sl.pending_aux || who.chain.empty() || sl.owner.empty() ||
      sl.owner == sl.pending_hash ||
      (sl.state != slot_state::ready && sl.state != slot_state::dirty))
    return 0;
  const auto it = sessions_.find(sl.owner);
  if (it == sessions_.end()) return 0;
  if (!tenancy_.door().lets_run(sl.content, {who.credential, sl.pending_hash, false})) return 0;
  const std::size_t common = common_links(it->second.chain, who.chain);
  return common >= who.min_shared_links ? common : 0;
}

// Another session's ready snapshot of this runtime, within the sharing scope, sharing more
// than `better_than` (and at least one) links with the request: among those sharing most, the
// one that reads the fewest bytes (a prefix snapshot before a whole donor, docs/design.md §3).
std::optional<chain_index::match> slot_pool::best_seed(const request_identity& who,
                                                       const std::string& own,
                                                       std::size_t better_than) const {
  if (!seeding_allowed() || who.chain.empty()) return std::nullopt;
  const auto matches = index_.all_longest(
      who.chain, std::max(who.min_shared_links, better_than + 1), [&](const std::string& h) {
        if (h == own) return false;
        const auto it = sessions_.find(h);
        if (it == sessions_.end() || !it->second.snapshot) return false;
        const manifest& m = *it->second.snapshot;
        return m.state == snapshot_state::ready && m.runtime_fingerprint == fingerprint_ &&
               (!opts_.seed_within_credential || m.credential == who.credential);
      });
  std::vector<seed_candidate> candidates;
  candidates.reserve(matches.size());
  for (const auto& m : matches)
    candidates.push_back({m.hash, m.common, sessions_.at(m.hash).snapshot->bytes});
  const auto best = fewest_bytes_seed(candidates);
  if (!best) return std::nullopt;
  return chain_index::match{best->hash, best->common};
}

result<manifest> slot_pool::on_save(const save_step& step, const result<slot_saved>& r,
                                    steady_time now, std::string_view wall_now) {
  auto& rc = sessions_[step.hash];
  slot_rec* sl = find_slot(step.slot);
  const bool owned = sl && sl->owner == step.hash;
  if (!r) {
    ++stats_.save_failures;
    health_.on_failure(r.err(), now);
    if (owned) sl->state = slot_state::dirty;
    return r.err();
  }
  health_.on_success();
  if (r->n_saved == 0) {
    // llama-server cleared the slot behind our back (idle-slot caching): the KV is gone.
    // Keep the previous generation (docs/design.md §8) and stop believing the owner is resident.
    ++stats_.empty_saves;
    if (owned) {
      sl->owner.clear();
      sl->state = slot_state::unknown;
    }
    return error{errc::save_empty, 0, "server saved 0 tokens; previous snapshot kept"};
  }
  if (r->n_written == 0) {
    ++stats_.save_failures;
    if (owned) sl->state = slot_state::dirty;
    return error{errc::save_failed, 0, "server reported 0 bytes written"};
  }
  ++stats_.saves;
  stats_.save_bytes += r->n_written;
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
  m.chain = rc.chain;  // at most max_chain_links (start_inference)
  m.credential = rc.credential;
  if (owned && sl->state == slot_state::saving) sl->state = slot_state::dirty;  // clean once stored
  return m;
}

void slot_pool::on_commit_failed(const error& e, steady_time now) {
  ++stats_.save_failures;
  --stats_.saves;  // counted by on_save, which preceded this
  health_.on_failure(e, now);
}

void slot_pool::store_manifest(const manifest& m) {
  auto& r = sessions_[m.session_hash];
  if (r.session_id.empty()) r.session_id = m.session_id;
  // A commit may land after its session's record was forgotten (it owned no slot any more).
  if (r.credential.empty()) r.credential = m.credential;
  if (m.state == snapshot_state::ready) r.saved_rev = rev_latest(r.saved_rev, m.revision);
  set_snapshot(m.session_hash, r, m);
  for (auto& s : slots_)
    if (s.owner == m.session_hash && s.state == slot_state::dirty && !r.dirty())
      s.state = slot_state::ready;
}

restore_decision slot_pool::on_restore(const restore_step& step,
                                              const result<slot_restored>& r, steady_time now,
                                              std::string_view wall_now) {
  restore_decision d = restore_outcome(step, r, now, wall_now);
  slot_rec& sl = *find_slot(step.slot);
  if (d.restored) {
    const manifest* m = find_manifest(step.hash);
    sl.content = {content_whose::known, m ? m->credential : std::string(), step.hash};
  } else if (sl.state == slot_state::unknown) {
    // docs/design.md §20: what the failed restore left is unknown; where isolation is at
    // stake nobody may run on it before an erase.
    sl.content = {};
    if (tenancy_.door().ask(sl.content, {}) == door_answer::erase_or_refuse)
      d.need_erase = d.erase_required = true;
  } else {
    sl.content = {content_whose::empty, {}, {}};  // llama-server cleared the slot
  }
  return d;
}

restore_decision slot_pool::restore_outcome(const restore_step& step,
                                            const result<slot_restored>& r, steady_time now,
                                            std::string_view wall_now) {
  restore_decision d;
  ++stats_.restores;
  auto& rc = sessions_[step.hash];
  slot_rec& sl = *find_slot(step.slot);
  auto invalidate_snapshot = [&](errc code, std::string why) {
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
    health_.on_success();
    stats_.restore_bytes += r->n_read;
    const bool plausible = r->n_restored > 0 &&
                           (!opts_.verify_restore || r->n_restored == step.expected_tokens);
    if (plausible) {
      ++stats_.restore_hits;
      sl.state = slot_state::ready;
      sl.pending_kind = prepare_kind::restored;
      d.restored = true;
      return d;
    }
    // docs/design.md §9, invariant 10: an HTTP 200 is not a verified restore. The slot holds
    // something we can't vouch for: clear it and go cold.
    ++stats_.restore_failures;
    invalidate_snapshot(errc::snapshot_corrupt,
                        fmt::format("restored {} tokens, manifest says {}", r->n_restored,
                                    step.expected_tokens));
    d.need_erase = true;
    sl.state = slot_state::unknown;
    sl.pending_kind = prepare_kind::cold_fallback;
    return d;
  }
  ++stats_.restore_failures;
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
    health_.on_failure(e, now);
    invalidate_snapshot(errc::restore_failed, e.message);
    sl.state = slot_state::unknown;
  } else if (e.http_status >= 400 && e.http_status < 500) {
    // The server rejected the file (missing, truncated, foreign layout) and, as it does on
    // every failed restore, cleared the slot (docs/llama-server.md §1.3). Never retry this file.
    health_.on_success();
    invalidate_snapshot(errc::restore_failed, e.message);
    sl.state = slot_state::idle;
  } else {
    // Transport failure or timeout: we do not know what the slot holds, but whatever it is,
    // llama-server compares tokens before reusing them, so running cold is still correct.
    health_.on_failure(e, now);
    d.err = e;
    sl.state = slot_state::unknown;
  }
  sl.pending_kind = prepare_kind::cold_fallback;
  return d;
}

bool slot_pool::on_erase(int slot, const result<slot_erased>& r, steady_time now) {
  slot_rec& sl = *find_slot(slot);
  if (!r) {
    health_.on_failure(r.err(), now);
    sl.state = slot_state::unknown;
    sl.content = {};
    return false;
  }
  health_.on_success();
  sl.state = slot_state::idle;
  sl.content = {content_whose::empty, {}, {}};
  sl.owner.clear();  // nothing of it is left there (a plan's next step may take the slot)
  sl.idle_deadline.reset();
  return true;
}

// Also with persistence off (a strict-mode refusal): its slots are unowned and unknown, so
// only the pending request is dropped.
void slot_pool::abort_prepare(int slot) {
  slot_rec& sl = *find_slot(slot);
  if (sl.state == slot_state::inference) {
    // Released without end_inference (the request coroutine failed after prepare): the
    // request may have reached the slot, so count it as a new revision (docs/design.md §7)
    // and leave the owner checkpointable.
    if (!sl.pending_aux && !sl.owner.empty()) {
      ++sessions_[sl.owner].dirty_rev;
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

prepare_kind slot_pool::start_inference(const request_identity& who, int slot) {
  if (!enabled_) return prepare_kind::none;
  slot_rec& sl = *find_slot(slot);
  const prepare_kind k = sl.pending_kind;
  sl.prepared_content = sl.content;
  sl.content = {content_whose::known, who.credential, sl.pending_aux ? std::string() : sl.pending_hash};
  if (sl.pending_aux) {
    sl.owner.clear();  // invariant 7: auxiliary output never belongs to a session
  } else {
    sl.owner = sl.pending_hash;
    // What the slot holds from now on. A request without a chain (a raw prompt, the admin
    // API's restore) after a restore of the session's own snapshot: the snapshot's.
    auto& r = sessions_[sl.owner];
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
      ++stats_.cold_starts;
      if (find_manifest(sl.owner)) ++stats_.restore_misses;
    }
  }
  sl.state = slot_state::inference;
  return k;
}

void slot_pool::note_reuse(const std::string& hash, prepare_kind kind, std::uint64_t reused,
                           double tokens_per_s) {
  if (kind == prepare_kind::none || kind == prepare_kind::auxiliary) return;
  const auto it = sessions_.find(hash);
  if (it == sessions_.end()) return;
  auto& r = it->second.reuse;
  r.reused_tokens += reused;
  if (kind != prepare_kind::restored) return;
  r.reused_after_restore += reused;
  if (tokens_per_s > 0) r.prefill_seconds_saved += static_cast<double>(reused) / tokens_per_s;
}

std::optional<save_step> slot_pool::end_inference(int slot, bool reached_slot,
                                                         steady_time now, bool turn_end) {
  slot_rec& sl = *find_slot(slot);
  const bool aux = sl.pending_aux;
  sl.pending_hash.clear();
  sl.pending_aux = false;
  sl.pending_kind = prepare_kind::none;
  sl.last_used = ++use_clock_;
  if (!enabled_) return std::nullopt;
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
  auto& r = sessions_[sl.owner];
  r.last_used = ++record_clock_;
  // Design note 3: whatever reached the slot changed it, even a cancelled request.
  if (reached_slot) ++r.dirty_rev;
  const bool dirty = r.dirty();
  sl.state = dirty ? slot_state::dirty : slot_state::ready;
  if (!dirty) return std::nullopt;
  checkpoints_.note_turn(sl.owner, now);
  const auto idle_for = checkpoints_.idle_before_checkpoint(r.snapshot ? r.snapshot->save_ms : 0,
                                                            turn_end, now, session_slots());
  if (idle_for.count() > 0) {
    sl.idle_deadline = now + idle_for;
    sl.idle_rev = r.dirty_rev;
  }
  if (checkpoints_.saves_at_end(turn_end) && health_.allow(now)) return make_save(sl);
  return std::nullopt;
}

// The slots sessions contend for: all but the one reserved for auxiliary calls.
std::size_t slot_pool::session_slots() const {
  std::size_t n = slots_.size();
  if (aux_slot() >= 0 && n > 1) --n;
  return n;
}

std::optional<steady_time> slot_pool::idle_deadline() const {
  std::optional<steady_time> out;
  for (const auto& s : slots_)
    if (s.idle_deadline && (!out || *s.idle_deadline < *out)) out = s.idle_deadline;
  return out;
}

std::optional<save_step> slot_pool::idle_checkpoint(int slot, steady_time now) {
  slot_rec& sl = *find_slot(slot);
  if (!sl.idle_deadline || now < *sl.idle_deadline) return std::nullopt;
  sl.idle_deadline.reset();
  if (!enabled_ || sl.owner.empty() || sl.state != slot_state::dirty) return std::nullopt;
  const auto& r = sessions_[sl.owner];
  if (r.dirty_rev != sl.idle_rev || !r.dirty()) return std::nullopt;
  if (!health_.allow(now)) return std::nullopt;
  return make_save(sl);
}

std::optional<save_step> slot_pool::checkpoint_slot(int slot, steady_time now) {
  slot_rec* sl = find_slot(slot);
  if (!sl || !enabled_ || !owner_dirty(slot) || sl->state != slot_state::dirty) return std::nullopt;
  if (!health_.allow(now)) return std::nullopt;
  sl->idle_deadline.reset();
  return make_save(*sl);
}

std::optional<manifest> slot_pool::invalidate(const std::string& hash, errc reason,
                                                     std::string_view wall_now,
                                                     std::string_view note) {
  auto it = sessions_.find(hash);
  if (it == sessions_.end() || !it->second.snapshot) return std::nullopt;
  auto& m = *it->second.snapshot;
  m.state = snapshot_state::invalid;
  m.invalid_reason = std::string(to_string(reason));
  m.invalid_note = std::string(note.substr(0, manifest::max_note_bytes));
  m.updated_at = std::string(wall_now);
  ++stats_.invalidations;
  return m;
}

bool slot_pool::forget(const std::string& hash) {
  index_.erase(hash);
  const bool known = sessions_.erase(hash) > 0;
  const int slot = slot_of(hash);
  if (slot >= 0) forget_slot(slot);
  return known;
}

std::optional<save_step> slot_pool::checkpoint_session(const std::string& hash,
                                                              steady_time now) {
  const int slot = slot_of(hash);
  if (slot < 0) return std::nullopt;
  return checkpoint_slot(slot, now);
}

bool slot_pool::release_session(const std::string& hash) {
  const int slot = slot_of(hash);
  if (slot < 0) return true;
  if (owner_dirty(slot)) return false;
  forget_slot(slot);
  return true;
}

std::vector<slot_pool::session_view> slot_pool::sessions() const {
  std::vector<session_view> out;
  for (const auto& [h, r] : sessions_) {
    auto v = session(h);
    if (v) out.push_back(std::move(*v));
  }
  return out;
}

bool slot_pool::in_use(const std::string& hash) const {
  return std::any_of(slots_.begin(), slots_.end(), [&](const slot_rec& s) {
    return s.owner == hash || s.pending_hash == hash;
  });
}

std::vector<retention_entry> slot_pool::retention_entries() const {
  std::vector<retention_entry> out;
  for (const auto& [h, r] : sessions_) {
    if (!r.snapshot) continue;
    out.push_back({h, r.snapshot->state == snapshot_state::invalid,
                   parse_utc(r.snapshot->updated_at), r.snapshot->disk_bytes(), in_use(h),
                   r.credential, r.snapshot->bytes});
  }
  return out;
}

std::vector<slot_pool::session_view> slot_pool::sessions_after(
    std::string_view after, std::size_t n) const {
  std::vector<const std::string*> keys;
  for (const auto& [h, r] : sessions_)
    if (h > after) keys.push_back(&h);
  auto by_hash = [](const std::string* a, const std::string* b) { return *a < *b; };
  if (keys.size() > n) {
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end(), by_hash);
    keys.resize(n);
  }
  std::sort(keys.begin(), keys.end(), by_hash);
  std::vector<session_view> out;
  out.reserve(keys.size());
  for (const auto* k : keys) out.push_back(*session(*k));
  return out;
}

std::optional<slot_pool::session_view> slot_pool::session(
    const std::string& hash) const {
  auto it = sessions_.find(hash);
  if (it == sessions_.end()) return std::nullopt;
  session_view v;
  v.hash = hash;
  v.session_id = it->second.session_id;
  v.slot = slot_of(hash);
  v.resident = v.slot >= 0 && state(v.slot) != slot_state::unknown;
  v.dirty = it->second.dirty() && v.resident;
  v.snapshot = it->second.snapshot ? &*it->second.snapshot : nullptr;
  v.reuse = it->second.reuse;
  v.credential = it->second.credential;
  return v;
}

}  // namespace kvp::core
