// llama-server's sleep mode as kvpersist follows it (docs/design.md §4).
#include "proxy/control/sleep_tracker.hpp"

#include <algorithm>
#include <functional>
#include <utility>

#include <fmt/format.h>

#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

// The period an earlier process learned (sleep.json); 0: none, or unreadable.
net::awaitable<std::chrono::seconds> read_learned_sleep(slot_actions& actions,
                                                        manifest_store store) {
  std::function<core::result<std::chrono::seconds>()> work = [store] {
    return core::result<std::chrono::seconds>(store.read_learned_sleep());
  };
  auto r =
      co_await actions.on_file_pool<std::chrono::seconds>("reading sleep.json", std::move(work));
  co_return r ? r.value() : std::chrono::seconds(0);
}

net::awaitable<void> record_learned_sleep(slot_actions& actions, manifest_store store,
                                          std::chrono::seconds period) {
  std::function<core::result<core::unit>()> work = [store, period] {
    return store.write_learned_sleep(period);
  };
  const auto w = co_await actions.on_file_pool<core::unit>("writing sleep.json", std::move(work));
  if (!w) log(log_level::warn, "kv.state.write_failed", {{"reason", w.err().message}});
}

}  // namespace

// The idle checkpoint runs at the latest a second before llama-server would sleep (at half
// the sleep period for short ones), so a dirty slot is saved while its KV still exists.
std::chrono::milliseconds checkpoint_before_sleep(std::chrono::milliseconds idle,
                                                  std::chrono::seconds sleep_idle) {
  if (sleep_idle.count() <= 0) return idle;
  const std::chrono::milliseconds period = sleep_idle;
  const auto before = std::max(period - std::chrono::seconds(1), period / 2);
  return idle.count() > 0 ? std::min(idle, before) : before;
}

sleep_tracker::sleep_tracker(net::any_io_executor strand, sleep_tracker_parts parts,
                             sleep_tracker_options opts)
    : strand_(std::move(strand)),
      pool_(parts.pool),
      store_(parts.store),
      actions_(parts.actions),
      opts_(std::move(opts)),
      watch_(opts_.sleep_idle) {}

net::awaitable<void> sleep_tracker::start() {
  if (watch_.sleep_configured()) co_return;
  const auto learned = co_await read_learned_sleep(actions_, store_);
  if (learned.count() > 0) adopt_period(learned);
}

void sleep_tracker::note_sleeping(bool sleeping) {
  const auto change = watch_.note_sleeping(sleeping, steady_clock::now(), last_server_use());
  using action = core::sleep_change::action;
  if (change.what == action::none) return;
  if (change.what == action::woke) {
    log(log_level::info, "kv.backend.awake", {{"server", opts_.server_name}});
    return;
  }
  int dirty = 0;
  for (int id : pool_.table().ids())
    dirty += pool_.records().dirty(pool_.table().owner(id)) ? 1 : 0;
  pool_.table().on_epoch_change();
  log(dirty ? log_level::warn : log_level::info, "kv.backend.sleeping",
      {{"server", opts_.server_name}, {"unsaved_sessions", std::to_string(dirty)},
       {"effect", "every slot's KV is gone; sessions restore from their snapshots"}});
  if (change.learn.count() > 0) {
    adopt_period(change.learn);
    net::co_spawn(strand_, record_learned_sleep(actions_, store_, change.learn), log_exception);
  }
}

void sleep_tracker::note_request_finished(int slot, time_point at) { finished_at_[slot] = at; }

bool sleep_tracker::may_have_slept(int slot, time_point now) const {
  const auto period = watch_.sleep_period();
  if (period.count() <= 0 || pool_.table().owner(slot).empty()) return false;
  auto it = finished_at_.find(slot);
  return it != finished_at_.end() && now - it->second >= period;
}

// What kvpersist last sent llama-server that restarts its sleep timer: the end of a request,
// or a slot list read. nullopt until a request ended in this process.
std::optional<sleep_tracker::time_point> sleep_tracker::last_server_use() const {
  std::optional<time_point> out;
  for (const auto& [slot, at] : finished_at_)
    if (!out || at > *out) out = at;
  if (out) out = std::max(*out, last_slots_read_);
  return out;
}

void sleep_tracker::adopt_period(std::chrono::seconds period) {
  watch_.learn_sleep_period(period);
  pool_.checkpoints().set_idle_checkpoint(checkpoint_before_sleep(opts_.idle_checkpoint, period));
  log(log_level::warn, "kv.backend.sleep_learned",
      {{"server", opts_.server_name}, {"sleep_idle_seconds", std::to_string(period.count())},
       {"effect", fmt::format("dirty sessions are saved after {} ms idle; set "
                              "upstream.sleepIdleSeconds to llama-server's --sleep-idle-seconds",
                              pool_.checkpoints().idle_checkpoint().count())}});
}

}  // namespace kvp::proxy
