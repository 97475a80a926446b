// Retention (docs/design.md §12): core::plan_retention decides which sessions to forget; this
// type forgets them, deletes their files in shared-filesystem mode, has llama-server overwrite
// them in server-owned mode with a disk budget, and runs gc on its interval (gc_loop), on
// demand (run_gc, POST /kv/gc), as new sessions arrive (enforce_session_budget) and after
// saves (keep_disk_budget). It also overwrites a purged session's files in server-owned mode.
//
// Strand-only: one per coordinator, used on its strand. Its slot work goes through
// slot_actions; the whole server, when it needs it, through the owner's `server_holder`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/manifest.hpp"
#include "core/retention.hpp"
#include "core/reuse_stats.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/commit_pipeline.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/slot_actions.hpp"
#include "proxy/control/snapshot_files.hpp"

namespace kvp::proxy {

// What a retention run did (POST /kv/gc).
struct gc_report {
  std::size_t evicted = 0;
  std::uint64_t freed_bytes = 0;
  std::size_t remaining_sessions = 0;
  std::uint64_t remaining_bytes = 0;
  bool files_kept = false;  // server-owned mode: evicted sessions' files stay with llama-server
};

// The whole server, held by the owner until the last copy is destroyed: every commit landed,
// no request running (the coordinator's exclusive_hold). What retention_keeper and
// session_admin get through a server_holder.
using server_hold = std::shared_ptr<void>;
using server_holder = std::function<net::awaitable<server_hold>()>;

// Since the process started, for /metrics.
struct retention_counters {
  std::uint64_t gc_evicted = 0;          // snapshots removed (or overwritten) by retention
  std::uint64_t gc_freed_bytes = 0;
  std::uint64_t sessions_forgotten = 0;  // server-owned mode: manifests dropped, files kept
};

class retention_keeper {
 public:
  // Every reference must outlive this object. `strand`: the owner's, for gc's timer.
  // `interval`: retention.intervalMs (0: gc only on demand, no session budget between runs).
  retention_keeper(net::any_io_executor strand, core::retention_limits limits,
                   std::chrono::milliseconds interval, backends::kv_backend& backend,
                   core::slot_pool& pool, slot_actions& actions, commit_pipeline& commits,
                   const manifest_store& store, const snapshot_files& snapshots,
                   core::reuse_stats& reuse, server_holder hold_server);

  // Runs gc every interval, each run with the whole server held, until stop.
  net::awaitable<void> gc_loop();
  // Stops gc_loop (its timer cancelled).
  void stop();
  // One retention run. REQUIRES: the whole server held (sessions may be forgotten, slots
  // erased). In server-owned mode with a disk budget every eviction overwrites its files,
  // and nothing is evicted while persistence is off.
  net::awaitable<gc_report> run_gc();
  // The session-count budgets, kept as each new session's first manifest is written: a burst
  // of new sessions never outgrows them. Off when gc runs only on demand, and under a disk
  // budget (keep_disk_budget applies the counts at every save).
  net::awaitable<void> enforce_session_budget();
  // After a save that wrote `saved` on `slot`, with a disk budget: forgets, by overwriting
  // their files from that slot, the sessions that leave no room under the budget for one
  // more snapshot of the saving credential, as large as its largest kept, nor under each
  // credential's share for one more of its own (core::retention_room). The saved session, the sessions in use, with a commit in flight or being
  // restored are kept. Without a disk budget: nothing.
  // REQUIRES: the slot's lease; its content is saved (the slot is erased when it evicts).
  net::awaitable<void> keep_disk_budget(int slot, core::manifest saved);

  // `hash`'s snapshot was restored now: retention ranks a snapshot by its last save or use.
  void note_restored(const std::string& hash);
  // Drops what it keeps of `hash` (the pool forgot the session).
  void forget(const std::string& hash);
  // Forgets the session and deletes its manifest and, in shared-filesystem mode, its snapshot
  // files; the snapshot bytes deleted. REQUIRES: the session is not in use.
  net::awaitable<std::uint64_t> drop_session(std::string hash);
  // Purge in server-owned mode (docs/design.md §12, "Purge"): a slot erased and saved over both
  // generation files of `hash`. Why a file still holds the session's KV, or nullopt.
  // REQUIRES: the whole server held.
  net::awaitable<std::optional<std::string>> overwrite_snapshots(std::string hash);

  const retention_counters& counters() const { return counters_; }

 private:
  // Forgets an evicted session and deletes its files; the bytes freed. A session whose
  // commit is in flight is kept for the next run.
  net::awaitable<std::uint64_t> forget_session(core::retention_eviction e);
  // The disk budget in server-owned mode (docs/design.md §12, "Disk budget"): on when
  // retention.maxTotalBytes or maxBytesPerCredential is set and kvpersist cannot delete llama-server's files. Then
  // nothing is forgotten without its files overwritten (gc waits while persistence is off).
  bool disk_budget_on() const;
  // pool_.listing().retention_entries(), each ranked by its last save or restore, whichever is
  // later: a snapshot that seeds new sessions stays while it is used.
  std::vector<core::retention_entry> retention_by_use() const;
  // Erases `slot` once and overwrites each evicted session's files from it; stops at the
  // first failure (that session is kept). Returns how many were forgotten and their bytes.
  net::awaitable<gc_report> overwrite_evicted(int slot,
                                              std::vector<core::retention_eviction> evict);
  // run_gc in server-owned mode with a disk budget: every eviction overwrites its files.
  net::awaitable<gc_report> run_gc_overwriting();
  // The slot a server-owned overwrite uses: the session's own, else an empty one, else the
  // first. REQUIRES: the whole server held.
  int overwrite_slot(const std::string& hash) const;
  // Saves the dirty owner of `slot` (other than `hash`) before its content is erased for an
  // overwrite; why not, or nullopt. REQUIRES: the whole server held.
  net::awaitable<std::optional<std::string>> save_owner_before_overwrite(int slot,
                                                                         const std::string& hash);
  // llama-server saves the erased `slot` over both generation files of `hash`, the one the
  // manifest does not name first. Why a file still holds the session's KV, or nullopt.
  // REQUIRES: the slot's lease, the slot erased by the caller.
  net::awaitable<std::optional<std::string>> overwrite_generations(int slot, std::string hash);

  core::retention_limits limits_;
  std::chrono::milliseconds interval_;
  backends::kv_backend& backend_;
  core::slot_pool& pool_;
  slot_actions& actions_;
  commit_pipeline& commits_;
  const manifest_store& store_;
  const snapshot_files& snapshots_;
  core::reuse_stats& reuse_;
  server_holder hold_server_;
  net::steady_timer gc_timer_;
  bool stopped_ = false;
  // Session hash -> when its snapshot was last restored (its own, or as a seed), seconds since
  // the epoch.
  std::map<std::string, std::int64_t> restored_at_;
  bool warned_over_budget_ = false;          // kv.gc.over_budget logged since the last fit
  retention_counters counters_;
};

}  // namespace kvp::proxy
