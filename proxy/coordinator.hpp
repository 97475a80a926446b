// One coordinator per llama-server: the slot lease (a FIFO queue with a bound and a
// timeout), the management calls a core::coordinator_core plan asks for, idle checkpoints,
// restart detection and the shutdown checkpoint. All its state lives on its own strand;
// client sessions reach it only through co_spawn onto that strand (no global mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/coordinator_core.hpp"
#include "proxy/manifest_store.hpp"

namespace kvp::proxy {

struct coordinator_options {
  core::core_options core;
  bool strict = false;
  std::size_t max_waiting = 64;
  std::chrono::milliseconds queue_timeout{600'000};
  std::chrono::milliseconds epoch_probe_interval{10'000};
  bool single_slot = true;
};

// A place in the lease queue. Created by the client session with its own executor; the
// coordinator wakes it by moving its timer's expiry to the past, which also completes a wait
// that has not started yet. Whether the lease was granted is decided only on the strand.
struct lease_ticket {
  explicit lease_ticket(net::any_io_executor client_ex) : wakeup(client_ex) {}
  steady_timer wakeup;
  std::uint64_t id = 0;
  bool granted = false;   // strand-only
  bool rejected = false;  // strand-only: the queue was full
};

// How a request was prepared, for the client session and its logs.
struct prepare_result {
  bool ok = true;               // false: strict-mode failure, answer 503 (lease released)
  core::prepare_kind kind = core::prepare_kind::none;
  std::string message;          // why, when !ok
};

class coordinator {
 public:
  coordinator(net::io_context& ioc, std::unique_ptr<backends::kv_backend> backend,
              manifest_store store, coordinator_options opts);

  net::strand<net::io_context::executor_type>& strand() { return strand_; }

  // Loads manifests, probes the server and starts the background probe. Never fails:
  // problems are logged once and persistence stays off until a probe succeeds.
  net::awaitable<void> start();

  // Lease protocol, each step co_spawned on strand():
  //   enqueue -> (client waits on ticket.wakeup) -> settle -> prepare -> [relay] -> finish.
  // enqueue returns false when the queue is full (answer 503). settle returns whether the
  // ticket holds the lease; if not, the ticket has left the queue.
  net::awaitable<bool> enqueue(std::shared_ptr<lease_ticket> t);
  net::awaitable<bool> settle(std::shared_ptr<lease_ticket> t);
  // REQUIRES: t holds the lease. Runs the plan's save/restore/erase. On a strict-mode
  // failure the lease is released before returning.
  // `fresh_upstream`: the request's upstream connection is new, so the server may have
  // restarted; the runtime is re-read before deciding.
  net::awaitable<prepare_result> prepare(std::shared_ptr<lease_ticket> t,
                                         core::request_identity who, bool fresh_upstream);
  // REQUIRES: t holds the lease. Marks the slot dirty, runs a turn-end checkpoint if
  // configured, releases the lease and wakes the next waiter.
  net::awaitable<void> finish(std::shared_ptr<lease_ticket> t, bool reached_slot);
  // Releases a lease without running `finish` (the request never reached the slot).
  net::awaitable<void> release(std::shared_ptr<lease_ticket> t);

  // Waits for the lease (no queue bound), saves the dirty owner, releases. Used on shutdown
  // and by flush. Returns false if a save was needed and failed.
  net::awaitable<bool> checkpoint();

  // Stops timers (idle checkpoint, background probe). Call on shutdown.
  void stop();

  // Tell the coordinator that an upstream connection failed to connect or died: the next
  // prepare re-reads the runtime. Thread-safe.
  void note_upstream_trouble() { upstream_trouble_.store(true); }

  // Snapshot of state for status/logs. Strand-only.
  const core::coordinator_core& core() const { return core_; }
  std::size_t waiting() const { return queue_.size(); }
  bool busy() const { return holder_ != nullptr; }

 private:
  void grant(const std::shared_ptr<lease_ticket>& t);
  void release_and_wake();
  void arm_idle_timer();
  net::awaitable<void> idle_loop();
  net::awaitable<void> probe_loop();
  net::awaitable<void> refresh_runtime();
  void apply_probe(const core::result<core::server_probe>& p);
  net::awaitable<bool> run_save(const core::save_step& s);
  void write_manifest(const core::manifest& m);

  net::io_context& ioc_;
  net::strand<net::io_context::executor_type> strand_;
  std::unique_ptr<backends::kv_backend> backend_;
  manifest_store store_;
  coordinator_options opts_;
  core::coordinator_core core_;

  std::shared_ptr<lease_ticket> holder_;
  std::deque<std::shared_ptr<lease_ticket>> queue_;
  std::uint64_t next_id_ = 1;

  net::steady_timer idle_timer_;
  net::steady_timer probe_timer_;
  bool stopped_ = false;
  bool idle_loop_running_ = false;
  std::atomic<bool> upstream_trouble_{false};
  std::optional<core::result<core::server_probe>> pending_probe_;
  bool warned_disabled_ = false;
};

}  // namespace kvp::proxy
