// Retention (docs/design.md §12): core::plan_retention decides which sessions to forget;
// the coordinator forgets them, deletes their files in shared-filesystem mode, and runs gc
// on its interval, on demand (POST /kv/gc) and as new sessions arrive.
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

// REQUIRES: the session is not in use. Returns the bytes freed (shared-filesystem mode only:
// in server-owned mode the files are llama-server's, and kvpersist names them once in the log
// for the operator, see README "Retention").
std::uint64_t coordinator::forget_session(const core::retention_eviction& e) {
  if (auto r = store_.remove(e.hash); !r)
    log(log_level::warn, "kv.manifest.remove_failed", {{"reason", r.err().message}});
  pool_.forget(e.hash);
  last_restore_.erase(e.hash);
  const auto sess = std::string(core::abbrev(e.hash));
  if (!snapshots_.shared()) {
    ++sessions_forgotten_;
    log(log_level::info, "kv.session.forgotten",
        {{"session", sess}, {"why", std::string(e.why)},
         {"files", core::snapshot_filename(e.hash, 'a') + "," + core::snapshot_filename(e.hash, 'b')}});
    return 0;
  }
  const auto freed = snapshots_.remove(e.hash);
  ++gc_evicted_;
  gc_freed_bytes_ += freed;
  log(log_level::info, "kv.gc.evicted",
      {{"session", sess}, {"bytes", std::to_string(freed)}, {"why", std::string(e.why)}});
  return freed;
}

gc_report coordinator::run_gc() {
  // REQUIRES: lease held (we may forget sessions).
  auto entries = pool_.retention_entries();
  if (snapshots_.shared())
    for (auto& e : entries) e.bytes = snapshots_.bytes(e.hash);
  const core::retention_limits limits{opts_.retention_max_bytes, opts_.retention_max_sessions,
                                      opts_.retention_max_age_days};
  const auto plan = core::plan_retention(std::move(entries), limits, detail::unix_now());
  std::uint64_t freed = 0;
  for (const auto& e : plan.evict) freed += forget_session(e);
  return gc_report{plan.evict.size(), freed, plan.remaining_sessions, plan.remaining_bytes,
                   !snapshots_.shared()};
}

// The session budget between gc runs, kept as each new session's first manifest is written:
// a burst of new sessions never outgrows it. Only the count (sizes and ages wait for gc).
// Off when gc runs only on demand (retention.intervalMs 0).
void coordinator::enforce_session_budget() {
  if (opts_.retention_max_sessions == 0 || opts_.retention_interval.count() == 0) return;
  const auto plan = core::plan_retention(pool_.retention_entries(),
                                         {0, opts_.retention_max_sessions, 0}, detail::unix_now());
  for (const auto& e : plan.evict) forget_session(e);
}

net::awaitable<gc_report> coordinator::admin_gc() {
  auto t = co_await acquire_internal();
  const auto report = run_gc();
  release_and_wake(t);
  co_return report;
}

net::awaitable<void> coordinator::gc_loop() {
  while (!stopped_) {
    gc_timer_.expires_after(opts_.retention_interval);
    auto [ec] = co_await gc_timer_.async_wait(token);
    if (ec || stopped_) co_return;
    auto t = co_await acquire_internal();
    run_gc();
    release_and_wake(t);
  }
}

}  // namespace kvp::proxy
