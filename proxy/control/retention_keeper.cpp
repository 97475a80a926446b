// Retention (docs/design.md §12): what core::plan_retention decided, carried out.
#include "proxy/control/retention_keeper.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/log.hpp"
#include "core/retention.hpp"
#include "proxy/control/wall_clock.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

retention_keeper::retention_keeper(net::any_io_executor strand, core::retention_limits limits,
                                   std::chrono::milliseconds interval,
                                   backends::kv_backend& backend, core::slot_pool& pool,
                                   slot_actions& actions, commit_pipeline& commits,
                                   const manifest_store& store, const snapshot_files& snapshots,
                                   core::reuse_stats& reuse, server_holder hold_server)
    : limits_(limits),
      interval_(interval),
      backend_(backend),
      pool_(pool),
      actions_(actions),
      commits_(commits),
      store_(store),
      snapshots_(snapshots),
      reuse_(reuse),
      hold_server_(std::move(hold_server)),
      gc_timer_(std::move(strand)) {}

void retention_keeper::stop() {
  stopped_ = true;
  gc_timer_.cancel();
}

void retention_keeper::note_restored(const std::string& hash) {
  restored_at_[hash] = unix_now();
}

void retention_keeper::forget(const std::string& hash) { restored_at_.erase(hash); }

// What deleting a session's files did.
struct files_removed {
  std::optional<std::string> manifest_problem;  // why the manifest could not be removed
  std::uint64_t snapshot_bytes = 0;             // shared-filesystem mode only
};

net::awaitable<std::uint64_t> retention_keeper::drop_session(std::string hash) {
  pool_.plans().forget(hash);
  reuse_.forget(hash);
  forget(hash);
  const auto store = store_;
  const auto files = snapshots_;
  std::function<core::result<files_removed>()> work = [store, files, hash] {
    files_removed out;
    if (auto r = store.remove(hash); !r) out.manifest_problem = r.err().message;
    out.snapshot_bytes = files.remove(hash);
    return core::result<files_removed>(out);
  };
  const auto removed = co_await actions_.on_file_pool<files_removed>("deleting a session's files",
                                                           std::move(work));
  if (!removed || removed->manifest_problem)
    log(log_level::warn, "kv.manifest.remove_failed",
        {{"reason", removed ? *removed->manifest_problem : removed.err().message}});
  co_return removed ? removed->snapshot_bytes : 0;
}

// REQUIRES: the session is not in use. Returns the bytes freed (shared-filesystem mode only:
// in server-owned mode the files are llama-server's, and kvpersist names them once in the log
// for the operator, see README "Retention").
net::awaitable<std::uint64_t> retention_keeper::forget_session(core::retention_eviction e) {
  if (commits_.in_flight(e.hash)) co_return 0;  // being saved: the next run decides again
  const auto freed = co_await drop_session(e.hash);
  const auto sess = std::string(core::abbrev(e.hash));
  if (!snapshots_.shared()) {
    ++counters_.sessions_forgotten;
    log(log_level::info, "kv.session.forgotten",
        {{"session", sess}, {"why", std::string(e.why)},
         {"files", core::snapshot_filename(e.hash, 'a') + "," + core::snapshot_filename(e.hash, 'b')}});
    co_return 0;
  }
  ++counters_.gc_evicted;
  counters_.gc_freed_bytes += freed;
  log(log_level::info, "kv.gc.evicted",
      {{"session", sess}, {"bytes", std::to_string(freed)}, {"why", std::string(e.why)}});
  co_return freed;
}

// REQUIRES: lease held (we may forget sessions).
net::awaitable<gc_report> retention_keeper::run_gc() {
  if (disk_budget_on()) co_return co_await run_gc_overwriting();
  auto entries = retention_by_use();
  if (snapshots_.shared()) {
    std::vector<std::string> hashes;
    for (const auto& e : entries) hashes.push_back(e.hash);
    const auto files = snapshots_;
    std::function<core::result<std::vector<std::uint64_t>>()> work = [files, hashes] {
      std::vector<std::uint64_t> sizes;
      for (const auto& h : hashes) sizes.push_back(files.bytes(h));
      return core::result<std::vector<std::uint64_t>>(std::move(sizes));
    };
    const auto sizes = co_await actions_.on_file_pool<std::vector<std::uint64_t>>("sizing snapshots",
                                                                        std::move(work));
    if (!sizes) {
      // Without the sizes the byte budget cannot be judged: nothing is evicted this time.
      log(log_level::warn, "kv.gc.skipped", {{"reason", sizes.err().message}});
      co_return gc_report{0, 0, entries.size(), 0, false};
    }
    for (std::size_t i = 0; i < entries.size(); ++i) entries[i].bytes = sizes.value()[i];
  }
  const auto plan = core::plan_retention(std::move(entries), limits_, unix_now());
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
net::awaitable<void> retention_keeper::enforce_session_budget() {
  const auto per_credential = limits_.max_sessions_per_credential;
  if (limits_.max_sessions == 0 && per_credential == 0) co_return;
  if (interval_.count() == 0) co_return;
  if (disk_budget_on()) co_return;  // keep_disk_budget applies the counts at every save
  const core::retention_limits counts{0, limits_.max_sessions, 0, per_credential};
  const auto plan = core::plan_retention(retention_by_use(), counts, unix_now());
  for (const auto& e : plan.evict) {
    const auto bytes = co_await forget_session(e);
    (void)bytes;
  }
}

std::vector<core::retention_entry> retention_keeper::retention_by_use() const {
  auto entries = pool_.listing().retention_entries();
  for (auto& e : entries)
    if (const auto it = restored_at_.find(e.hash); it != restored_at_.end())
      e.updated_s = std::max(e.updated_s, it->second);
  return entries;
}

bool retention_keeper::disk_budget_on() const {
  return !snapshots_.shared() &&
         (limits_.max_total_bytes > 0 || limits_.max_bytes_per_credential > 0);
}

net::awaitable<void> retention_keeper::keep_disk_budget(int slot, core::manifest saved) {
  if (!disk_budget_on()) co_return;
  auto entries = retention_by_use();
  // The session just saved counts as its commit will record it, and is never evicted by its
  // own save (a budget smaller than its snapshot keeps it alone, docs/design.md §12).
  std::erase_if(entries, [&](const auto& e) { return e.hash == saved.session_hash; });
  entries.push_back({saved.session_hash, false, unix_now(), saved.disk_bytes(), true,
                     saved.credential, saved.bytes});
  for (auto& e : entries)
    e.in_use = e.in_use || commits_.in_flight(e.hash) || actions_.restoring(e.hash);
  // Room for the saving credential's next save, in its share and in the whole budget; every
  // other credential's share keeps room for its own (docs/design.md §12, "Disk budget").
  const core::retention_room room{true, saved.credential};
  auto plan = core::plan_retention(std::move(entries), limits_, unix_now(), room);
  const bool over =
      limits_.max_total_bytes > 0 && plan.remaining_bytes > limits_.max_total_bytes;
  if (over && !warned_over_budget_)
    log(log_level::warn, "kv.gc.over_budget",
        {{"bytes", std::to_string(plan.remaining_bytes)},
         {"budget", std::to_string(limits_.max_total_bytes)},
         {"effect", "the snapshots in use alone exceed retention.maxTotalBytes"}});
  warned_over_budget_ = over;
  if (plan.evict.empty()) co_return;
  const auto done = co_await overwrite_evicted(slot, std::move(plan.evict));
  (void)done;  // logged and counted per session
}

net::awaitable<gc_report> retention_keeper::overwrite_evicted(
    int slot, std::vector<core::retention_eviction> evict) {
  gc_report out;
  // The slot's content goes: whoever owned it (saved) restores on its next request.
  pool_.table().forget_slot(slot);
  if (const auto code = co_await actions_.run_erase(slot)) {
    log(log_level::warn, "kv.gc.overwrite_failed",
        {{"slot", std::to_string(slot)}, {"code", std::string(core::to_string(*code))},
         {"effect", "nothing evicted until the next save"}});
    co_return out;
  }
  for (const auto& e : evict) {
    if (commits_.in_flight(e.hash)) continue;  // saved again meanwhile: the next run decides
    const auto sess = std::string(core::abbrev(e.hash));
    if (const auto kept = co_await overwrite_generations(slot, e.hash)) {
      log(log_level::warn, "kv.gc.overwrite_failed",
          {{"session", sess}, {"reason", *kept}, {"effect", "kept until the next save"}});
      break;
    }
    const auto deleted = co_await drop_session(e.hash);
    (void)deleted;  // 0: llama-server's files, overwritten above
    ++counters_.gc_evicted;
    counters_.gc_freed_bytes += e.bytes;
    ++out.evicted;
    out.freed_bytes += e.bytes;
    log(log_level::info, "kv.gc.evicted",
        {{"session", sess}, {"bytes", std::to_string(e.bytes)}, {"why", std::string(e.why)},
         {"files", "overwritten"}});
  }
  co_return out;
}

// The exclusive lease is held: the slot used is an empty one, else the first, whose dirty
// owner is saved first (that save keeps the budget itself; what is left is planned after).
net::awaitable<gc_report> retention_keeper::run_gc_overwriting() {
  auto report = [this](const gc_report& done) {
    const auto left = pool_.listing().retention_entries();
    std::uint64_t bytes = 0;
    for (const auto& e : left) bytes += e.bytes;
    return gc_report{done.evicted, done.freed_bytes, left.size(), bytes, false};
  };
  // Persistence off (breaker open, unsupported server): no slot action is possible, and
  // forgetting without overwriting would leave files the budget no longer counts.
  if (!pool_.persistence_enabled()) {
    log(log_level::info, "kv.gc.skipped",
        {{"reason", "persistence is off: the disk budget needs slot actions"}});
    co_return report({});
  }
  const int slot = overwrite_slot("");
  if (auto why = co_await save_owner_before_overwrite(slot, "")) {
    log(log_level::warn, "kv.gc.skipped", {{"reason", *why}});
    co_return report({});
  }
  auto entries = retention_by_use();
  for (auto& e : entries) e.in_use = e.in_use || commits_.in_flight(e.hash);
  // No save is coming that gc knows of: each share keeps room for its own credential's next
  // one; the whole budget's room is kept by each save for its saver.
  const core::retention_room room{true, std::nullopt};
  auto plan = core::plan_retention(std::move(entries), limits_, unix_now(), room);
  gc_report done;
  if (!plan.evict.empty()) done = co_await overwrite_evicted(slot, std::move(plan.evict));
  co_return report(done);
}

// The slot a server-owned overwrite uses: the session's own, else an empty one, else the
// first. REQUIRES: the exclusive lease.
int retention_keeper::overwrite_slot(const std::string& hash) const {
  if (const int own = pool_.table().slot_of(hash); own >= 0) return own;
  for (int id : pool_.table().ids())
    if (pool_.table().content(id).whose == core::content_whose::empty) return id;
  return pool_.table().ids().front();
}

// Server-owned mode (docs/design.md §12, "Purge"): kvpersist cannot delete llama-server's
// files, so it erases a slot and saves that empty slot over both generations of the session:
// what was the prompt's KV becomes an empty-slot header. A dirty owner of the slot used is
// saved first and then let go (its next request restores). Returns why a file still holds the
// session's KV, or nullopt when both were overwritten. REQUIRES: the exclusive lease.
net::awaitable<std::optional<std::string>> retention_keeper::overwrite_snapshots(std::string hash) {
  if (!pool_.persistence_enabled()) co_return "persistence is off: no slot action is possible";
  const int slot = overwrite_slot(hash);
  if (auto why = co_await save_owner_before_overwrite(slot, hash)) co_return why;
  pool_.table().forget_slot(slot);
  if (const auto code = co_await actions_.run_erase(slot))
    co_return fmt::format("the slot could not be erased ({})", core::to_string(*code));
  co_return co_await overwrite_generations(slot, hash);
}

net::awaitable<std::optional<std::string>> retention_keeper::save_owner_before_overwrite(
    int slot, const std::string& hash) {
  const auto& holder = pool_.table().owner(slot);
  if (holder.empty() || holder == hash) co_return std::nullopt;
  if (auto s = pool_.plans().checkpoint_slot(slot, steady_clock::now())) {
    const auto saved = co_await actions_.run_save(*s);
    if (!saved) co_return "the slot's owner could not be saved first: " + saved.err().message;
  }
  co_return std::nullopt;
}

net::awaitable<std::optional<std::string>> retention_keeper::overwrite_generations(int slot,
                                                                               std::string hash) {
  const auto* m = pool_.records().find_manifest(hash);
  const char current = m ? m->generation : 'b';
  for (char g : {current == 'a' ? 'b' : 'a', current}) {
    const auto file = core::snapshot_filename(hash, g);
    const auto r = co_await backend_.save(slot, file);
    if (!r) co_return file + ": " + r.err().message;
    if (r->n_saved != 0) {
      pool_.table().forget_slot(slot);  // something kvpersist did not plan ran there
      co_return fmt::format("{}: llama-server saved {} tokens, not an empty slot", file,
                            r->n_saved);
    }
  }
  co_return std::nullopt;
}

net::awaitable<void> retention_keeper::gc_loop() {
  while (!stopped_) {
    gc_timer_.expires_after(interval_);
    auto [ec] = co_await gc_timer_.async_wait(token);
    if (ec || stopped_) co_return;
    const auto hold = co_await hold_server_();
    const auto report = co_await run_gc();
    (void)report;
  }
}

}  // namespace kvp::proxy
