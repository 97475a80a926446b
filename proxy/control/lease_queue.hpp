// Who holds which slot of one llama-server, and who waits for one (docs/design.md §5): the
// lease queue the coordinator grants its leases from. FIFO, with these rules:
//   - one lease per slot; an exclusive ticket (an unpinnable request in managed mode, a
//     runtime change, kvpersist's own work) takes every slot, so it waits for all of them;
//   - a session's requests stay in order on one slot: a session's ticket waits while an
//     earlier one of the same session holds a lease or waits before it;
//   - nothing overtakes an exclusive waiter;
//   - at most `max_waiting` tickets wait (enqueue_unbounded, for kvpersist's own work, is
//     never refused);
//   - while requests pass through (admitted without a slot, persistence off) no lease is
//     granted: they may run on any slot;
//   - at most one runtime change (POST /lora-adapters) waits or holds at a time.
// It knows of the slot pool only what `slot_chooser` gives it, and wakes a granted ticket
// only through `wake`, so it runs without a coordinator or an io_context.
//
// Thread safety: none. One per coordinator, touched only on its strand.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/net.hpp"
#include "core/request_class.hpp"

namespace kvp::proxy {

// A place in the lease queue. Created by the client session with its own executor; the
// coordinator wakes it by moving its timer's expiry to the past, which also completes a wait
// that has not started yet. Whether the lease was granted is decided only on the strand.
struct lease_ticket {
  explicit lease_ticket(net::any_io_executor client_ex) : wakeup(client_ex) {}
  steady_timer wakeup;
  std::uint64_t id = 0;
  core::request_identity who;  // set before enqueue: decides which slot it may take
  bool unpinnable = false;     // set before enqueue: llama-server ignores id_slot for it
  bool exclusive = false;      // needs every slot (flush, admin; unpinnable in managed mode)
  bool pinned = false;         // strand-only until granted: the body must carry id_slot
  bool granted = false;        // strand-only
  bool runtime_change = false;  // set before enqueue: POST /lora-adapters (at most one pending)
  bool pass_through = false;   // strand-only: admitted without a slot (docs/design.md §5)
  int slot = -1;               // strand-only: the slot granted (-1 for exclusive leases)
  int restored_slot = -1;  // strand-only: exclusive, the slot its session was restored into
};

// What the queue asks of the slot pool (core::slot_pool and the coordinator's mode).
struct slot_chooser {
  std::function<std::vector<int>()> slot_ids;
  // A slot among the free ones for `who`; nullopt: it waits (core::slot_pool::choose_slot).
  std::function<std::optional<int>(const core::request_identity& who,
                                   const std::vector<int>& free_slots)>
      choose_slot;
  // The session's key, which orders its requests (core::slot_pool::hash_for).
  std::function<std::string(const core::request_identity& who)> session_key;
  // Managed mode with more than one slot: requests are pinned, unpinnable ones exclusive.
  std::function<bool()> pins_requests;
  // mode: auto with more than one slot: llama-server places every request, each one exclusive
  // (docs/design.md §23).
  std::function<bool()> places_requests;
};

class lease_queue {
 public:
  using ticket = std::shared_ptr<lease_ticket>;
  // `wake`: a ticket granted after it had to wait (its client waits on ticket.wakeup).
  lease_queue(std::size_t max_waiting, slot_chooser pool, std::function<void(const ticket&)> wake);

  // Numbers `t`, adds it at the back and grants what can be granted; `t` itself is granted
  // at once or waits (never woken by its own enqueue). false: the queue is over its bound,
  // and `t` has left it (rejected; a runtime change no longer pending).
  bool enqueue(const ticket& t);
  // The same without the bound: kvpersist's own work (flush, shutdown, admin, gc).
  void enqueue_unbounded(const ticket& t);
  // After a wait: whether `t` holds its lease. If not (its timeout fired or its client left),
  // it leaves the queue, and whoever it blocked may be granted.
  bool settle(const ticket& t);

  // A runtime change asks to be admitted: false while another one waits or holds a lease.
  // Pending from here until it is rejected, leaves the queue or is released.
  bool admit_runtime_change(const ticket& t);

  // Nothing is leased or waiting: a request could not overtake anyone.
  bool idle() const { return leased_.empty() && queue_.empty(); }
  // `t` runs without a slot; no lease is granted until every such ticket has ended.
  void begin_pass_through(const ticket& t);
  // A pass-through ticket's request is over (once; a ticket that never passed through is
  // ignored). true: it was the last one, and waiting tickets have been granted.
  bool end_pass_through(const ticket& t);
  std::size_t passing_through() const { return passing_through_; }

  // `t` gives back every slot it holds (a no-op if it holds none). The waiting tickets are
  // granted only by grant_waiting, so that the caller can change the pool in between. The
  // grant is logged here (kv.slot.acquire); the release by the caller, which knows why.
  void release(const ticket& t);
  // Grants what can be granted, in FIFO order, under the rules above.
  void grant_waiting();
  // The idle checkpoint holds a free `slot` for its save without queueing. REQUIRES: the slot
  // is not leased and nothing passes through.
  void hold_slot(int slot, const ticket& t);

  bool holds(const ticket& t) const;
  bool is_leased(int slot) const { return leased_.contains(slot); }
  bool nothing_leased() const { return leased_.empty(); }
  std::size_t waiting() const { return queue_.size(); }
  const std::map<int, ticket>& leased() const { return leased_; }

 private:
  bool try_grant(const ticket& t);
  std::vector<int> free_slots() const;
  bool same_session_holds(const ticket& t) const;
  // `quiet`: the ticket being enqueued, whose caller sees the grant without a wakeup.
  void grant_waiting(const lease_ticket* quiet);

  std::size_t max_waiting_;
  slot_chooser pool_;
  std::function<void(const ticket&)> wake_;
  std::map<int, ticket> leased_;  // slot -> holder
  std::deque<ticket> queue_;
  std::uint64_t next_id_ = 1;
  // Requests admitted as pass-through and not finished: they may run on any slot, so no
  // lease is granted (no slot managed) while there is one (docs/design.md §5).
  std::size_t passing_through_ = 0;
  bool runtime_change_pending_ = false;  // a POST /lora-adapters ticket waits or holds the lease
};

}  // namespace kvp::proxy
