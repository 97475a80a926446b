// The admin API's session operations and reads (docs/design.md §18, §10): save, restore,
// invalidate, dispose and purge one session, gc (retention now), and the session list and one
// session as the admin API shows them. Each operation takes the whole server first (the `hold_server` hook), so no
// request runs while it changes a session's state; its slot work goes through slot_actions and
// retention_keeper. The admin plane reaches it through coordinator::admin(), on the
// coordinator's strand (coordinator::on_strand).
//
// Strand-only: one per coordinator, used on its strand.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/net.hpp"
#include "core/manifest.hpp"
#include "core/reuse_stats.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/plan_runner.hpp"
#include "proxy/control/retention_keeper.hpp"
#include "proxy/control/slot_actions.hpp"
#include "proxy/control/snapshot_files.hpp"

namespace kvp::proxy {

// One session as the admin API lists it: a copy, so that it can be formatted off the strand.
struct session_row {
  std::string hash;
  std::string session_id;
  bool resident = false;
  bool dirty = false;
  std::optional<core::manifest> snapshot;
  std::optional<core::restore_reuse> last_restore;
  core::session_reuse reuse;
};

// A page of GET /kv/sessions: sessions in hash order; `next` is the last hash when more follow.
struct session_page {
  std::string server;
  std::vector<session_row> sessions;
  std::string next;
};

// What an admin operation did when it succeeded; proxy/admin/admin.cpp answers it with 200 and
// {"result": ...}. A failure is a core::error, answered by error_answer.
enum class admin_result {
  saved,
  clean,                // save: the session owns a slot with nothing unsaved
  not_resident,         // save: no slot, so its last snapshot is current
  restored,
  resident,             // restore: it already owns a slot
  cold,                 // restore: no usable snapshot
  restore_failed_cold,  // restore: the snapshot did not load; the slot starts cold
  invalidated,
  disposed,
  nothing_to_dispose,   // dispose: it owns no slot
  purged,
  flushed,
};

struct admin_outcome {
  admin_result result = admin_result::saved;
  std::uint64_t freed_bytes = 0;  // purged: the snapshot bytes deleted
  bool files_deleted = false;     // purged: shared-filesystem mode deletes the files
};

// An admin operation's outcome, or why it failed: errc::persistence_unavailable (persistence
// off, its circuit open), errc::not_found (no such session, no snapshot to invalidate), a failed
// save's code (the session keeps its previous snapshot, and its slot when disposed), or
// errc::snapshot_files_kept (purge: forgotten, but llama-server could not overwrite its files).
using admin_reply = core::result<admin_outcome>;

// What session_admin needs of its owner.
struct session_admin_hooks {
  // The whole server, held until the returned object is destroyed.
  server_holder hold_server;
  // Reads the runtime again if the server may have changed, on `slot` (held), before a plan.
  std::function<net::awaitable<void>(int slot)> refresh_runtime;
};

class session_admin {
 public:
  // Every reference must outlive this object.
  session_admin(std::string server_name, core::slot_pool& pool, slot_actions& actions,
                plan_runner& plans, retention_keeper& retention,
                const snapshot_files& snapshots, const core::reuse_stats& reuse,
                session_admin_hooks hooks);

  // Each operation and read takes the harness's session id or a known session's 64-hex hash.
  // Save: checkpoints the session's slot if it is dirty.
  net::awaitable<admin_reply> save(std::string hash_or_id);
  // Restore: the plan a request of the session would get, run now through the requests' plan
  // runner (never strict: that policy is about answering clients); the slot is left to it.
  net::awaitable<admin_reply> restore(std::string hash_or_id);
  // Invalidate: its snapshot is not restored again; `note`, the operator's reason, is recorded
  // in the manifest (invalidNote).
  net::awaitable<admin_reply> invalidate(std::string hash_or_id, std::string note);
  // Dispose: checkpoint the session if it owns a dirty slot, then drop the ownership; the
  // session stays known and restores on its next request.
  net::awaitable<admin_reply> dispose(std::string hash_or_id);
  // Purge: forgets the session and its manifest, and deletes (shared-filesystem mode) or
  // overwrites (server-owned mode) its snapshot files.
  net::awaitable<admin_reply> purge(std::string hash_or_id);

  // Gc: retention now (retention_keeper::run_gc), under a hold of the server.
  net::awaitable<gc_report> gc();

  // Up to `limit` sessions with a hash greater than `after`, in hash order.
  session_page sessions_page(const std::string& after, std::size_t limit) const;
  // One session; errc::not_found when it is not known.
  core::result<session_row> session(const std::string& hash_or_id) const;

 private:
  struct session_ref {
    std::string hash;
    std::string session_id;
  };
  // The one rule of every admin session route: the hash of a known session names it,
  // anything else is a harness's session id.
  session_ref resolve_session(const std::string& hash_or_id) const;
  // The identity a request of the session would carry for a restore (docs/design.md §20): its
  // id and the credential recorded in its manifest (of its requests, without one), so that a
  // credential-scoped session plans its own hash and the slot's content and the session stay
  // that credential's. An unknown session gets none.
  core::request_identity restore_identity(const session_ref& ref) const;
  session_row row_with_reuse(core::session_view v) const;

  std::string server_name_;
  core::slot_pool& pool_;
  slot_actions& actions_;
  plan_runner& plans_;
  retention_keeper& retention_;
  const snapshot_files& snapshots_;
  const core::reuse_stats& reuse_;
  session_admin_hooks hooks_;
};

}  // namespace kvp::proxy
