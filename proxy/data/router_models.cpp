#include "proxy/data/router_models.hpp"

#include <algorithm>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "core/log.hpp"
#include "proxy/control/coordinator.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using namespace net::experimental::awaitable_operators;

namespace {
// How often a caller looks whether another caller's switch has ended, and whether the client
// of a load is still there.
constexpr std::chrono::milliseconds model_switch_poll{10};
constexpr std::chrono::milliseconds load_poll{100};

const backends::router_model* status_of(const std::vector<backends::router_model>& models,
                                        std::string_view id) {
  auto it = std::find_if(models.begin(), models.end(),
                         [&](const backends::router_model& m) { return m.id == id; });
  return it == models.end() ? nullptr : &*it;
}

net::awaitable<void> pause(std::chrono::milliseconds d) {
  steady_timer t(co_await net::this_coro::executor, d);
  auto [ec] = co_await t.async_wait(token);
  (void)ec;
}

// Completes once `wanted` says no more (polled every load_poll).
net::awaitable<void> until_unwanted(const std::function<bool()>& wanted) {
  while (wanted()) co_await pause(load_poll);
}
}  // namespace

router_models::router_models(std::string server, backends::http_endpoint ep,
                             std::chrono::milliseconds call_timeout, backends::router_info info,
                             std::vector<member> members)
    : server_(std::move(server)),
      ep_(std::move(ep)),
      call_timeout_(call_timeout),
      info_(std::move(info)),
      members_(std::move(members)) {
  std::lock_guard lock(mu_);
  note_status(info_.models);
}

const router_models::member* router_models::find(std::string_view model) const {
  for (const auto& m : members_)
    if (m.model == model ||
        std::find(m.aliases.begin(), m.aliases.end(), model) != m.aliases.end())
      return &m;
  return nullptr;
}

bool router_models::known_running(const member& m) const {
  if (!status_known_) return false;
  const auto it = running_.find(m.model);
  return it != running_.end() && it->second;
}

void router_models::note_status(const std::vector<backends::router_model>& models) {
  running_.clear();
  for (const auto& rm : models) running_[rm.id] = rm.running();
  status_known_ = true;
}

net::awaitable<bool> router_models::take_switch(const member* m) {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (m) served_[m->model] = ++clock_;
      if (!switching_) {
        if (m && known_running(*m)) co_return false;
        switching_ = true;
        co_return true;
      }
    }
    co_await pause(model_switch_poll);
  }
}

void router_models::end_switch() {
  std::lock_guard lock(mu_);
  switching_ = false;
}

net::awaitable<void> router_models::before_serving(const member& m, bool load,
                                                   const std::function<bool()>& wanted) {
  const bool switching = co_await take_switch(&m);
  if (!switching) co_return;
  co_await switch_to(m, load, wanted);
  end_switch();
}

net::awaitable<void> router_models::before_unmanaged(std::string_view model) {
  const bool switching = co_await take_switch(nullptr);
  if (!switching) co_return;
  co_await save_before_unmanaged(model);
  end_switch();
}

net::awaitable<void> router_models::before_unload(const member& m) {
  {
    std::lock_guard lock(mu_);
    status_known_ = false;  // the next request reads the status again
  }
  co_await save(m, "");
}

net::awaitable<void> router_models::save(const member& m, std::string_view to) {
  const auto saved = co_await m.coord->on_strand(m.coord->checkpoint());
  m.coord->note_upstream_trouble();  // its child may be gone before its next request
  log(saved ? log_level::info : log_level::warn, "kv.router.saved",
      {{"server", server_}, {"from", m.model}, {"to", std::string(to.empty() ? "(unload)" : to)},
       {"ok", saved ? "1" : "0"}});
}

net::awaitable<core::result<std::vector<backends::router_model>>> router_models::read_models() {
  auto models = co_await backends::read_router_models(ep_, call_timeout_);
  if (!models)
    log(log_level::warn, "kv.router.unavailable",
        {{"server", server_}, {"reason", models.err().message},
         {"effect", "forwarded without saving the other models' sessions"}});
  co_return models;
}

net::awaitable<void> router_models::switch_to(const member& m, bool load,
                                              const std::function<bool()>& wanted) {
  auto models = co_await read_models();
  if (!models) co_return;
  {
    std::lock_guard lock(mu_);
    note_status(models.value());
  }
  if (const auto* st = status_of(models.value(), m.model); st && st->running()) co_return;
  // The router starts no model by itself: the request gets the router's own answer. A client
  // that left makes nothing move either (the router would drop its queued request too).
  if ((load && !info_.autoload) || !wanted()) co_return;
  const auto running = std::count_if(models->begin(), models->end(),
                                     [](const backends::router_model& rm) { return rm.running(); });
  if (info_.max_instances > 0 && running >= info_.max_instances)
    co_await save_running_others(m.model, models.value());
  // A new child: its /props has a new media marker, so its sessions restore (§4).
  m.coord->note_upstream_trouble();
  if (!load || !wanted()) co_return;  // a client's own POST /models/load follows
  const bool loaded = co_await load_and_wait(m, wanted);
  log(loaded ? log_level::info : log_level::warn, "kv.router.loaded",
      {{"server", server_}, {"model", m.model}, {"ok", loaded ? "1" : "0"}});
}

// Saved least recently served first: each save is a POST, which the router counts as a use,
// so the order the router will unload in is kept, and whichever model it unloads is saved.
net::awaitable<void> router_models::save_running_others(
    std::string_view to, const std::vector<backends::router_model>& models) {
  std::vector<const member*> others;
  for (const auto& m : members_)
    if (m.model != to)
      if (const auto* st = status_of(models, m.model); st && st->running()) others.push_back(&m);
  {
    std::lock_guard lock(mu_);
    std::sort(others.begin(), others.end(), [&](const member* a, const member* b) {
      return served_[a->model] < served_[b->model];
    });
  }
  for (const member* m : others) co_await save(*m, to);
}

net::awaitable<void> router_models::save_before_unmanaged(std::string_view model) {
  auto models = co_await read_models();
  if (!models) co_return;
  const auto named = std::find_if(models->begin(), models->end(), [&](const auto& rm) {
    return rm.id == model || std::find(rm.aliases.begin(), rm.aliases.end(), model) != rm.aliases.end();
  });
  const auto running = std::count_if(models->begin(), models->end(),
                                     [](const backends::router_model& rm) { return rm.running(); });
  // A model the router does not know it answers itself; one it runs costs no unload.
  if (named == models->end() || named->running()) co_return;
  {
    // The request may change what runs: the next one reads the status again.
    std::lock_guard lock(mu_);
    status_known_ = false;
  }
  log(log_level::info, "kv.router.unmanaged_model",
      {{"server", server_}, {"model", named->id},
       {"effect", "runs without persistence until kvpersist restarts"}});
  if (info_.max_instances > 0 && running >= info_.max_instances)
    co_await save_running_others(named->id, models.value());
}

// The load is a request of the router's own kind, held open until the model runs: when the
// client leaves first, closing it makes the router abandon a load that is still queued (behind
// a busy model), as it would for the client itself.
net::awaitable<bool> router_models::load_and_wait(const member& m,
                                                  const std::function<bool()>& wanted) {
  auto r = co_await (backends::await_router_model(ep_, m.model, load_timeout) ||
                     until_unwanted(wanted));
  {
    // What runs now: `m`, if it loaded; which model made room is not known, so every other
    // counts as not running and its next request reads the status again.
    std::lock_guard lock(mu_);
    running_.clear();
    running_[m.model] = r.index() == 0 && std::get<0>(r).ok();
    status_known_ = true;
  }
  if (r.index() == 1) {
    log(log_level::info, "kv.router.load_abandoned",
        {{"server", server_}, {"model", m.model}, {"reason", "the client left"}});
    co_return false;
  }
  if (const auto& loaded = std::get<0>(r); !loaded) {
    log(log_level::warn, "kv.router.load_failed",
        {{"server", server_}, {"model", m.model}, {"reason", loaded.err().message}});
    co_return false;
  }
  co_return true;
}

}  // namespace kvp::proxy
