// A request's hold on a llama-server's slot: the lease protocol of docs/design.md §5 as a
// type. A client session acquires one, prepares it, forwards, finishes it; each step hops onto
// the coordinator's strand itself, so the session never names the strand. Whoever holds a
// lease last without finishing it (an early return, an exception) releases it: the slot is
// never left leased to a request that is gone.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "backends/net.hpp"
#include "proxy/control/coordinator.hpp"

namespace kvp::proxy {

struct acquisition;

class lease {
 public:
  lease() = default;
  lease(coordinator& c, std::shared_ptr<lease_ticket> t) : c_(&c), t_(std::move(t)) {}
  lease(lease&& o) noexcept
      : c_(std::exchange(o.c_, nullptr)), t_(std::move(o.t_)), prepared_(std::move(o.prepared_)) {}
  lease& operator=(lease&& o) noexcept;
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  ~lease();

  explicit operator bool() const { return c_ != nullptr; }
  // Every slot of the server (an unpinnable request in managed mode, a runtime change).
  bool exclusive() const { return t_->exclusive; }
  // Managed mode: the request body must carry id_slot = slot().
  bool pinned() const { return t_->pinned; }
  int slot() const { return t_->slot; }

  // The plan's save/restore/erase (exclusive: every dirty owner saved). On a strict-mode
  // failure (!ok) the coordinator has released the lease and this one is empty.
  // `fresh_upstream`: the upstream connection is new, so the server may have restarted.
  // A lease acquire granted and prepared in the same trip to the strand (a pooled connection,
  // nobody ahead) answers with that outcome at once.
  net::awaitable<prepare_result> prepare(core::request_identity who, bool fresh_upstream);
  // The request is over: marks the slot dirty, checkpoints as configured, releases.
  // `reached_slot`: llama-server received it; `turn_end`: its reply ended the user's turn;
  // `reply`: what the response said about reuse, recorded on the same trip to the strand.
  net::awaitable<void> finish(bool reached_slot, bool turn_end = false,
                              std::optional<reply_report> reply = {});
  // The same, not awaited: the strand runs it before anything this session asks later, so
  // the next request sees the lease released while a turn-end checkpoint still runs.
  // `reply`: what the response said about reuse, recorded on the same trip to the strand.
  void finish_later(bool reached_slot, bool turn_end, std::optional<reply_report> reply = {});
  // Gives the lease back without running anything (the request never reached the slot).
  // Nothing to do for a lease whose prepare failed.
  net::awaitable<void> release();

 private:
  friend net::awaitable<acquisition> acquire(coordinator& c, core::request_identity who,
                                             bool unpinnable, bool pooled,
                                             std::chrono::milliseconds queue_timeout,
                                             std::function<net::awaitable<bool>()> gone,
                                             std::function<void()> on_wait);
  friend net::awaitable<acquisition> begin_runtime_change(
      coordinator& c, std::chrono::milliseconds queue_timeout,
      std::function<net::awaitable<bool>()> gone);
  friend net::awaitable<void> end_runtime_change(lease l, bool reached_server);
  // The ticket `t` through admission and, when it has to queue, its wait: woken by a grant,
  // its timeout or its client hanging up, whichever comes first.
  static net::awaitable<acquisition> await_admission(coordinator& c,
                                                     std::shared_ptr<lease_ticket> t,
                                                     core::request_identity who, bool pooled,
                                                     std::function<net::awaitable<bool>()> gone,
                                                     std::function<void()> on_wait);
  // A lease prepared in admit's trip: what prepare() answers without another (a failed one
  // holds nothing: c_ is null).
  static lease prepared_in_admission(coordinator& c, std::shared_ptr<lease_ticket> t,
                                     prepare_result pr);
  coordinator* c_ = nullptr;
  std::shared_ptr<lease_ticket> t_;
  std::optional<prepare_result> prepared_;
};

// How acquire ended.
struct acquisition {
  enum class outcome {
    granted,    // `held` is the lease; prepare it
    rejected,   // the queue is full: answer 503
    runtime_change_pending,  // another POST /lora-adapters waits or runs: answer 429
    timed_out,  // queue.timeoutMs passed while waiting: answer 503
    client_gone,
    pass_through,  // `held` is a pass-through ticket, no slot: forward, then finish it
  };
  outcome what = outcome::rejected;
  lease held;
};

// Waits for a lease of `c` for `who` (docs/design.md §5). `pooled`: the request has a pooled
// upstream connection, so a lease granted at once is prepared in the same trip (a resident
// request then needs one trip to the strand; the lease's prepare() answers without another). Only a request that has to queue calls
// `on_wait` (it gives the pooled connection back) and `gone` (a watch that completes when the
// client hangs up), so the common case builds neither.
net::awaitable<acquisition> acquire(coordinator& c, core::request_identity who, bool unpinnable,
                                    bool pooled, std::chrono::milliseconds queue_timeout,
                                    std::function<net::awaitable<bool>()> gone,
                                    std::function<void()> on_wait);

// POST /lora-adapters (docs/design.md §4, §5): waits for the whole server like acquire (in
// the same bounded queue, dropped when its client hangs up; at most one runtime change
// pending, another is `runtime_change_pending`), then saves every dirty session. Once
// forwarded, end_runtime_change drops residency and has the fingerprint re-read if the
// adapters changed.
net::awaitable<acquisition> begin_runtime_change(coordinator& c,
                                                 std::chrono::milliseconds queue_timeout,
                                                 std::function<net::awaitable<bool>()> gone);
net::awaitable<void> end_runtime_change(lease l, bool reached_server);

}  // namespace kvp::proxy
