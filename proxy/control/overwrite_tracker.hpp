// Which slots a request llama-server cannot pin overwrote (managed mode, docs/design.md §5): such
// a request runs under the whole server, on a slot the server picks. Before it, each slot's last
// task is read (GET /slots); after it, a slot whose last task changed ran it, and its owner is
// forgotten (the session restores from its snapshot next time). When the slot list cannot be
// read before or after (llama-server --no-slots), every owner is forgotten, and that is logged
// once per change (kv.slot.state_unknown, then kv.slot.state_known).
//
// Strand-only: one per coordinator, used on its strand. Both calls REQUIRE the whole server
// held by the unpinnable request.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/slot_pool.hpp"

namespace kvp::proxy {

class overwrite_tracker {
 public:
  // Every reference must outlive this object.
  overwrite_tracker(std::string server_name, backends::kv_backend& backend, core::slot_pool& pool);

  // Before the request: each slot's last task.
  net::awaitable<void> note_tasks_before();
  // After the request of `credential` reached a slot: the owners of the slots it may have run
  // on are forgotten (kv.slot.overwritten for each), all of them when the slot list was
  // unreadable. The one slot that ran it holds that credential's content from now on; it is
  // returned (-1: unknown). An owned slot the list shows empty was cleared by llama-server
  // (idle-slot caching, docs/design.md §23): its owner is forgotten too (kv.slot.emptied).
  // `own`: the request's session, whose own slot running it again is no news (not logged).
  net::awaitable<int> forget_overwritten(const std::string& credential,
                                         const std::string& own = {});

 private:
  // Each slot as the slot list shows it, nullopt when it cannot be read.
  net::awaitable<std::optional<std::map<int, backends::slot_info>>> read_slots();
  void forget_emptied(const std::map<int, backends::slot_info>& after, int ran);
  void note_slots_readable(bool readable);

  std::string server_name_;
  backends::kv_backend& backend_;
  core::slot_pool& pool_;
  std::map<int, backends::slot_info> before_;  // empty: unread
  bool slots_unreadable_ = false;  // the slot list could not be read after an unpinnable request
};

}  // namespace kvp::proxy
