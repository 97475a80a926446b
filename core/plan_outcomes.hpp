// The pinned layout's planner, after the plan (docs/design.md §6-§9): what the management calls
// of a plan (core/plan_builder.hpp) did, what the request did once it ran, and what its
// response said it reused. Each outcome moves the slot's state, owner and content
// (core/slot_table.hpp) and the session's revisions and manifest (core/session_records.hpp),
// and counts toward the breaker (core/backend_health.hpp) and the pool's statistics.
//
// A view over the pool's parts (core/pool_state.hpp): cheap to make, it holds a reference and
// lives no longer than the pool. Thread safety: none; every call is made on the server's
// strand, and each one that names a slot REQUIRES that the caller holds that slot's lease
// (docs/design.md §5, invariant 8).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/backend_types.hpp"
#include "core/manifest.hpp"
#include "core/plan_builder.hpp"
#include "core/pool_state.hpp"
#include "core/request_class.hpp"
#include "core/result.hpp"

namespace kvp::core {

struct restore_decision {
  bool restored = false;             // slot holds the session's snapshot, verified
  bool need_erase = false;           // slot content unknown: erase before running cold
  bool erase_required = false;       // ... and a failed erase fails the request (§20)
  std::optional<manifest> write;     // an invalidation to persist
  error err;
};

class plan_outcomes {
 public:
  explicit plan_outcomes(pool_state& st) : st_(st) {}

  // Outcomes of the plan's steps, in order. `wall_now` stamps manifests (RFC 3339).
  // on_save: the new manifest when the snapshot is complete (persist it, then call
  // store_manifest), else why not (the slot stays dirty, or unknown after an empty save).
  result<manifest> on_save(const save_step& step, const result<slot_saved>& r, steady_time now,
                           std::string_view wall_now);
  restore_decision on_restore(const restore_step& step, const result<slot_restored>& r,
                              steady_time now, std::string_view wall_now);
  bool on_erase(int slot, const result<slot_erased>& r, steady_time now);

  // A manifest was durably written (or an invalidation decided): make it current.
  void store_manifest(const manifest& m);
  // The second half of a successful on_save failed: the snapshot file could not be made
  // durable or the manifest could not be written, so the save is no checkpoint (the session
  // stays dirty where it still owns its slot, and its previous manifest stays current).
  void on_commit_failed(const error& e, steady_time now);

  // REQUIRES: lease of `slot` held. The prepared request is about to be forwarded.
  // Returns what kind of preparation it got (for logs and metrics).
  prepare_kind start_inference(const request_identity& who, int slot);
  // REQUIRES: lease of `slot` held. The forwarded request finished or was cancelled.
  // `reached_slot`: llama-server received it (its KV may have changed). `turn_end`: its reply
  // handed the conversation back to the user (core/reply_end.hpp). Returns a save to run
  // before the lease is released with checkpoint.onStepEnd, or onTurnEnd at a turn end.
  // `session_slots`: the slots contention is counted against for the early checkpoint (0: the
  // table's session slots; 1 where llama-server places requests, docs/design.md §23).
  std::optional<save_step> end_inference(int slot, bool reached_slot, steady_time now,
                                         bool turn_end = false, std::size_t session_slots = 0);
  // A strict-mode failure, or a lease released without end_inference.
  void abort_prepare(int slot);
  // What a response of the session `hash` reported: `reused` prompt tokens (cache_n) on a
  // request prepared as `kind`; after a restore they also count as `reused / tokens_per_s`
  // seconds of prefill saved (0 while the server's prompt speed is unknown). Unknown sessions,
  // auxiliary calls and requests forwarded without persistence (kind none) are ignored.
  void note_reuse(const std::string& hash, prepare_kind kind, std::uint64_t reused,
                  double tokens_per_s);

 private:
  restore_decision restore_outcome(const restore_step& step, const result<slot_restored>& r,
                                   steady_time now, std::string_view wall_now);

  pool_state& st_;
};

}  // namespace kvp::core
