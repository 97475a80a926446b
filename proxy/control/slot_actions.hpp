// The management calls a core::slot_pool plan asks for (docs/design.md §6, §8, §9, §11),
// carried out against llama-server and the state directory: the save (the slot written to its
// snapshot file, then the commit that makes the file durable and the manifest point at it),
// the restore (the file checked first in shared-filesystem mode, the token count checked by
// the pool), the erase, and the manifest reads and writes, with their logs and metrics. The
// pool decides; this type calls, reports each outcome back to the pool, and tells its owner
// what the rest of the coordinator must know through `slot_action_hooks`.
//
// Strand-only: one per coordinator, used on its strand (the commits it starts run there too).
// Each call that touches a slot REQUIRES that slot's lease, as the pool's own calls do.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/metrics.hpp"
#include "core/result.hpp"
#include "core/reuse_stats.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/commit_pipeline.hpp"
#include "proxy/control/file_io.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/snapshot_files.hpp"

namespace kvp::proxy {

// What slot_actions tells its owner; each defaults to doing nothing.
struct slot_action_hooks {
  // A slot action failed; with slot_not_found the owner reads the slot layout again.
  std::function<void(const core::error&)> slot_error = [](const core::error&) {};
  // A save of `slot`, which held `session`'s saved KV as far as kvpersist knew, wrote no token.
  std::function<void(int slot, const std::string& session)> emptied =
      [](int, const std::string&) {};
  // A commit ended, failed or not: the breaker may have opened or closed.
  std::function<void()> commit_ended = [] {};
  // A session's first manifest was written (the session budget, docs/design.md §12).
  std::function<net::awaitable<void>()> session_added = []() -> net::awaitable<void> {
    co_return;
  };
  // llama-server wrote `saved` from `slot`, which still holds it under the caller's lease
  // (the disk budget may overwrite other sessions' files from it now).
  std::function<net::awaitable<void>(int slot, core::manifest saved)> saved =
      [](int, core::manifest) -> net::awaitable<void> { co_return; };
  // The snapshot of `hash` was restored (its own session's, or as a seed).
  std::function<void(const std::string& hash)> restored = [](const std::string&) {};
};

// Save and restore durations and sizes, for /metrics.
struct slot_action_metrics {
  core::histogram save_ms{{1, 5, 10, 50, 100, 500, 1000, 5000, 15000, 60000}};
  core::histogram restore_ms{{1, 5, 10, 50, 100, 500, 1000, 5000, 15000, 60000}};
  core::histogram save_bytes{{1e6, 1e7, 1e8, 5e8, 1e9, 4e9, 16e9}};
  core::histogram restore_bytes{{1e6, 1e7, 1e8, 5e8, 1e9, 4e9, 16e9}};
};

// One line per breaker transition the pool recorded (core::breaker reports only changes, so an
// outage is one line); called as soon as the lease holder that caused it is done with its
// management calls.
void log_circuit_changes(core::slot_pool& pool);

class slot_actions {
 public:
  // Every reference must outlive this object.
  slot_actions(backends::kv_backend& backend, const manifest_store& store, core::slot_pool& pool,
               file_io& files, commit_pipeline& commits, const snapshot_files& snapshots,
               core::reuse_stats& reuse, slot_action_hooks hooks);

  // The plan's calls in order: save, then restore or erase (an erase also after a restore that
  // left the slot's content unknown); the departing session's commit is awaited last. With
  // `stop_on_failure` (strict mode) the first failure ends the plan and is the error returned.
  // A failed erase the sharing scope requires (plan.erase_required) is an error in every mode.
  // What a restore did is the pool's (start_inference tells restored from cold_fallback).
  net::awaitable<core::result<core::unit>> execute(const core::prepare_plan& plan,
                                                   bool stop_on_failure);

  // A save in two halves (docs/design.md §11). start_save has llama-server write the slot to
  // the snapshot file (never the generation the manifest on disk names); when that succeeds
  // it starts the commit (the file made durable, then the manifest pointing at it), which
  // runs while the slot serves its next session, and returns its handle. run_save is both
  // halves, awaited. Each returns the error, with its code, when the snapshot did not become
  // the session's checkpoint; the session's previous manifest then stays current.
  using commit_handle = commit_pipeline::handle;
  net::awaitable<core::result<commit_handle>> start_save(core::save_step step);
  net::awaitable<core::result<core::unit>> run_save(core::save_step step);
  // Erases `slot` (a cold start's erase); the error code when it failed.
  net::awaitable<std::optional<core::errc>> run_erase(int slot);

  // Stores the manifest durably and makes it current in the pool; the write's error (logged)
  // if it failed, and then the pool keeps what it had.
  net::awaitable<core::result<core::unit>> write_manifest(core::manifest m);
  // The session's manifest as it is on disk now (nullopt: absent, unreadable or timed out).
  net::awaitable<std::optional<core::manifest>> read_manifest(std::string hash);
  // Runs `work` on the file pool (proxy/control/file_io.hpp, whose rules `work` follows); a
  // failure, a timeout included, is reported to the pool's breaker.
  template <class T>
  net::awaitable<core::result<T>> on_file_pool(std::string_view what,
                                               std::function<core::result<T>()> work);

  // A plan being executed is restoring `hash`'s snapshot now (the disk budget keeps it).
  bool restoring(const std::string& hash) const { return restoring_.contains(hash); }
  const slot_action_metrics& metrics() const { return metrics_; }

 private:
  net::awaitable<core::restore_decision> run_restore(const core::restore_step& rs);
  // Shared-filesystem mode: the file's size and checksum before llama-server reads it.
  net::awaitable<core::result<core::unit>> check_snapshot(const core::restore_step& rs);
  core::restore_source source_of(const core::restore_step& rs) const;
  bool held_saved_kv(const core::save_step& step) const;
  net::awaitable<void> commit_save(core::save_step step, core::manifest m, std::uint64_t bytes,
                                   commit_handle pc);

  backends::kv_backend& backend_;
  const manifest_store& store_;
  core::slot_pool& pool_;
  file_io& files_;
  commit_pipeline& commits_;
  const snapshot_files& snapshots_;
  core::reuse_stats& reuse_;
  slot_action_hooks hooks_;
  // Snapshots a plan is restoring now, by session hash (a seed is another session's).
  std::multiset<std::string> restoring_;
  slot_action_metrics metrics_;
};

template <class T>
net::awaitable<core::result<T>> slot_actions::on_file_pool(std::string_view what,
                                                           std::function<core::result<T>()> work) {
  auto r = co_await files_.run<T>(what, std::move(work));
  if (!r) pool_.health().on_failure(r.err(), std::chrono::steady_clock::now());
  co_return r;
}

}  // namespace kvp::proxy
