// The admin API's session operations and flush (docs/design.md §18, §10): each takes the
// exclusive lease, so no request runs while it changes a session's state.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/log.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/control/coordinator_internal.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using detail::wall_now;
using std::chrono::steady_clock;

coordinator::session_ref coordinator::resolve_session(const std::string& hash_or_id) const {
  if (auto known = pool_.session(hash_or_id)) return {hash_or_id, known->session_id};
  const auto id = core::bounded_session_id(hash_or_id);  // as a request's header is read
  return {pool_.hash_for(id), id};
}

net::awaitable<admin_outcome> coordinator::admin_save(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_outcome{admin_result::persistence_off};
  const auto hold = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_outcome out;
  if (!pool_.session(hash)) {
    out.result = admin_result::unknown_session;
  } else if (pool_.slot_of(hash) < 0) {
    out.result = admin_result::not_resident;
  } else if (auto s = pool_.checkpoint_session(hash, steady_clock::now())) {
    const auto saved = co_await actions_.run_save(*s);
    out.result = saved ? admin_result::saved : admin_result::save_failed;
  } else {
    out.result = admin_result::clean;
  }
  co_return out;
}

net::awaitable<admin_outcome> coordinator::admin_restore(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_outcome{admin_result::persistence_off};
  const auto hold = co_await acquire_internal();
  co_await refresh_runtime(pool_.slot_ids().front());  // a plan needs the current fingerprint
  if (!pool_.persistence_enabled()) co_return admin_outcome{admin_result::persistence_off};
  // An eager restore (docs/design.md §9 prefers lazy ones): the same plan a request would get, then
  // the slot is left to the session without running anything on it.
  core::request_identity who;
  who.session_id = resolve_session(hash_or_id).session_id;
  const int slot = pool_.choose_slot(who, pool_.slot_ids()).value_or(pool_.slot_ids().front());
  auto plan = pool_.prepare(who, slot, steady_clock::now(), wall_now());
  for (const auto& m : plan.manifest_writes) {
    const auto written = co_await actions_.write_manifest(m);
    (void)written;  // logged
  }
  admin_outcome out = admin_outcome{admin_result::resident};
  if (plan.fail) {
    pool_.abort_prepare(slot);
    out.result = admin_result::circuit_open;
  } else if (!plan.resident) {
    // The request path's calls, checks, logs and metrics; an operator's restore is never
    // refused by strict mode (that policy is about answering clients).
    const auto done = co_await actions_.execute(plan, false);
    out.result = !done.restore           ? admin_result::cold
                 : done.restore->restored ? admin_result::restored
                                          : admin_result::restore_failed_cold;
    pool_.start_inference(who, slot);
    pool_.end_inference(slot, false, steady_clock::now());
  } else {
    pool_.start_inference(who, slot);
    pool_.end_inference(slot, false, steady_clock::now());
  }
  co_return out;
}

net::awaitable<admin_outcome> coordinator::admin_invalidate(std::string hash_or_id, std::string note) {
  const auto hold = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_outcome out;
  if (auto m = pool_.invalidate(hash, core::errc::operator_invalidated, wall_now(), note)) {
    const auto invalid = *m;
    const auto written = co_await actions_.write_manifest(invalid);
    (void)written;  // logged
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", std::string(core::abbrev(hash))}, {"reason", m->invalid_reason}});
    out.result = admin_result::invalidated;
  } else {
    out.result = admin_result::no_snapshot;
  }
  co_return out;
}

net::awaitable<admin_outcome> coordinator::admin_dispose(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_outcome{admin_result::persistence_off};
  const auto hold = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_outcome out = admin_outcome{admin_result::disposed};
  if (!pool_.session(hash)) {
    out.result = admin_result::unknown_session;
  } else if (pool_.slot_of(hash) < 0) {
    out.result = admin_result::nothing_to_dispose;
  } else {
    if (auto s = pool_.checkpoint_session(hash, steady_clock::now())) co_await actions_.run_save(*s);
    if (!pool_.release_session(hash)) {
      out.result = admin_result::save_failed_kept_slot;
    } else {
      log(log_level::info, "kv.session.disposed", {{"session", std::string(core::abbrev(hash))}});
    }
  }
  co_return out;
}

// The slot a server-owned purge overwrites the files from: the session's own, else an empty
// one, else the first. REQUIRES: the exclusive lease.
int coordinator::purge_slot(const std::string& hash) const {
  if (const int own = pool_.slot_of(hash); own >= 0) return own;
  for (int id : pool_.slot_ids())
    if (pool_.content(id).whose == core::content_whose::empty) return id;
  return pool_.slot_ids().front();
}

// Server-owned mode (docs/design.md §12, "Purge"): kvpersist cannot delete llama-server's
// files, so it erases a slot and saves that empty slot over both generations of the session:
// what was the prompt's KV becomes an empty-slot header. A dirty owner of the slot used is
// saved first and then let go (its next request restores). Returns why a file still holds the
// session's KV, or nullopt when both were overwritten. REQUIRES: the exclusive lease.
net::awaitable<std::optional<std::string>> coordinator::overwrite_snapshots(std::string hash) {
  if (!pool_.persistence_enabled()) co_return "persistence is off: no slot action is possible";
  const int slot = purge_slot(hash);
  if (auto why = co_await save_owner_before_overwrite(slot, hash)) co_return why;
  pool_.forget_slot(slot);
  if (const auto code = co_await actions_.run_erase(slot))
    co_return fmt::format("the slot could not be erased ({})", core::to_string(*code));
  co_return co_await overwrite_generations(slot, hash);
}

net::awaitable<std::optional<std::string>> coordinator::save_owner_before_overwrite(
    int slot, const std::string& hash) {
  const auto& holder = pool_.owner(slot);
  if (holder.empty() || holder == hash) co_return std::nullopt;
  if (auto s = pool_.checkpoint_slot(slot, steady_clock::now())) {
    const auto saved = co_await actions_.run_save(*s);
    if (!saved) co_return "the slot's owner could not be saved first: " + saved.err().message;
  }
  co_return std::nullopt;
}

net::awaitable<std::optional<std::string>> coordinator::overwrite_generations(int slot,
                                                                               std::string hash) {
  const auto* m = pool_.find_manifest(hash);
  const char current = m ? m->generation : 'b';
  for (char g : {current == 'a' ? 'b' : 'a', current}) {
    const auto file = core::snapshot_filename(hash, g);
    const auto r = co_await backend_->save(slot, file);
    if (!r) co_return file + ": " + r.err().message;
    if (r->n_saved != 0) {
      pool_.forget_slot(slot);  // something kvpersist did not plan ran there
      co_return fmt::format("{}: llama-server saved {} tokens, not an empty slot", file,
                            r->n_saved);
    }
  }
  co_return std::nullopt;
}

net::awaitable<admin_outcome> coordinator::admin_purge(std::string hash_or_id) {
  const auto hold = co_await acquire_internal();  // every commit has landed: none can bring it back
  const auto hash = resolve_session(hash_or_id).hash;
  const bool known = pool_.session(hash).has_value();
  std::optional<std::string> kept;  // why the session's files still hold its KV
  if (known && !snapshots_.shared() && pool_.find_manifest(hash))
    kept = co_await overwrite_snapshots(hash);
  const auto freed = co_await drop_session(hash);
  if (!known) co_return admin_outcome{admin_result::unknown_session};
  const auto sess = std::string(core::abbrev(hash));
  if (kept) {
    log(log_level::warn, "kv.session.purge.files_kept",
        {{"session", sess}, {"code", std::string(core::to_string(core::errc::save_failed))},
         {"files", core::snapshot_filename(hash, 'a') + "," + core::snapshot_filename(hash, 'b')},
         {"reason", *kept}});
    co_return admin_outcome{admin_result::purged_files_kept};
  }
  log(log_level::info, "kv.session.purged",
      {{"session", sess}, {"freed_bytes", std::to_string(freed)}});
  co_return admin_outcome{admin_result::purged, freed, snapshots_.shared()};
}

net::awaitable<admin_outcome> coordinator::admin_flush() {
  const bool ok = co_await checkpoint();
  co_return admin_outcome{ok ? admin_result::flushed : admin_result::save_failed};
}

}  // namespace kvp::proxy
