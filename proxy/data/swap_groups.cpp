#include "proxy/data/swap_groups.hpp"

#include "core/log.hpp"
#include "proxy/control/coordinator.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {
// How often a caller looks whether another caller's switch has ended: a switch is a few saves,
// so a short poll costs nothing and needs no timer shared between threads.
constexpr std::chrono::milliseconds group_switch_poll{10};
}  // namespace

const swap_groups::member* swap_groups::find(const std::string& server) const {
  for (const auto& m : members_)
    if (m.server == server) return &m;
  return nullptr;
}

net::awaitable<void> swap_groups::before_serving(const std::string& server) {
  const member* to = find(server);
  if (!to || to->group.empty()) co_return;
  for (;;) {
    bool wait = false;
    {
      std::lock_guard lock(mu_);
      auto& g = groups_[to->group];
      if (g.switching) {
        wait = true;
      } else if (g.active == server) {
        co_return;
      } else {
        g.switching = true;
      }
    }
    if (!wait) break;
    steady_timer t(co_await net::this_coro::executor, group_switch_poll);
    auto [ec] = co_await t.async_wait(token);
    (void)ec;
  }
  co_await save_others(*to);
  std::lock_guard lock(mu_);
  auto& g = groups_[to->group];
  g.active = server;
  g.switching = false;
}

net::awaitable<void> swap_groups::save_others(const member& to) {
  for (const auto& m : members_) {
    if (&m == &to || m.group != to.group) continue;
    const auto saved = co_await m.coord->on_strand(m.coord->checkpoint());
    // Its process is about to stop: the next request re-reads /props and sees the new one.
    m.coord->note_upstream_trouble();
    log(saved ? log_level::info : log_level::warn, "kv.swap.saved",
        {{"group", to.group}, {"from", m.server}, {"to", to.server},
         {"ok", saved ? "1" : "0"}});
  }
}

}  // namespace kvp::proxy
