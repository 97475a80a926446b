// Which slots an unpinnable request overwrote: each slot's last task before and after it.
#include "proxy/control/overwrite_tracker.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/log.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

overwrite_tracker::overwrite_tracker(std::string server_name, backends::kv_backend& backend,
                                     core::slot_pool& pool)
    : server_name_(std::move(server_name)), backend_(backend), pool_(pool) {}

net::awaitable<std::optional<std::map<int, backends::slot_info>>> overwrite_tracker::read_slots() {
  auto r = co_await backend_.inspect_slots();
  if (!r) co_return std::nullopt;
  std::map<int, backends::slot_info> out;
  for (const auto& s : r.value()) out[s.id] = s;
  co_return out;
}

net::awaitable<void> overwrite_tracker::note_tasks_before() {
  auto before = co_await read_slots();
  before_ = before ? *before : std::map<int, backends::slot_info>{};
}

net::awaitable<int> overwrite_tracker::forget_overwritten(const std::string& credential,
                                                          const std::string& own) {
  auto after = co_await read_slots();
  // The request ran as a task on some slot: a list that shows no task cannot tell which.
  const bool readable = after && !before_.empty() &&
                        std::any_of(after->begin(), after->end(),
                                    [](const auto& slot) { return slot.second.id_task >= 0; });
  note_slots_readable(readable);
  std::vector<int> touched;
  for (int id : pool_.table().ids()) {
    // The slot that ran the request has a new last task; if the server cannot tell us,
    // nobody's slot can be trusted.
    const bool same = readable && after->contains(id) && before_.contains(id) &&
                      (*after)[id].id_task == before_[id].id_task;
    if (!same) touched.push_back(id);
  }
  for (int id : touched) {
    if (const auto& owner = pool_.table().owner(id); !owner.empty() && owner != own) {
      log(log_level::info, "kv.slot.overwritten",
          {{"slot", std::to_string(id)},
           {"session", std::string(core::abbrev(pool_.table().owner(id)))},
           {"effect", "restores from its snapshot next time"}});
    }
    // docs/design.md §20: known to be the request's when it is the one slot that changed.
    if (readable && touched.size() == 1)
      pool_.placed().note_unpinned_ran(id, credential);
    else
      pool_.table().forget_slot(id);
  }
  const int ran = readable && touched.size() == 1 ? touched.front() : -1;
  if (readable) forget_emptied(*after, ran);
  co_return ran;
}

// docs/design.md §23: with a unified pool and idle-slot caching, the request's task start
// cleared every other idle slot (llama-server copied it to its RAM cache).
void overwrite_tracker::forget_emptied(const std::map<int, backends::slot_info>& after, int ran) {
  for (const auto& [id, s] : after) {
    if (id == ran || s.is_processing || s.n_prompt_tokens != 0) continue;  // -1: not said
    if (pool_.table().owner(id).empty()) continue;
    log(log_level::info, "kv.slot.emptied",
        {{"slot", std::to_string(id)},
         {"session", std::string(core::abbrev(pool_.table().owner(id)))},
         {"effect", "restores from its snapshot next time"}});
    pool_.placed().note_emptied(id);
  }
}

// Logged once per change: with the slot list unreadable (llama-server --no-slots answers 501),
// kvpersist cannot tell which slot an unpinnable request ran on, so it forgets every owner.
void overwrite_tracker::note_slots_readable(bool readable) {
  if (readable == !slots_unreadable_) return;
  slots_unreadable_ = !readable;
  if (readable) {
    log(log_level::info, "kv.slot.state_known", {{"server", server_name_}});
    return;
  }
  log(log_level::warn, "kv.slot.state_unknown",
      {{"server", server_name_},
       {"code", std::string(core::to_string(core::errc::slot_state_invalid))},
       {"reason", "the slot list could not be read: the slot an unpinnable request ran on is unknown"},
       {"effect", "every slot restores from its snapshot after an unpinnable request"}});
}

}  // namespace kvp::proxy
