// One coordinator per llama-server, the orchestrator of its control plane: it owns the strand
// every part runs on, the lease protocol (admit -> settle -> prepare -> finish, reached only
// through proxy/control/lease.hpp) and the order of the steps of each request, checkpoint and
// admin operation. The steps themselves are its parts': lease_queue (who holds which slot, who
// waits), runtime_monitor (probes, restarts, sleep), slot_actions (a core::slot_pool plan's
// save, restore and erase), idle_checkpointer, prefix_maker, overwrite_tracker, retention_keeper,
// session_admin, hint_log and new_session_gate. All its state lives on its strand; client
// sessions reach it only through co_spawn onto that strand (no global mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/slot_pool.hpp"
#include "core/metrics.hpp"
#include "core/response_timings.hpp"
#include "core/retention.hpp"
#include "core/reuse_stats.hpp"
#include "proxy/control/commit_pipeline.hpp"
#include "proxy/control/file_io.hpp"
#include "proxy/control/hint_log.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/new_session_gate.hpp"
#include "proxy/control/idle_checkpointer.hpp"
#include "proxy/control/overwrite_tracker.hpp"
#include "proxy/control/plan_runner.hpp"
#include "proxy/control/prefix_maker.hpp"
#include "proxy/control/retention_keeper.hpp"
#include "proxy/control/runtime_monitor.hpp"
#include "proxy/control/server_tenancy.hpp"
#include "proxy/control/session_admin.hpp"
#include "proxy/control/sleep_tracker.hpp"
#include "proxy/control/slot_actions.hpp"
#include "proxy/control/snapshot_files.hpp"

namespace kvp::proxy {

// How requests meet the slots (config `mode`; docs/design.md §14, §23).
enum class slot_policy {
  single_slot,  // one configured slot (mode: single-slot)
  pinned,       // every slot; each request pinned to its session's (mode: managed-slots)
  placed,       // every slot; with several, llama-server places every request (mode: auto)
};

struct coordinator_options {
  core::slot_pool_options pool;  // pool.strict is failure.strict for both halves
  std::size_t max_waiting = 64;
  std::chrono::milliseconds epoch_probe_interval{10'000};
  std::chrono::seconds sleep_idle{0};  // llama-server's --sleep-idle-seconds; 0: never sleeps
  slot_policy slots = slot_policy::single_slot;
  std::string server_name = "default";
  std::string endpoint;  // for status output
  // shared-filesystem mode: llama-server's --slot-save-path as kvpersist sees it ("" if not)
  std::string snapshot_dir;
  std::uint64_t retention_max_bytes = 0;
  std::size_t retention_max_sessions = 0;
  int retention_max_age_days = 0;
  std::size_t retention_max_sessions_per_credential = 0;  // 0: no separate cap
  std::uint64_t retention_max_bytes_per_credential = 0;   // 0: no separate cap
  std::chrono::milliseconds retention_interval{0};
  std::chrono::milliseconds file_timeout{30'000};  // failure.fileTimeoutMs: each file operation
  std::size_t new_sessions_per_minute = 0;  // limits.newSessionsPerMinute, per credential; 0: off
};

// What a coordinator's lease queue asks of its pool: the pool itself, and how requests meet
// its slots.
slot_chooser chooser_of(const core::slot_pool& pool, slot_policy slots);

using core::restore_source;  // core/reuse_stats.hpp
using core::response_timings;

// What a finished request's response said about its prompt, and how the request was prepared.
struct reply_report {
  core::prepare_kind kind = core::prepare_kind::none;
  response_timings timings;
  // After a restore: the request as forwarded and its target, which a seed that read much
  // more than it reused makes a prefix snapshot from (proxy/control/prefix_maker.hpp).
  std::shared_ptr<const std::string> body;
  std::string target;
};

// What a restore whose next response reused none of its `restored` tokens tells the operator
// (core::reuse_stats::first_reused_nothing): the warning's and GET /kv/status's words.
std::string reused_nothing_advice(std::uint64_t restored);

// A page of GET /kv/sessions as JSON.
std::string sessions_page_json(const session_page& page);

// One session as GET /kv/sessions/{id} shows it.
std::string session_json(const session_row& row);

// How a request was prepared, for the client session and its logs; or why it cannot run:
// strict mode, or a scope erase that failed (answer 503), a new session over its credential's
// rate (errc::session_rate with retry_after_s: 429). Either way the lease is released.
using prepare_result = core::result<core::prepare_kind>;

// What admit did with a ticket.
struct admission {
  enum class outcome {
    rejected,  // the queue is full: answer 503
    runtime_change_pending,  // another runtime change waits or runs: answer 429
    queued,    // wait on ticket.wakeup, then settle
    granted,   // the lease is held; prepare (or prepare_exclusive) is still to run
    prepared,  // the lease is held and prepare ran: see `prepared`
    pass_through,  // no slot management: forward, then finish (docs/design.md §5)
  };
  outcome what = outcome::queued;
  prepare_result prepared;
};

class lease;  // proxy/control/lease.hpp: a request's only way onto the strand
struct acquisition;

class coordinator {
 public:
  coordinator(net::io_context& ioc, std::unique_ptr<backends::kv_backend> backend,
              manifest_store store, coordinator_options opts);

  // Runs one of this coordinator's coroutines on its strand: how code outside the
  // coordinator (server, admin) calls it. Client sessions use proxy/control/lease.hpp.
  template <class T>
  net::awaitable<T> on_strand(net::awaitable<T> work) {
    return net::co_spawn(strand_, std::move(work), net::use_awaitable);
  }
  // The same, not awaited: runs after everything already submitted to the strand; an
  // exception is logged.
  void spawn(net::awaitable<void> work);

  // Loads manifests, probes the server and starts the background probe. Never fails:
  // problems are logged once and persistence stays off until a probe succeeds.
  net::awaitable<void> start();

  // Whether finish needs to know if a reply ended the user's turn (checkpoint.onTurnEnd).
  bool watches_turn_end() const {
    return (opts_.pool.save_on_turn_end || opts_.pool.early_checkpoint.count() > 0) &&
           !opts_.pool.save_on_step_end;
  }

  // Waits for the lease (no queue bound), saves every dirty owner, releases. Used on shutdown,
  // by flush and before a model switch. The first failed save's error (every other dirty
  // owner is still saved).
  net::awaitable<core::result<core::unit>> checkpoint();

  // Stops timers (idle checkpoint, background probe). Call on shutdown.
  void stop();

  // Admin API (docs/design.md §18, §10), each on the strand. The session operations, reads and
  // gc are admin()'s (proxy/control/session_admin.hpp); flush is checkpoint().
  std::string status_json() const;
  session_admin& admin() { return admin_; }
  void write_metrics(core::prom_writer& w) const;

  // What requests to this server showed that keeps new conversations cold
  // (proxy/control/hint_log.hpp); its note is thread-safe.
  hint_log& hints() { return hints_; }

  // Tell the coordinator that an upstream connection failed to connect or died: the next
  // prepare re-reads the runtime. Thread-safe.
  void note_upstream_trouble() { runtime_.note_upstream_trouble(); }

  const std::string& name() const { return opts_.server_name; }

 private:
  friend class lease;
  friend net::awaitable<acquisition> begin_runtime_change(
      coordinator& c, std::chrono::milliseconds queue_timeout,
      std::function<net::awaitable<bool>()> gone);
  friend net::awaitable<void> end_runtime_change(lease l, bool reached_server);

  // The lease protocol, each step run on the strand (on_strand), reached only through
  // proxy/control/lease.hpp (the friends above):
  //   admit -> (client waits on ticket.wakeup) -> settle -> prepare -> [relay] -> finish.
  // The queue's rules are proxy/control/lease_queue.hpp's. settle returns whether the ticket
  // holds the lease; if not, the ticket has left the queue.
  // admit: the common case in one trip to the strand: enqueue, and if the lease is granted at once
  // (nobody ahead), also prepare when `upstream_ready` (the request has a pooled, not fresh,
  // upstream connection) and the ticket is not exclusive. A resident request then needs one
  // round trip before it is forwarded instead of three. While persistence is off and no
  // lease is held or waited for, the ticket passes through instead: it holds no slot, and no
  // lease is granted until every such ticket has finished (docs/design.md §5).
  net::awaitable<admission> admit(std::shared_ptr<lease_ticket> t, core::request_identity who,
                                  bool upstream_ready);
  net::awaitable<bool> settle(std::shared_ptr<lease_ticket> t);
  // REQUIRES: t holds the lease. Runs the plan's save/restore/erase. On a strict-mode
  // failure the lease is released before returning.
  // `fresh_upstream`: the request's upstream connection is new, so the server may have
  // restarted; the runtime is re-read before deciding.
  net::awaitable<prepare_result> prepare(std::shared_ptr<lease_ticket> t,
                                         core::request_identity who, bool fresh_upstream);
  // REQUIRES: t holds the lease. Marks the slot dirty, runs a step- or turn-end checkpoint if
  // configured (`turn_end`: the reply handed the conversation back to the user), releases
  // the lease and wakes the next waiter. A pass-through ticket just ends (end_pass_through).
  // `reply`: what the response said about reuse (coordinator.cpp's record_response), recorded
  // first, a pass-through's too.
  net::awaitable<void> finish(std::shared_ptr<lease_ticket> t, bool reached_slot,
                              bool turn_end = false, std::optional<reply_report> reply = {});
  // Exclusive use of the server for a request llama-server cannot pin (managed mode):
  // REQUIRES an exclusive lease. Saves every dirty owner first and notes each slot's last
  // task, so that finish_exclusive can tell which slot the server used and forget only its
  // owner (all owners if the server cannot be asked).
  // `fresh_upstream` as for prepare.
  net::awaitable<prepare_result> prepare_exclusive(std::shared_ptr<lease_ticket> t,
                                                   bool fresh_upstream = false);
  // A session's request is restored first when no slot holds it (restore_placed). Then:
  // `reply`: what the response said about reuse, recorded on the slot llama-server chose,
  // which is the session's from now on (`turn_end` as for finish).
  net::awaitable<void> finish_exclusive(std::shared_ptr<lease_ticket> t, bool reached_slot,
                                        bool turn_end = false,
                                        std::optional<reply_report> reply = {});
  // Releases a lease without running `finish` (the request never reached the slot), or ends
  // a pass-through ticket.
  net::awaitable<void> release(std::shared_ptr<lease_ticket> t);
  // A request that changes the runtime (POST /lora-adapters) runs between these two, under
  // an exclusive lease acquired like any request's (proxy/control/lease.hpp: bounded, client watched,
  // at most one pending). REQUIRES: t holds it. The first saves dirty sessions and reads the
  // adapters; the second reads them again and, when they changed (or cannot be compared),
  // drops residency and has the next prepare read the whole fingerprint again.
  net::awaitable<void> begin_runtime_change(std::shared_ptr<lease_ticket> t);
  net::awaitable<void> end_runtime_change(std::shared_ptr<lease_ticket> t, bool reached_server);

  // A pass-through ticket's request is over; the last one lets the queue's leases go.
  void end_pass_through(const std::shared_ptr<lease_ticket>& t);
  // Releases `t`'s lease; with nothing leased any more, a probe kept for that moment is applied.
  // Then the next waiter is granted, and the idle checkpoint armed for the next deadline.
  void release_and_wake(const std::shared_ptr<lease_ticket>& t);
  // The whole server held by the coordinator itself (flush, shutdown, admin, gc), acquired on
  // the strand after every commit in flight has landed. Released, on the strand, when it
  // goes out of scope: no path out of an operation leaves the server leased.
  class exclusive_hold {
   public:
    exclusive_hold(coordinator& c, std::shared_ptr<lease_ticket> t) : c_(&c), t_(std::move(t)) {}
    exclusive_hold(exclusive_hold&& o) noexcept
        : c_(std::exchange(o.c_, nullptr)), t_(std::move(o.t_)) {}
    exclusive_hold& operator=(exclusive_hold&&) = delete;
    exclusive_hold(const exclusive_hold&) = delete;
    exclusive_hold& operator=(const exclusive_hold&) = delete;
    ~exclusive_hold() {
      if (c_) c_->release_and_wake(t_);
    }

   private:
    coordinator* c_;
    std::shared_ptr<lease_ticket> t_;
  };
  net::awaitable<exclusive_hold> acquire_internal();
  net::awaitable<core::result<core::prepare_kind>> restore_placed(lease_ticket& t);
  std::string_view mode_name() const;
  net::awaitable<void> load_state();

  net::strand<net::io_context::executor_type> strand_;
  std::unique_ptr<backends::kv_backend> backend_;
  manifest_store store_;
  coordinator_options opts_;
  core::slot_pool pool_;
  // limits.newSessionsPerMinute: new sessions refused per credential.
  new_session_gate new_sessions_{opts_.new_sessions_per_minute, pool_};
  snapshot_files snapshots_{opts_.snapshot_dir};
  file_io files_{2, 64, opts_.file_timeout};
  // A save's commit in flight, by session hash: planning for that session, or its slot,
  // waits for it.
  commit_pipeline commits_{strand_};

  lease_queue leases_;  // who holds which slot, who waits (proxy/control/lease_queue.hpp)

  // Metrics not kept by the core.
  core::reuse_stats reuse_;  // what restores and cold starts earned
  // The plans' save, restore and erase calls and the manifest and file-pool work; declared
  // last, after everything it refers to.
  slot_actions actions_;
  hint_log hints_;  // requests' hints: counts, first sightings (hints.json)
  // llama-server's sleep: its period, when each slot was last used.
  sleep_tracker sleep_;
  // Probes, restarts, the slot layout, the behavioural fingerprint, runtime changes.
  runtime_monitor runtime_;
  // The server as one tenant while persistence is off: pass-through and its erases.
  server_tenancy tenancy_{server_tenancy_parts{pool_, leases_, runtime_, *backend_, actions_},
                          opts_.pool.strict};
  // Saves dirty slots whose owner went idle (checkpoint.idleMs).
  idle_checkpointer idle_;
  // Which slots an unpinnable request overwrote (managed mode).
  overwrite_tracker overwrites_;
  // Retention: gc, the session budget, the disk budget and server-owned overwrites.
  retention_keeper retention_;
  // Snapshots of shared preambles alone, made when nothing waits (docs/design.md §3).
  prefix_maker prefix_{strand_, prefix_maker_parts{pool_, leases_, actions_, *backend_}};
  // Every plan a request or the admin API runs on a slot.
  plan_runner plans_{plan_runner_parts{pool_, actions_, reuse_, retention_, prefix_}};
  // The admin API's session operations and reads.
  session_admin admin_;
};

}  // namespace kvp::proxy
