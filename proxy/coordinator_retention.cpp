// Retention (docs/design.md §12): core::plan_retention decides which sessions to forget;
// the coordinator forgets them, deletes their files in shared-filesystem mode, and runs gc
// on its interval, on demand (POST /kv/gc) and as new sessions arrive.
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "core/identity.hpp"
#include "core/log.hpp"
#include "core/retention.hpp"
#include "proxy/coordinator.hpp"
#include "proxy/coordinator_internal.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

// What deleting a session's files did.
struct files_removed {
  std::optional<std::string> manifest_problem;  // why the manifest could not be removed
  std::uint64_t snapshot_bytes = 0;             // shared-filesystem mode only
};

net::awaitable<std::uint64_t> coordinator::drop_session(std::string hash) {
  pool_.forget(hash);
  last_restore_.erase(hash);
  const auto store = store_;
  const auto files = snapshots_;
  std::function<core::result<files_removed>()> work = [store, files, hash] {
    files_removed out;
    if (auto r = store.remove(hash); !r) out.manifest_problem = r.err().message;
    out.snapshot_bytes = files.remove(hash);
    return core::result<files_removed>(out);
  };
  const auto removed = co_await on_file_pool<files_removed>("deleting a session's files",
                                                           std::move(work));
  if (!removed || removed->manifest_problem)
    log(log_level::warn, "kv.manifest.remove_failed",
        {{"reason", removed ? *removed->manifest_problem : removed.err().message}});
  co_return removed ? removed->snapshot_bytes : 0;
}

// REQUIRES: the session is not in use. Returns the bytes freed (shared-filesystem mode only:
// in server-owned mode the files are llama-server's, and kvpersist names them once in the log
// for the operator, see README "Retention").
net::awaitable<std::uint64_t> coordinator::forget_session(core::retention_eviction e) {
  if (commits_.contains(e.hash)) co_return 0;  // being saved: the next run decides again
  const auto freed = co_await drop_session(e.hash);
  const auto sess = std::string(core::abbrev(e.hash));
  if (!snapshots_.shared()) {
    ++sessions_forgotten_;
    log(log_level::info, "kv.session.forgotten",
        {{"session", sess}, {"why", std::string(e.why)},
         {"files", core::snapshot_filename(e.hash, 'a') + "," + core::snapshot_filename(e.hash, 'b')}});
    co_return 0;
  }
  ++gc_evicted_;
  gc_freed_bytes_ += freed;
  log(log_level::info, "kv.gc.evicted",
      {{"session", sess}, {"bytes", std::to_string(freed)}, {"why", std::string(e.why)}});
  co_return freed;
}

// REQUIRES: lease held (we may forget sessions).
net::awaitable<gc_report> coordinator::run_gc() {
  auto entries = pool_.retention_entries();
  if (snapshots_.shared()) {
    std::vector<std::string> hashes;
    for (const auto& e : entries) hashes.push_back(e.hash);
    const auto files = snapshots_;
    std::function<core::result<std::vector<std::uint64_t>>()> work = [files, hashes] {
      std::vector<std::uint64_t> sizes;
      for (const auto& h : hashes) sizes.push_back(files.bytes(h));
      return core::result<std::vector<std::uint64_t>>(std::move(sizes));
    };
    const auto sizes = co_await on_file_pool<std::vector<std::uint64_t>>("sizing snapshots",
                                                                        std::move(work));
    if (!sizes) {
      // Without the sizes the byte budget cannot be judged: nothing is evicted this time.
      log(log_level::warn, "kv.gc.skipped", {{"reason", sizes.err().message}});
      co_return gc_report{0, 0, entries.size(), 0, false};
    }
    for (std::size_t i = 0; i < entries.size(); ++i) entries[i].bytes = sizes.value()[i];
  }
  const core::retention_limits limits{opts_.retention_max_bytes, opts_.retention_max_sessions,
                                      opts_.retention_max_age_days,
                                      opts_.retention_max_sessions_per_credential};
  const auto plan = core::plan_retention(std::move(entries), limits, detail::unix_now());
  std::uint64_t freed = 0;
  for (const auto& e : plan.evict) {
    const auto bytes = co_await forget_session(e);
    freed += bytes;
  }
  co_return gc_report{plan.evict.size(), freed, plan.remaining_sessions, plan.remaining_bytes,
                      !snapshots_.shared()};
}

// The session budgets between gc runs, kept as each new session's first manifest is written:
// a burst of new sessions never outgrows them. Only the counts, the whole one and each
// credential's (sizes and ages wait for gc). Off when gc runs only on demand
// (retention.intervalMs 0).
net::awaitable<void> coordinator::enforce_session_budget() {
  const auto per_credential = opts_.retention_max_sessions_per_credential;
  if (opts_.retention_max_sessions == 0 && per_credential == 0) co_return;
  if (opts_.retention_interval.count() == 0) co_return;
  const core::retention_limits counts{0, opts_.retention_max_sessions, 0, per_credential};
  const auto plan = core::plan_retention(pool_.retention_entries(), counts, detail::unix_now());
  for (const auto& e : plan.evict) {
    const auto bytes = co_await forget_session(e);
    (void)bytes;
  }
}

net::awaitable<gc_report> coordinator::admin_gc() {
  auto t = co_await acquire_internal();
  const auto report = co_await run_gc();
  release_and_wake(t);
  co_return report;
}

net::awaitable<void> coordinator::gc_loop() {
  while (!stopped_) {
    gc_timer_.expires_after(opts_.retention_interval);
    auto [ec] = co_await gc_timer_.async_wait(token);
    if (ec || stopped_) co_return;
    auto t = co_await acquire_internal();
    const auto report = co_await run_gc();
    (void)report;
    release_and_wake(t);
  }
}

}  // namespace kvp::proxy
