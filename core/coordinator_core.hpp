// The sans-I/O heart of kvpersist: who owns the slot, what is dirty, and which management
// calls must run before a request. It takes events and `now` and returns decisions; the
// proxy's coordinator carries them out on its strand and reports the outcomes back.
//
// Thread safety: none. One instance per llama-server, touched only on that server's strand.
// Every mutating call other than the query functions REQUIRES that the caller holds the
// slot lease, so the slot has one mutator at a time (spec §20, invariant 8).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend_types.hpp"
#include "core/breaker.hpp"
#include "core/manifest.hpp"
#include "core/request_class.hpp"
#include "core/result.hpp"

namespace kvp::core {

using steady_time = std::chrono::steady_clock::time_point;

struct core_options {
  std::string instance_key = "default";
  std::string runtime_key;
  int slot_id = 0;
  bool save_on_switch = true;
  bool save_on_turn_end = false;
  std::chrono::milliseconds idle_checkpoint{30'000};  // 0: off
  bool restore_enabled = true;
  bool verify_restore = true;
  bool strict = false;
  int max_consecutive_failures = 3;
  std::chrono::milliseconds cooldown{60'000};
};

enum class slot_state { unknown, idle, saving, restoring, ready, inference, dirty };
std::string_view to_string(slot_state s);

struct save_step {
  int slot = 0;
  std::string hash;
  std::string filename;  // the generation the manifest does not point at
  char generation = 'a';
  std::uint64_t revision = 0;  // the dirty revision this save captures
};

struct restore_step {
  int slot = 0;
  std::string hash;
  std::string filename;
  std::uint64_t expected_tokens = 0;
};

// The management calls to run before forwarding, in this order: save, then restore or erase.
struct prepare_plan {
  int slot = 0;
  std::optional<save_step> save;
  std::optional<restore_step> restore;  // run only if the save (if any) is finished
  bool erase = false;                   // cold start: clear the slot
  bool resident = false;                // the session already owns the slot: nothing to do
  bool fail = false;                    // strict mode: persistence cannot run, answer 503
  std::vector<manifest> manifest_writes;  // invalidations decided while planning
};

// What a finished save means for the caller.
struct save_decision {
  bool ok = false;                   // the snapshot is complete; `write` must be persisted
  std::optional<manifest> write;     // the new manifest (store it, then call store_manifest)
  error err;                         // when !ok
};

struct restore_decision {
  bool restored = false;             // slot holds the session's snapshot, verified
  bool need_erase = false;           // slot content unknown: erase before running cold
  std::optional<manifest> write;     // an invalidation to persist
  error err;
};

enum class prepare_kind { none, resident, cold, restored, cold_fallback, auxiliary };
std::string_view to_string(prepare_kind k);

struct core_stats {
  std::uint64_t restores = 0, restore_hits = 0, restore_failures = 0, cold_starts = 0,
                saves = 0, save_failures = 0, empty_saves = 0, switches = 0,
                save_bytes = 0, restore_bytes = 0, invalidations = 0;
};

class coordinator_core {
 public:
  explicit coordinator_core(core_options opts);

  // Persistence turns on when a probe shows a usable server; until then every plan is empty
  // and requests are forwarded untouched (spec §32: inference never waits for persistence).
  void set_runtime(const runtime_info& rt);
  void disable_persistence();
  bool persistence_enabled() const { return enabled_; }
  const runtime_info& runtime() const { return runtime_; }

  // The server process changed (new media_marker, or it was unreachable and came back):
  // its slots are empty, so nobody is resident any more. Snapshots on disk stay valid.
  void on_epoch_change();

  // Manifests read from the state directory at startup. Later writes go through the
  // decisions below.
  void add_manifest(manifest m);

  // The session's snapshot key under the current runtime, or "" while persistence is off.
  std::string hash_for(std::string_view session_id) const;

  // REQUIRES: slot lease held. Plans the management calls for a request of `who`
  // (session_id empty or purpose set: auxiliary). Marks the slot as saving/restoring before
  // returning, so no other decision can race it while the calls are in flight.
  prepare_plan prepare(const request_identity& who, steady_time now, std::string_view wall_now);

  // Outcomes of the plan's steps, in order. `wall_now` stamps manifests (RFC 3339).
  save_decision on_save(const save_step& step, const result<slot_saved>& r, steady_time now,
                        std::string_view wall_now);
  restore_decision on_restore(const restore_step& step, const result<slot_restored>& r,
                              steady_time now, std::string_view wall_now);
  bool on_erase(const result<slot_erased>& r, steady_time now);

  // A manifest was durably written (or an invalidation decided): make it current.
  void store_manifest(const manifest& m);

  // REQUIRES: slot lease held. The prepared request is about to be forwarded.
  // Returns what kind of preparation it got (for logs and metrics).
  prepare_kind start_inference(const request_identity& who);
  // REQUIRES: slot lease held. The forwarded request finished or was cancelled.
  // `reached_slot`: llama-server received it (its KV may have changed). Returns a save to run
  // before the lease is released when checkpoint.onTurnEnd is set.
  std::optional<save_step> end_inference(bool reached_slot, steady_time now);
  // A strict-mode failure: forget the request being prepared.
  void abort_prepare();

  // Idle checkpoint (spec §71): when the timer fires, REQUIRES the lease, and re-checks that
  // the same owner is still dirty at the same revision before asking for a save.
  std::optional<steady_time> idle_deadline() const { return idle_deadline_; }
  std::optional<save_step> idle_checkpoint(steady_time now);

  // Flush/shutdown/admin: a save of the owner if it is dirty (nothing if clean: coalesced).
  std::optional<save_step> checkpoint_owner(steady_time now);

  // Admin operations. REQUIRES: slot lease held (they change what later plans decide).
  // Marks the session's snapshot invalid (reason: an errc name); returns the manifest to
  // write, or nothing if the session has no snapshot.
  std::optional<manifest> invalidate(const std::string& hash, errc reason,
                                     std::string_view wall_now);
  // Forgets the session (purge): its record and, if it owns the slot, the ownership.
  // Returns whether anything was known about it.
  bool forget(const std::string& hash);
  // A save of `hash` if it owns the slot and is dirty (flush of one session).
  std::optional<save_step> checkpoint_session(const std::string& hash, steady_time now);
  // The verdict of the last `doctor --verify` for this runtime; new manifests carry it.
  void set_compatibility(std::string verdict) { compatibility_ = std::move(verdict); }

  // Queries for status and tests.
  struct session_view {
    std::string hash;
    std::string session_id;
    bool resident = false;
    bool dirty = false;
    const manifest* snapshot = nullptr;
  };
  std::vector<session_view> sessions() const;
  std::optional<session_view> session(const std::string& hash) const;
  const std::string& owner() const { return owner_; }
  slot_state state() const { return state_; }
  bool owner_dirty() const;
  const manifest* find_manifest(const std::string& hash) const;
  std::vector<manifest> manifests() const;
  const core_stats& stats() const { return stats_; }
  const breaker& circuit() const { return breaker_; }
  const core_options& options() const { return opts_; }

 private:
  struct session_rec {
    std::string session_id;
    std::uint64_t dirty_rev = 0;
    std::uint64_t saved_rev = 0;
    std::optional<manifest> snapshot;
  };

  session_rec& rec(const std::string& hash, std::string_view session_id);
  std::optional<save_step> make_save(const std::string& hash);
  void record_backend_failure(const error& e, steady_time now);
  void record_backend_success();

  core_options opts_;
  breaker breaker_;
  bool enabled_ = false;
  runtime_info runtime_;
  std::string fingerprint_;
  std::unordered_map<std::string, session_rec> sessions_;

  // The slot (single-slot mode: slot opts_.slot_id).
  std::string owner_;  // hash of the owning session, "" when unowned
  slot_state state_ = slot_state::unknown;
  std::optional<steady_time> idle_deadline_;
  std::uint64_t idle_rev_ = 0;

  // The request being prepared.
  std::string pending_hash_;
  bool pending_aux_ = false;
  prepare_kind pending_kind_ = prepare_kind::none;

  core_stats stats_;
  std::string compatibility_ = "unknown";
};

}  // namespace kvp::core
