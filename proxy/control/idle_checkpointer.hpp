// Idle checkpoints (docs/design.md §10): a dirty slot whose owner has been idle until the pool's
// idle deadline (checkpoint.idleMs, earlier for a server that sleeps) is saved then, while its
// KV still exists. Each save holds that slot's lease, so no request slips in between; only
// llama-server's write holds it, the commit runs after the release. A slot in use (leased, or
// any request passing through without a lease) is skipped: that request's end re-arms.
//
// Strand-only: one per coordinator, every call and its timer on the coordinator's strand.
// It takes and releases slot leases on the coordinator's lease_queue, like any lease holder.
#pragma once

#include <functional>

#include "backends/net.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's parts the idle checkpoint works on; each must outlive it.
struct idle_checkpointer_parts {
  core::slot_pool& pool;  // the idle deadlines and the saves they ask for
  lease_queue& leases;    // each save holds its slot's lease
  slot_actions& actions;  // the saves
};

class idle_checkpointer {
 public:
  // `after_save`: called after each save's first half, the slot's lease still held (the
  // coordinator logs the breaker's changes).
  idle_checkpointer(net::any_io_executor strand, idle_checkpointer_parts parts,
                    std::function<void()> after_save);

  // Arms the timer for the pool's next idle deadline (none: nothing to do). Called after every
  // request and release: a request only moves a deadline later, so an armed timer moves only
  // when the deadline came earlier.
  void arm();
  // Stops the checkpoints (the timer cancelled; arm does nothing afterwards).
  void stop();

 private:
  // Waits for each deadline and saves the idle dirty slots, until no deadline is left.
  net::awaitable<void> loop();

  net::any_io_executor strand_;
  core::slot_pool& pool_;
  lease_queue& leases_;
  slot_actions& actions_;
  std::function<void()> after_save_;
  net::steady_timer timer_;
  bool running_ = false;  // loop() waits on timer_
  bool stopped_ = false;
};

}  // namespace kvp::proxy
