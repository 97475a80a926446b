// The sans-I/O heart of kvpersist for one llama-server: who owns each slot, what is dirty,
// and which management calls must run before a request. It takes events and `now` and
// returns decisions; the proxy's coordinator carries them out on its strand and reports the
// outcomes back.
//
// It manages a pool of slots: one in single-slot mode (the configured slotId), or every
// slot of the server in managed mode (docs/design.md §14), and pins each request to one.
// It is a composition of small parts (core/pool_state.hpp): the slot table, the session
// records, the tenancy, the session keys, the checkpoint policy and the backend's health;
// and of views over them, each with its own contract: the plans before a request (plans(),
// core/plan_builder.hpp), their outcomes (outcomes(), core/plan_outcomes.hpp), the door for
// requests llama-server places itself (placed(), core/placed_door.hpp) and the session
// listing (listing(), core/session_listing.hpp). This class keeps what spans them: the
// runtime and persistence's switch, the sessions' names, slot choice, and manifests read from
// disk.
//
// Thread safety: none. One instance per llama-server, touched only on that server's strand.
// Every mutating call for a slot REQUIRES that the caller holds that slot's lease, so each
// slot has one mutator at a time (docs/design.md §5, invariant 8).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend_types.hpp"
#include "core/manifest.hpp"
#include "core/placed_door.hpp"
#include "core/plan_builder.hpp"
#include "core/plan_outcomes.hpp"
#include "core/pool_state.hpp"
#include "core/request_class.hpp"
#include "core/result.hpp"
#include "core/session_listing.hpp"

namespace kvp::core {

class slot_pool {
 public:
  explicit slot_pool(slot_pool_options opts) : state_(std::move(opts)) {}

  // Persistence turns on when a probe shows a usable server; until then every plan is empty
  // and requests are forwarded untouched (docs/design.md §13: inference never waits for
  // persistence). A new model, or another runtime in the same process, is a new epoch
  // (slot_table::on_epoch_change); new adapters also leave every slot's content unknown.
  void set_runtime(const runtime_info& rt);
  // `why`: backend_unsupported (the server answered, unusably: no --slot-save-path, wrong slot
  // count) or backend_unavailable (it did not answer). Strict mode fails session requests
  // with this code while persistence is off. What the slots hold is unknown from now on, as
  // after a stall (slot_table::on_unreachable).
  void disable_persistence(errc why = errc::backend_unsupported);
  bool persistence_enabled() const { return state_.enabled; }
  const runtime_info& runtime() const { return state_.runtime; }
  // The verdict of the last `doctor --verify` for this runtime; new manifests carry it.
  void set_compatibility(std::string verdict) { state_.compatibility = std::move(verdict); }
  const slot_pool_options& options() const { return state_.opts; }

  // The session's snapshot key under the current runtime, or "" while persistence is off
  // (core/session_keys.hpp). The admin API names sessions by id alone; a request's key is
  // scoped by its credential under `sharing: credential` or `session` (docs/design.md §20).
  std::string hash_for(std::string_view session_id) const;
  std::string hash_for(const request_identity& who) const;
  // A request under a session header with another preamble than the session's (a title
  // call, a sub-agent) becomes the sub-session `<id>#<its preamble link>` (docs/design.md
  // §20). Called on the strand before the request queues and again when it is planned.
  void resolve_session(request_identity& who) const;

  // Slot selection (docs/design.md §14) among `free_slots` (not leased): the slot the session
  // already owns or is being prepared on (only that one: a session's requests stay in order),
  // else an empty slot, else the least recently used clean slot, else the least recently used
  // dirty one (its owner is saved first by the plan). Auxiliary calls take the reserved slot
  // when there is one. nullopt: wait for a lease to be released.
  std::optional<int> choose_slot(const request_identity& who,
                                 const std::vector<int>& free_slots) const;
  // Persistence off (docs/design.md §5 "Without persistence", §20, §24): requests run on
  // whatever slot llama-server picks, so every slot is treated as holding what any of them
  // may hold. Whether a request of `credential` may run there only after every slot of the
  // server is erased (always false under `sharing: instance`).
  bool pass_through_needs_erase(const std::string& credential) const;

  // Manifests read from the state directory at startup, or re-read before a session that
  // is not resident is prepared (another node may have saved it: shared snapshots).
  // Replaces what was known unless the session owns a slot here.
  void add_manifest(manifest m);

  // The parts, for their queries and the events that concern one of them alone.
  slot_table& table() { return state_.table; }
  const slot_table& table() const { return state_.table; }
  session_records& records() { return state_.records; }
  const session_records& records() const { return state_.records; }
  backend_health& health() { return state_.health; }
  const backend_health& health() const { return state_.health; }
  checkpoint_policy& checkpoints() { return state_.checkpoints; }
  const core_stats& stats() const { return state_.stats; }

  // The views: plans before a request, their outcomes, the door for placed requests, and the
  // sessions as the admin API lists them. Each lives no longer than the pool.
  plan_builder plans() { return plan_builder(state_); }
  plan_outcomes outcomes() { return plan_outcomes(state_); }
  placed_door placed() { return placed_door(state_); }
  session_listing listing() const { return session_listing(state_.records, state_.table); }

  // Forwarders for the call sites that still name the pool (moved to the parts and views next).
  using session_view = core::session_view;
  void set_slots(const std::vector<int>& ids) { table().set_ids(ids); }
  std::vector<int> slot_ids() const { return table().ids(); }
  int aux_slot() const { return table().aux_slot(); }
  void on_epoch_change() { table().on_epoch_change(); }
  void on_unreachable() { table().on_unreachable(); }
  void note_pass_through(const std::string& c) { placed().note_pass_through(c); }
  void on_server_erased() { table().on_server_erased(); }
  door_answer door_for(int slot, const request_identity& who) { return plans().door_for(slot, who); }
  const slot_content& content(int slot) const { return table().content(slot); }
  prepare_plan prepare(const request_identity& who, int slot, steady_time now, std::string_view w) {
    return plans().prepare(who, slot, now, w);
  }
  result<manifest> on_save(const save_step& s, const result<slot_saved>& r, steady_time now,
                           std::string_view w) {
    return outcomes().on_save(s, r, now, w);
  }
  restore_decision on_restore(const restore_step& s, const result<slot_restored>& r,
                              steady_time now, std::string_view w) {
    return outcomes().on_restore(s, r, now, w);
  }
  bool on_erase(int slot, const result<slot_erased>& r, steady_time now) {
    return outcomes().on_erase(slot, r, now);
  }
  void store_manifest(const manifest& m) { outcomes().store_manifest(m); }
  void on_commit_failed(const error& e, steady_time now) { outcomes().on_commit_failed(e, now); }
  void on_file_failure(const error& e, steady_time now) { health().on_failure(e, now); }
  prepare_kind start_inference(const request_identity& who, int slot) {
    return outcomes().start_inference(who, slot);
  }
  std::optional<save_step> end_inference(int slot, bool reached, steady_time now,
                                         bool turn_end = false) {
    return outcomes().end_inference(slot, reached, now, turn_end);
  }
  void note_reuse(const std::string& h, prepare_kind k, std::uint64_t n, double tps) {
    outcomes().note_reuse(h, k, n, tps);
  }
  void abort_prepare(int slot) { outcomes().abort_prepare(slot); }
  void forget_slot(int slot) { table().forget_slot(slot); }
  void forget_emptied_slot(int slot) { table().forget_emptied_slot(slot); }
  std::vector<isolating_erase> erases_before_unpinned(const request_identity& who) {
    return placed().erases_before_unpinned(who);
  }
  void note_unpinned_ran(int slot, const std::string& c) { placed().note_unpinned_ran(slot, c); }
  std::optional<steady_time> idle_deadline() const { return table().idle_deadline(); }
  std::optional<save_step> idle_checkpoint(int slot, steady_time now) {
    return plans().idle_checkpoint(slot, now);
  }
  std::optional<save_step> checkpoint_slot(int slot, steady_time now) {
    return plans().checkpoint_slot(slot, now);
  }
  std::optional<manifest> invalidate(const std::string& h, errc reason, std::string_view w,
                                     std::string_view note = {}) {
    return plans().invalidate(h, reason, w, note);
  }
  bool forget(const std::string& h) { return plans().forget(h); }
  std::optional<save_step> checkpoint_session(const std::string& h, steady_time now) {
    return plans().checkpoint_session(h, now);
  }
  bool release_session(const std::string& h) { return plans().release_session(h); }
  std::vector<session_view> sessions() const { return listing().sessions(); }
  std::vector<session_view> sessions_after(std::string_view a, std::size_t n) const {
    return listing().sessions_after(a, n);
  }
  std::vector<retention_entry> retention_entries() const { return listing().retention_entries(); }
  bool in_use(const std::string& h) const { return table().in_use(h); }
  std::optional<session_view> session(const std::string& h) const { return listing().session(h); }
  const std::string& owner(int slot) const { return table().owner(slot); }
  slot_state state(int slot) const { return table().state(slot); }
  int slot_of(const std::string& h) const { return table().slot_of(h); }
  bool owner_dirty(int slot) const { return records().dirty(table().owner(slot)); }
  const manifest* find_manifest(const std::string& h) const { return records().find_manifest(h); }
  std::vector<manifest> manifests() const { return records().manifests(); }
  const breaker& circuit() const { return health().circuit(); }
  std::vector<circuit_change> take_circuit_changes() { return health().take_changes(); }
  std::vector<std::string> take_forgotten_records() { return records().take_forgotten(); }
  void set_idle_checkpoint(std::chrono::milliseconds idle) {
    state_.opts.idle_checkpoint = idle;
    checkpoints().set_idle_checkpoint(idle);
  }

 private:
  pool_state state_;
};

}  // namespace kvp::core
