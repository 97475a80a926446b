// Idle checkpoints (docs/design.md §10): the dirty slots saved when their owner went idle.
#include "proxy/control/idle_checkpointer.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

idle_checkpointer::idle_checkpointer(net::any_io_executor strand, idle_checkpointer_parts parts,
                                     std::function<void()> after_save)
    : strand_(std::move(strand)),
      pool_(parts.pool),
      leases_(parts.leases),
      actions_(parts.actions),
      after_save_(std::move(after_save)),
      timer_(strand_) {}

void idle_checkpointer::arm() {
  auto deadline = pool_.table().idle_deadline();
  if (!deadline || stopped_) return;
  if (running_) {
    // The loop re-reads the deadline when its timer fires, so the timer is moved (which
    // cancels and restarts the wait) only when the deadline came earlier.
    if (*deadline < timer_.expiry()) timer_.expires_at(*deadline);
    return;
  }
  timer_.expires_at(*deadline);
  running_ = true;
  net::co_spawn(strand_, loop(), log_exception);
}

void idle_checkpointer::stop() {
  stopped_ = true;
  timer_.cancel();
}

net::awaitable<void> idle_checkpointer::loop() {
  for (;;) {
    auto [ec] = co_await timer_.async_wait(token);
    if (stopped_) break;
    if (ec == net::error::operation_aborted) {
      // Re-armed (expires_at cancels the pending wait): wait for the new deadline.
      if (pool_.table().idle_deadline()) continue;
      break;
    }
    const auto now = steady_clock::now();
    for (int id : pool_.table().ids()) {
      // A request is running there (or may be: a pass-through); its end re-arms.
      if (leases_.is_leased(id) || leases_.passing_through() > 0) continue;
      auto s = pool_.plans().idle_checkpoint(id, now);
      if (!s) continue;
      // Hold the slot's lease for the save so no request can slip in between (docs/design.md §10).
      auto self = std::make_shared<lease_ticket>(strand_);
      leases_.hold_slot(id, self);
      log(log_level::debug, "kv.checkpoint.idle",
          {{"session", std::string(core::abbrev(s->hash))}, {"slot", std::to_string(id)}});
      // Only llama-server's write holds the slot; the commit runs after the release.
      const auto saved = co_await actions_.start_save(*s);
      (void)saved;
      after_save_();
      leases_.release(self);
      leases_.grant_waiting();
    }
    auto next = pool_.table().idle_deadline();
    if (!next) break;
    if (*next <= steady_clock::now()) {
      // Due but its slot is leased: that request's finish re-arms the timer.
      break;
    }
    timer_.expires_at(*next);
  }
  running_ = false;
}

}  // namespace kvp::proxy
