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
  // else, for a session without a snapshot, the slot whose content shares the longest prefix
  // with it within the scope (unless a ready snapshot shares as much: docs/design.md §23),
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

 private:
  std::optional<int> slot_sharing_prefix(const request_identity& who, const std::string& hash,
                                         const std::vector<int>& free_slots) const;
  pool_state state_;
};

}  // namespace kvp::core
