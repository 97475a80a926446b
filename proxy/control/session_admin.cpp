// The admin API's session operations and reads (docs/design.md §18, §10).
#include "proxy/control/session_admin.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "core/identity.hpp"
#include "core/log.hpp"
#include "proxy/control/wall_clock.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

core::error admin_persistence_off() {
  return core::error{core::errc::persistence_unavailable, 0, "persistence is off"};
}

core::error admin_unknown_session() {
  return core::error{core::errc::not_found, 0, "unknown session"};
}

// A failed save as the admin API answers it: the save's code (as a request refused by it in
// strict mode gets) with `message`.
core::error admin_save_failed(core::errc code, std::string message) {
  return core::error{code, 0, std::move(message)};
}

session_row row_of(core::session_view v) {
  session_row r{std::move(v.hash), std::move(v.session_id), v.resident, v.dirty, std::nullopt,
                std::nullopt, v.reuse};
  if (v.snapshot) r.snapshot = *v.snapshot;
  return r;
}

}  // namespace

session_admin::session_admin(std::string server_name, core::slot_pool& pool,
                             slot_actions& actions, plan_runner& plans,
                             retention_keeper& retention, const snapshot_files& snapshots,
                             const core::reuse_stats& reuse, session_admin_hooks hooks)
    : server_name_(std::move(server_name)),
      pool_(pool),
      actions_(actions),
      plans_(plans),
      retention_(retention),
      snapshots_(snapshots),
      reuse_(reuse),
      hooks_(std::move(hooks)) {}

session_admin::session_ref session_admin::resolve_session(const std::string& hash_or_id) const {
  if (auto known = pool_.listing().session(hash_or_id)) return {hash_or_id, known->session_id};
  const auto id = core::bounded_session_id(hash_or_id);  // as a request's header is read
  return {pool_.hash_for(id), id};
}

core::request_identity session_admin::restore_identity(const session_ref& ref) const {
  core::request_identity who;
  who.session_id = ref.session_id;
  if (const auto* m = pool_.records().find_manifest(ref.hash))
    who.credential = m->credential;
  else if (const auto known = pool_.listing().session(ref.hash))
    who.credential = known->credential;
  return who;
}

net::awaitable<admin_reply> session_admin::save(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_persistence_off();
  const auto hold = co_await hooks_.hold_server();
  const auto hash = resolve_session(hash_or_id).hash;
  if (!pool_.listing().session(hash)) co_return admin_unknown_session();
  if (pool_.table().slot_of(hash) < 0) co_return admin_outcome{admin_result::not_resident};
  auto step = pool_.plans().checkpoint_session(hash, steady_clock::now());
  if (!step) co_return admin_outcome{admin_result::clean};
  const auto saved = co_await actions_.run_save(*step);
  if (!saved) co_return admin_save_failed(saved.err().code, "save failed");
  co_return admin_outcome{admin_result::saved};
}

net::awaitable<admin_reply> session_admin::restore(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_persistence_off();
  const auto hold = co_await hooks_.hold_server();
  co_await hooks_.refresh_runtime(pool_.table().ids().front());  // a plan needs the current fingerprint
  if (!pool_.persistence_enabled()) co_return admin_persistence_off();
  // An eager restore (docs/design.md §9 prefers lazy ones): the plan a request would get, run
  // as a request's is, then the slot is left to the session without running anything on it.
  const auto who = restore_identity(resolve_session(hash_or_id));
  const int slot = pool_.choose_slot(who, pool_.table().ids()).value_or(pool_.table().ids().front());
  const auto prepared = co_await plans_.run(who, slot, false);
  if (!prepared) co_return prepared.err();
  (void)pool_.outcomes().end_inference(slot, false, steady_clock::now());
  switch (prepared.value()) {
    case core::prepare_kind::resident: co_return admin_outcome{admin_result::resident};
    case core::prepare_kind::restored: co_return admin_outcome{admin_result::restored};
    case core::prepare_kind::cold_fallback:
      co_return admin_outcome{admin_result::restore_failed_cold};
    default: co_return admin_outcome{admin_result::cold};
  }
}

net::awaitable<admin_reply> session_admin::invalidate(std::string hash_or_id, std::string note) {
  const auto hold = co_await hooks_.hold_server();
  const auto hash = resolve_session(hash_or_id).hash;
  auto m = pool_.plans().invalidate(hash, core::errc::operator_invalidated, wall_now(), note);
  if (!m) co_return core::error{core::errc::not_found, 0, "no snapshot for that session"};
  const auto invalid = *m;
  const auto written = co_await actions_.write_manifest(invalid);
  (void)written;  // logged
  log(log_level::info, "kv.snapshot.invalidated",
      {{"session", std::string(core::abbrev(hash))}, {"reason", m->invalid_reason}});
  co_return admin_outcome{admin_result::invalidated};
}

net::awaitable<admin_reply> session_admin::dispose(std::string hash_or_id) {
  if (!pool_.persistence_enabled()) co_return admin_persistence_off();
  const auto hold = co_await hooks_.hold_server();
  const auto hash = resolve_session(hash_or_id).hash;
  if (!pool_.listing().session(hash)) co_return admin_unknown_session();
  if (pool_.table().slot_of(hash) < 0) co_return admin_outcome{admin_result::nothing_to_dispose};
  auto code = core::errc::save_failed;  // what keeps a dirty slot when no save ran
  if (auto step = pool_.plans().checkpoint_session(hash, steady_clock::now())) {
    const auto saved = co_await actions_.run_save(*step);
    if (!saved) code = saved.err().code;
  }
  // release_session tells: a slot still dirty is kept.
  if (!pool_.plans().release_session(hash))
    co_return admin_save_failed(code, "save failed: the session keeps its slot");
  log(log_level::info, "kv.session.disposed", {{"session", std::string(core::abbrev(hash))}});
  co_return admin_outcome{admin_result::disposed};
}

net::awaitable<admin_reply> session_admin::purge(std::string hash_or_id) {
  // Every commit has landed: none can bring the session back.
  const auto hold = co_await hooks_.hold_server();
  const auto hash = resolve_session(hash_or_id).hash;
  const bool known = pool_.listing().session(hash).has_value();
  std::optional<std::string> kept;  // why the session's files still hold its KV
  if (known && !snapshots_.shared() && pool_.records().find_manifest(hash))
    kept = co_await retention_.overwrite_snapshots(hash);
  const auto freed = co_await retention_.drop_session(hash);
  if (!known) co_return admin_unknown_session();
  const auto sess = std::string(core::abbrev(hash));
  if (kept) {
    log(log_level::warn, "kv.session.purge.files_kept",
        {{"session", sess}, {"code", std::string(core::to_string(core::errc::save_failed))},
         {"files", core::snapshot_filename(hash, 'a') + "," + core::snapshot_filename(hash, 'b')},
         {"reason", *kept}});
    co_return core::error{core::errc::snapshot_files_kept, 0,
                          "purged, but llama-server could not overwrite the session's snapshot "
                          "files: they still hold its prompt (see the kv.session.purge.files_kept "
                          "log line)"};
  }
  log(log_level::info, "kv.session.purged",
      {{"session", sess}, {"freed_bytes", std::to_string(freed)}});
  co_return admin_outcome{admin_result::purged, freed, snapshots_.shared()};
}

net::awaitable<gc_report> session_admin::gc() {
  const auto hold = co_await hooks_.hold_server();
  co_return co_await retention_.run_gc();
}

session_page session_admin::sessions_page(const std::string& after, std::size_t limit) const {
  session_page page{server_name_, {}, {}};
  auto views = pool_.listing().sessions_after(after, limit + 1);
  if (views.size() > limit) {
    views.resize(limit);
    page.next = views.back().hash;
  }
  page.sessions.reserve(views.size());
  for (auto& v : views) page.sessions.push_back(row_with_reuse(std::move(v)));
  return page;
}

session_row session_admin::row_with_reuse(core::session_view v) const {
  auto row = row_of(std::move(v));
  row.last_restore = reuse_.last_restore(row.hash);
  return row;
}

core::result<session_row> session_admin::session(const std::string& hash_or_id) const {
  auto v = pool_.listing().session(resolve_session(hash_or_id).hash);
  if (!v) return admin_unknown_session();
  return row_with_reuse(std::move(*v));
}

}  // namespace kvp::proxy
