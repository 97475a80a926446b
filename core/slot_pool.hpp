// The sans-I/O heart of kvpersist: who owns the slot, what is dirty, and which management
// calls must run before a request. It takes events and `now` and returns decisions; the
// proxy's coordinator carries them out on its strand and reports the outcomes back.
//
// It manages a pool of slots: one in single-slot mode (the configured slotId), or every
// slot of the server in managed mode (docs/design.md §14). Functions without a slot argument act
// on the first slot of the pool, which is the only one in single-slot mode.
//
// Thread safety: none. One instance per llama-server, touched only on that server's strand.
// Every mutating call for a slot REQUIRES that the caller holds that slot's lease, so each
// slot has one mutator at a time (docs/design.md §5, invariant 8).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend_health.hpp"
#include "core/backend_types.hpp"
#include "core/chain_index.hpp"
#include "core/checkpoint_policy.hpp"
#include "core/manifest.hpp"
#include "core/request_class.hpp"
#include "core/result.hpp"
#include "core/retention.hpp"
#include "core/session_keys.hpp"
#include "core/slot_door.hpp"
#include "core/steady_time.hpp"
#include "core/tenancy.hpp"

namespace kvp::core {

struct slot_pool_options {
  std::string instance_key = "default";
  std::string runtime_key;
  int slot_id = 0;
  bool save_on_switch = true;
  bool save_on_turn_end = false;   // after a reply that hands the conversation to the user
  bool save_on_step_end = false;   // after every model call
  std::chrono::milliseconds idle_checkpoint{30'000};  // 0: off
  // Early checkpoint (docs/design.md §10): after a reply that ends the user's turn, while
  // more sessions took turns within `contention_window` than there are session slots (so the
  // next switch would wait for a save), save once the slot has been idle this long, or twice
  // the session's last save time if that is longer, so that the switch is a restore only.
  // A single conversation never pays for it. 0: off.
  std::chrono::milliseconds early_checkpoint{0};
  std::chrono::milliseconds contention_window{600'000};
  bool restore_enabled = true;
  bool verify_restore = true;
  bool strict = false;
  int max_consecutive_failures = 3;
  std::chrono::milliseconds cooldown{60'000};
  // Managed multi-slot mode: keep the highest slot for auxiliary calls (titles, summaries)
  // so they never evict a session (docs/design.md §6).
  bool reserve_aux_slot = false;
  // Seeding (docs/design.md §3): a session without a usable snapshot of its own may start
  // from another session's whose prefix chain it shares; with `seed_within_credential`, only
  // from a session of the same credential.
  // The same two switches are the sharing scope of the slot's content (docs/design.md §20):
  // instance (true, false), credential (true, true), session (false, either).
  bool seed_across_sessions = true;
  bool seed_within_credential = false;
  // Sessions remembered without a snapshot (a first visit not saved yet, a save that came
  // back empty): beyond this many the least recently used one that no slot holds or is being
  // prepared for is forgotten (docs/design.md §12). Those with a snapshot are retention's.
  std::size_t max_records_without_snapshot = default_record_limit;
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
  std::string hash;  // whose snapshot: verified against, and invalidated if it fails
  std::string filename;
  std::uint64_t expected_tokens = 0;
  std::uint64_t expected_bytes = 0;  // n_written at save time (file size)
  // A seed (docs/design.md §3): the hash of the session the slot is prepared for, whose
  // request shares `common_links` prefix links with `hash`'s snapshot. "" for a session's
  // own snapshot.
  std::string seed_for;
  std::size_t common_links = 0;
};

// An erase before a request that llama-server places itself (docs/design.md §14, §20).
struct isolating_erase {
  int slot = 0;
  bool required = false;  // the sharing scope's: a failed erase fails the request
};

// A snapshot and a request whose overlap cannot be told (either has no prefix chain).
inline constexpr std::size_t unknown_overlap = static_cast<std::size_t>(-1);

// The management calls to run before forwarding, in this order: save, then restore or erase.
struct prepare_plan {
  int slot = 0;
  std::optional<save_step> save;
  std::optional<restore_step> restore;  // run only if the save (if any) is finished
  bool erase = false;                   // cold start: clear the slot
  // The erase is the scope's: the request may not run on the slot's content (docs/design.md
  // §20), so a failed erase fails the request rather than run it there.
  bool erase_required = false;
  // A cold start that keeps the slot's content within the scope (docs/design.md §20), and how
  // many prefix links that content shares with the request (0: none kvpersist can see).
  bool kept = false;
  std::size_t kept_links = 0;
  bool resident = false;                // the session already owns the slot: nothing to do
  bool fail = false;                    // strict mode: persistence cannot run, answer 503
  errc fail_code = errc::invariant;     // why, when fail
  std::vector<manifest> manifest_writes;  // invalidations decided while planning
};

struct restore_decision {
  bool restored = false;             // slot holds the session's snapshot, verified
  bool need_erase = false;           // slot content unknown: erase before running cold
  bool erase_required = false;       // ... and a failed erase fails the request (§20)
  std::optional<manifest> write;     // an invalidation to persist
  error err;
};

enum class prepare_kind { none, resident, cold, restored, cold_fallback, auxiliary };
std::string_view to_string(prepare_kind k);

// What kvpersist did for one session (README "Dashboard", "Admin API"): restores that loaded a
// snapshot into a slot for it (its own or a seed), and the prompt tokens llama-server said it
// reused on its requests. `reused_after_restore` and `prefill_seconds_saved` count only the
// first request after each restore, as kvpersist_reused_prompt_tokens_total and
// kvpersist_prefill_seconds_saved_total do; `reused_tokens` counts every request (resident
// turns and a kept slot's content too).
struct session_reuse {
  std::uint64_t restores = 0;
  std::uint64_t reused_tokens = 0;
  std::uint64_t reused_after_restore = 0;
  double prefill_seconds_saved = 0;
};

struct core_stats {
  std::uint64_t restores = 0, restore_hits = 0, restore_failures = 0, cold_starts = 0,
                saves = 0, save_failures = 0, empty_saves = 0, switches = 0,
                save_bytes = 0, restore_bytes = 0, invalidations = 0;
  // A returning session (one with a snapshot record) that ran cold: its snapshot was invalid,
  // from another runtime, failed to restore, or restores were off or paused. First visits
  // are cold starts, not misses.
  std::uint64_t restore_misses = 0;
};

class slot_pool {
 public:
  explicit slot_pool(slot_pool_options opts);

  // Persistence turns on when a probe shows a usable server; until then every plan is empty
  // and requests are forwarded untouched (docs/design.md §13: inference never waits for persistence).
  void set_runtime(const runtime_info& rt);
  // `why`: backend_unsupported (the server answered, unusably: no --slot-save-path, wrong slot
  // count) or backend_unavailable (it did not answer). Strict mode fails session requests
  // with this code while persistence is off.
  void disable_persistence(errc why = errc::backend_unsupported);
  bool persistence_enabled() const { return enabled_; }
  const runtime_info& runtime() const { return runtime_; }

  // The pool: slot ids to manage (managed mode: 0..total_slots-1). Resets ownership when
  // the layout changes. Default: {opts.slot_id}.
  void set_slots(const std::vector<int>& ids);
  std::vector<int> slot_ids() const;
  // The slot reserved for auxiliary calls, or -1.
  int aux_slot() const;

  // The server process changed (new media_marker, a sleep, new adapters): its slots are
  // empty, so nobody is resident any more. Snapshots on disk stay valid.
  void on_epoch_change();
  // The server did not answer (a stall, a swap storm, a debugger: docs/design.md §20): its
  // slots may still hold what they held, and what was planned meanwhile may have run there
  // later. Nobody is resident, and each slot's content is unknown, kept as the credential
  // that put it there (known content), so only another credential's request pays an erase.
  void on_unreachable();

  // Persistence off (docs/design.md §5 "Without persistence", §20): requests run on whatever
  // slot llama-server picks, so every slot is treated as holding what any of them may hold.
  // Whether a request of `credential` may run there only after every slot of the server is
  // erased (always false under `sharing: instance`).
  bool pass_through_needs_erase(const std::string& credential) const;
  // A request of `credential` runs there: any slot may hold its content from now on.
  void note_pass_through(const std::string& credential);
  // Every slot of the server was erased.
  void on_server_erased();

  // Manifests read from the state directory at startup, or re-read before a session that
  // is not resident is prepared (another node may have saved it: shared snapshots).
  // Replaces what was known unless the session owns a slot here.
  void add_manifest(manifest m);

  // The session's snapshot key under the current runtime, or "" while persistence is off.
  // The admin API names sessions by id alone; a request's key is scoped by its credential
  // under `sharing: credential` or `session` (docs/design.md §20).
  std::string hash_for(std::string_view session_id) const;
  std::string hash_for(const request_identity& who) const;
  // A request under a session header with another preamble than the session's (a title
  // call, a sub-agent) becomes the sub-session `<id>#<its preamble link>` (docs/design.md
  // §20). Called on the strand before the request queues and again when it is planned.
  void resolve_session(request_identity& who) const;
  // What the door (core/slot_door.hpp, docs/design.md §24) answers for `who` on what `slot`
  // holds: run, erase, or erase and refuse the request if the erase fails.
  door_answer door_for(int slot, const request_identity& who) const;
  const slot_content& content(int slot) const;

  // Slot selection (docs/design.md §14) among `free_slots` (not leased): the slot the session already
  // owns (only that one: a session's requests stay in order), else an empty slot, else the
  // least recently used clean slot, else the least recently used dirty one (its owner is
  // saved first by the plan). Auxiliary calls take the reserved slot when there is one.
  // nullopt: wait for a lease to be released.
  std::optional<int> choose_slot(const request_identity& who, const std::vector<int>& free_slots) const;

  // REQUIRES: lease of `slot` held. Plans the management calls for a request of `who`
  // (session_id empty or purpose set: auxiliary). Marks the slot as saving/restoring before
  // returning, so no other decision can race it while the calls are in flight.
  prepare_plan prepare(const request_identity& who, int slot, steady_time now,
                       std::string_view wall_now);

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
  // One of kvpersist's own file operations failed. A timeout (a stuck filesystem) counts
  // towards the breaker like a management call that timed out; other errors do not.
  void on_file_failure(const error& e, steady_time now) { health_.on_failure(e, now); }

  // REQUIRES: lease of `slot` held. The prepared request is about to be forwarded.
  // Returns what kind of preparation it got (for logs and metrics).
  prepare_kind start_inference(const request_identity& who, int slot);
  // REQUIRES: lease of `slot` held. The forwarded request finished or was cancelled.
  // `reached_slot`: llama-server received it (its KV may have changed). `turn_end`: its reply
  // handed the conversation back to the user (core/reply_end.hpp). Returns a save to run
  // before the lease is released with checkpoint.onStepEnd, or onTurnEnd at a turn end.
  std::optional<save_step> end_inference(int slot, bool reached_slot, steady_time now,
                                         bool turn_end = false);
  // What a response of the session `hash` reported: `reused` prompt tokens (cache_n) on a
  // request prepared as `kind`; after a restore they also count as `reused / tokens_per_s`
  // seconds of prefill saved (0 while the server's prompt speed is unknown). Unknown sessions,
  // auxiliary calls and requests forwarded without persistence (kind none) are ignored.
  void note_reuse(const std::string& hash, prepare_kind kind, std::uint64_t reused,
                  double tokens_per_s);
  // A strict-mode failure, or a lease released without end_inference.
  void abort_prepare(int slot);

  // The slot's content is unknown (an unpinnable request may have run on it): nobody owns it.
  void forget_slot(int slot);
  // llama-server shows the slot empty (GET /slots, docs/design.md §4): nobody owns it, and it
  // holds nothing. The other slots are not touched.
  void forget_emptied_slot(int slot);

  // Managed mode, a request llama-server places on a slot of its choosing (docs/design.md
  // §14): the slots to erase before it, those whose content `who` may not run on, by the rule
  // of an auxiliary call (§20). REQUIRES every slot's lease (an exclusive lease); the owners
  // of dirty slots saved first.
  std::vector<isolating_erase> erases_before_unpinned(const request_identity& who);
  // ... and afterwards: it ran on `slot`, which now holds content of `credential` that belongs
  // to no session. REQUIRES the exclusive lease.
  void note_unpinned_ran(int slot, const std::string& credential);

  // Idle checkpoint (docs/design.md §10): when the timer fires, REQUIRES the slot's lease, and
  // re-checks that the same owner is still dirty at the same revision before asking for a save.
  std::optional<steady_time> idle_deadline() const;  // earliest over the pool
  std::optional<save_step> idle_checkpoint(int slot, steady_time now);

  // Flush/shutdown/admin: a save of the slot's owner if it is dirty (nothing if clean: coalesced).
  std::optional<save_step> checkpoint_slot(int slot, steady_time now);

  // Admin operations. REQUIRES: lease of the session's slot held (if it owns one).
  // Marks the session's snapshot invalid (reason: an errc name; note: the operator's words,
  // recorded as the manifest's invalidNote); returns the manifest to write, or nothing if the
  // session has no snapshot.
  std::optional<manifest> invalidate(const std::string& hash, errc reason,
                                     std::string_view wall_now, std::string_view note = {});
  // Forgets the session (purge): its record and, if it owns a slot, the ownership.
  // Returns whether anything was known about it.
  bool forget(const std::string& hash);
  // A save of `hash` if it owns a slot and is dirty (flush of one session).
  std::optional<save_step> checkpoint_session(const std::string& hash, steady_time now);
  // Dispose, second half: the session gives its slot up but stays known, so its next
  // request restores from its snapshot. Only a clean owner lets go (checkpoint_session
  // first); returns false, keeping the ownership, while the slot holds unsaved turns.
  bool release_session(const std::string& hash);
  // The verdict of the last `doctor --verify` for this runtime; new manifests carry it.
  void set_compatibility(std::string verdict) { compatibility_ = std::move(verdict); }

  // Queries for status and tests.
  struct session_view {
    std::string hash;
    std::string session_id;
    bool resident = false;
    bool dirty = false;
    int slot = -1;
    const manifest* snapshot = nullptr;
    session_reuse reuse;
    std::string credential;  // credential_key() of its requests (of its manifest before any)
  };
  std::vector<session_view> sessions() const;
  // The first `n` sessions whose hash is greater than `after`, in hash order (a listing page).
  std::vector<session_view> sessions_after(std::string_view after, std::size_t n) const;
  // Every session with a snapshot, for retention, its bytes both generations as its manifest
  // records them (shared-filesystem mode replaces them with the sizes on disk), with the
  // credential of its requests (of its manifest when it has made none here).
  std::vector<retention_entry> retention_entries() const;
  // The session owns a slot or one is being prepared for it: retention must not forget it.
  bool in_use(const std::string& hash) const;
  std::optional<session_view> session(const std::string& hash) const;
  const std::string& owner(int slot) const;
  slot_state state(int slot) const;
  int slot_of(const std::string& hash) const;  // the slot the session owns, or -1
  bool owner_dirty(int slot) const;
  const manifest* find_manifest(const std::string& hash) const;
  std::vector<manifest> manifests() const;
  const core_stats& stats() const { return stats_; }
  const breaker& circuit() const { return health_.circuit(); }
  // The breaker's transitions since the last call, oldest first, for one log line each.
  std::vector<circuit_change> take_circuit_changes() { return health_.take_changes(); }
  // The sessions forgotten for max_records_without_snapshot since the last call (hashes).
  std::vector<std::string> take_forgotten_records();
  const slot_pool_options& options() const { return opts_; }
  // The idle checkpoint's delay from now on (a learned sleep period, docs/design.md §4).
  void set_idle_checkpoint(std::chrono::milliseconds idle) {
    opts_.idle_checkpoint = idle;
    checkpoints_.set_idle_checkpoint(idle);
  }

 private:
  struct session_rec {
    std::string session_id;
    std::uint64_t dirty_rev = 0;
    std::uint64_t saved_rev = 0;
    std::optional<manifest> snapshot;
    std::vector<chain_link> chain;  // of its last request that ran: what its slot holds
    std::string credential;         // credential_key() of its requests
    session_reuse reuse;
    std::uint64_t last_used = 0;    // record_clock_ when a request of it was last planned or ended
    bool dirty() const;  // the slot holds turns the last saved snapshot lacks
  };
  struct slot_rec {
    int id = 0;
    std::string owner;  // hash of the owning session, "" when unowned
    slot_state state = slot_state::unknown;
    std::uint64_t last_used = 0;  // logical clock: larger is more recent
    std::optional<steady_time> idle_deadline;
    std::uint64_t idle_rev = 0;
    // The request being prepared on this slot.
    std::string pending_hash;
    bool pending_aux = false;
    prepare_kind pending_kind = prepare_kind::none;
    slot_content content;
    slot_content prepared_content;  // what the plan left there, before the request ran
  };

  bool keeps_content() const;
  static slot_rec make_slot(int id);
  slot_rec* find_slot(int id);
  const slot_rec* find_slot(int id) const;
  session_rec& rec(const std::string& hash, std::string_view session_id);
  void forget_least_recent_records(const std::string& keep);
  std::optional<save_step> make_save(slot_rec& s);
  std::size_t session_slots() const;
  void set_snapshot(const std::string& hash, session_rec& r, manifest m);
  // Seeding (docs/design.md §3).
  bool seeding_allowed() const;
  std::size_t shared_with_slot(const slot_rec& sl, const request_identity& who) const;
  std::optional<chain_index::match> best_seed(const request_identity& who,
                                              const std::string& own,
                                              std::size_t better_than) const;
  std::optional<std::size_t> own_snapshot_usable(session_rec& r, prepare_plan& plan,
                                                 const request_identity& who,
                                                 std::string_view wall_now);
  restore_decision restore_outcome(const restore_step& step, const result<slot_restored>& r,
                                   steady_time now, std::string_view wall_now);

  slot_pool_options opts_;
  backend_health health_;
  checkpoint_policy checkpoints_;
  tenancy tenancy_;
  session_keys keys_;
  bool enabled_ = false;
  errc disabled_reason_ = errc::backend_unavailable;  // not probed yet counts as unreachable
  runtime_info runtime_;
  std::string fingerprint_;
  std::unordered_map<std::string, session_rec> sessions_;
  chain_index index_;  // the prefix chains of ready snapshots
  std::vector<slot_rec> slots_;
  std::uint64_t use_clock_ = 0;
  std::uint64_t record_clock_ = 0;  // orders session_rec::last_used
  std::vector<std::string> forgotten_records_;  // for take_forgotten_records
  core_stats stats_;
  std::string compatibility_ = "unknown";
};

}  // namespace kvp::core
