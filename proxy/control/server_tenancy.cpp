// The server as one tenant while persistence is off (docs/design.md §5, §20).
#include "proxy/control/server_tenancy.hpp"

#include <algorithm>
#include <string>

#include "core/log.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

server_tenancy::server_tenancy(server_tenancy_parts parts, bool strict)
    : pool_(parts.pool),
      leases_(parts.leases),
      runtime_(parts.runtime),
      backend_(parts.backend),
      actions_(parts.actions),
      strict_(strict) {}

bool server_tenancy::may_pass_through(const lease_ticket& t) const {
  return !pool_.persistence_enabled() && !strict_ && !t.exclusive && !t.runtime_change &&
         leases_.idle() && !runtime_.probe_pending();
}

bool server_tenancy::needs_erase(const std::string& credential) const {
  return runtime_.erasable_slots() > 0 && pool_.pass_through_needs_erase(credential);
}

bool server_tenancy::takes_server_behind_leases() const {
  return !pool_.persistence_enabled() && !strict_ && runtime_.erasable_slots() > 0;
}

// docs/design.md §20 "Isolation without persistence": before a request runs where llama-server
// puts it, every slot is erased when another credential's content may be there.
net::awaitable<core::result<core::unit>> server_tenancy::claim(const core::request_identity& who,
                                                               bool alone) {
  if (needs_erase(who.credential)) {
    if (!alone)
      co_return core::error{core::errc::slot_busy, 0,
                            "another credential's requests run on the server", 1};
    const int slots = runtime_.erasable_slots();
    for (int id = 0; id < slots; ++id) {
      const auto r = co_await backend_.erase(id);
      if (r) continue;
      log(log_level::warn, "kv.slot.erase.failed",
          {{"slot", std::to_string(id)},
           {"code", std::string(core::to_string(core::errc::erase_failed))},
           {"reason", r.err().message}});
      co_return core::error{core::errc::erase_failed, 0,
                            "the server may hold another credential's KV and could not be erased"};
    }
    pool_.table().on_server_erased();
    log(log_level::info, "kv.server.erased",
        {{"slots", std::to_string(slots)},
         {"effect", "persistence is off: every slot erased before another credential's request"}});
  }
  pool_.placed().note_pass_through(who.credential);
  co_return core::unit{};
}

bool server_tenancy::holds_every_slot(const lease_ticket& t) const {
  const auto& leased = leases_.leased();
  const auto ids = pool_.table().ids();
  return std::all_of(ids.begin(), ids.end(), [&](int id) {
    const auto it = leased.find(id);
    return it != leased.end() && it->second.get() == &t;
  });
}

net::awaitable<core::result<core::unit>> server_tenancy::erase_foreign_slots(
    const core::request_identity& who) {
  for (const auto& e : pool_.placed().erases_before_unpinned(who)) {
    const auto failed = co_await actions_.run_erase(e.slot);
    if (failed && e.required)
      co_return core::error{*failed, 0,
                            "a slot holds another scope's KV and could not be erased before a "
                            "request llama-server places itself"};
  }
  co_return core::unit{};
}

}  // namespace kvp::proxy
