// The server as one tenant while persistence is off (docs/design.md §5 "Without persistence",
// §20 "Isolation without persistence"): whether a request may pass through without a lease,
// whether a credential's request needs the whole server erased first, the erases that make its
// credential the server's tenant, and, before a request llama-server places itself, the erases
// of the slots it may not run on. It decides and erases; the coordinator queues and releases.
//
// Strand-only: one per coordinator, used on its strand.
#pragma once

#include <string>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/result.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/runtime_monitor.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's parts the tenancy reads and erases with; each must outlive it.
struct server_tenancy_parts {
  core::slot_pool& pool;            // the tenant's credential, what the slots may hold
  const lease_queue& leases;        // read only: who holds or waits for a slot
  const runtime_monitor& runtime;   // the slots an erase reaches, a probe kept for later
  backends::kv_backend& backend;    // erases every slot of the server
  slot_actions& actions;            // erases one slot, as a plan's erase
};

class server_tenancy {
 public:
  // `strict`: failure.strict, which refuses session requests while persistence is off, so
  // nothing passes through.
  server_tenancy(server_tenancy_parts parts, bool strict);

  // docs/design.md §5: `t` may run without a slot now: persistence off, strict mode off, no
  // exclusive or runtime-changing ticket, nothing leased or queued that it could overtake,
  // and no probe waiting for the leases to go.
  bool may_pass_through(const lease_ticket& t) const;
  // Slot actions exist, and a request of `credential` may run only after every slot of the
  // server is erased (another credential's content may be on any of them).
  bool needs_erase(const std::string& credential) const;
  // Persistence off behind a lease held or waited for: a request may run on any slot, so it
  // takes the whole server as a pass-through request would (erased first for another tenant).
  bool takes_server_behind_leases() const;
  // Before a request of `who` runs with persistence off: the erases it needs, then its
  // credential is the server's tenant. `alone`: its ticket holds every slot of the pool
  // (holds_every_slot), so nothing runs meanwhile; one that is not alone and needs the erases
  // gets errc::slot_busy with Retry-After 1 (it comes back through admission and waits for
  // the server). A failed erase: errc::erase_failed, and the request must not run.
  net::awaitable<core::result<core::unit>> claim(const core::request_identity& who, bool alone);
  bool holds_every_slot(const lease_ticket& t) const;
  // REQUIRES the exclusive lease, persistence on: erases every slot the door (docs/design.md
  // §24) does not let `who` run on. A required erase that fails is the error to answer; a
  // tried one that fails leaves a cold run.
  net::awaitable<core::result<core::unit>> erase_foreign_slots(const core::request_identity& who);

 private:
  core::slot_pool& pool_;
  const lease_queue& leases_;
  const runtime_monitor& runtime_;
  backends::kv_backend& backend_;
  slot_actions& actions_;
  bool strict_;
};

}  // namespace kvp::proxy
