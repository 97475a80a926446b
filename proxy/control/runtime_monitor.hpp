// The watch over one llama-server's runtime (docs/design.md §4): the probes (at start, in the
// background every probe interval, and before a request when there is a reason to believe the
// server changed), restart detection, sleep seen on /props (handed to sleep_tracker), the slot
// layout in managed mode, the behavioural fingerprint, and the runtime changes POST
// /lora-adapters makes. What a probe means is
// core::runtime_watch's (core/runtime_watch.hpp); this type does the I/O, applies the decisions
// to the pool (its runtime, its epoch, persistence on or off, its slots) and logs them. Restores
// are planned only against a fingerprint established here for the current epoch.
//
// Strand-only: one per coordinator, every call on the coordinator's strand (`strand`), except
// note_upstream_trouble (thread-safe). It reads the lease queue, never changes it: a change
// that needs the slots free (a new layout, a background probe's result) is kept until
// apply_pending_probe runs with nothing leased, or the next lease holder's look_for_changes.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/runtime_watch.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/behaviour_prober.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/sleep_tracker.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's configuration as the monitor reads it.
struct runtime_monitor_options {
  std::string server_name = "default";
  bool single_slot = true;                         // false: managed mode, every slot the server has
  bool pins = false;  // managed-slots: requests pinned, so a slot llama-server clears loses them
  std::chrono::milliseconds probe_interval{10'000};  // the background probe; 0: none
};

// The coordinator's parts the monitor works on; each must outlive it.
struct runtime_monitor_parts {
  backends::kv_backend& backend;
  const manifest_store& store;  // compatibility.json, the behaviour classes
  core::slot_pool& pool;        // the monitor sets its runtime, epoch, persistence and slots
  const lease_queue& leases;    // read only: which slots are leased
  slot_actions& actions;        // its file pool
  sleep_tracker& sleep;         // told what /props says of sleep and when slots were read
};

class runtime_monitor {
 public:
  runtime_monitor(net::any_io_executor strand, runtime_monitor_parts parts,
                  runtime_monitor_options opts);

  // The first probe applied, then the background probe started. Never fails: a problem is
  // logged once and persistence stays off until a probe succeeds.
  net::awaitable<void> start();
  // Stops the background probe (its timer cancelled).
  void stop();

  // An upstream connection failed to connect or died: the next look_for_changes re-reads the
  // runtime. Thread-safe.
  void note_upstream_trouble() { upstream_trouble_.store(true); }
  // A slot action failed with `e`; slot_not_found has the next look_for_changes run the whole
  // probe (only it applies the slot layout).
  void note_slot_error(const core::error& e);
  // A save of `slot` wrote no token while it was believed to hold `session`: llama-server
  // emptied it (idle-slot caching, or a restart the marker did not show). As a slot seen
  // empty: logged, and with no owned slot left the behaviour class is probed again.
  void note_empty_save(int slot, const std::string& session);

  // Before a plan on `slot` (REQUIRES its lease, or the whole server's): look_for_changes, then,
  // before the first plan of a new epoch, the behavioural fingerprint, probed on `slot`.
  net::awaitable<void> refresh_runtime(int slot);
  // Reads the runtime again when there is a reason to (upstream trouble, a slot error, a
  // runtime change, a probe back-off that ended) and applies what changed; first applies a
  // kept probe. While persistence is on, GET /props alone tells a restart; the full probe runs
  // only when something did change. `slot`: the caller's leased slot, whose emptied KV is a
  // restart sign like any other owned slot's (-1: none held).
  net::awaitable<void> look_for_changes(int slot);

  // A probe waits for the leases to go (a layout change, or a background probe's result).
  bool probe_pending() const { return pending_probe_.has_value(); }
  // Applies that probe, if any. REQUIRES: nothing leased.
  void apply_pending_probe();
  // Why persistence was turned off, when the server said why ("" otherwise).
  const std::string& disabled_reason() const { return disabled_why_; }
  // The server's slot count when the last probe it answered showed slot actions, which
  // tenant isolation needs (docs/design.md §20); 0: it showed none, or none answered yet.
  int erasable_slots() const { return erasable_slots_.value_or(0); }
  // The server answered a probe without slot actions (no --slot-save-path): kvpersist cannot
  // erase a slot, so isolation between credentials is off.
  bool isolation_off() const { return erasable_slots_ == 0; }

  // POST /lora-adapters (docs/design.md §4, §5), REQUIRES the whole server held: the adapters
  // are read before the change, and again after it. When they read back as they were (or the
  // request never reached the server), the slots' KV is still what the runtime computes and
  // residency stays; otherwise nobody is resident and the next look_for_changes runs the
  // whole probe.
  net::awaitable<void> begin_runtime_change();
  net::awaitable<void> end_runtime_change(bool reached_server);

 private:
  using full_probe = core::full_probe;
  net::awaitable<void> probe_loop();
  // The probe, compatibility.json read again first, and after a failure whether /props answers.
  net::awaitable<full_probe> run_full_probe();
  // Applies core::runtime_watch's decision on the probe to the pool, and logs it.
  void apply_probe(const full_probe& fp);
  // Managed mode: the pool's slots become the server's; false while leases keep it waiting.
  bool apply_slot_layout(const core::result<core::server_probe>& p);
  void note_unavailable(const core::probe_decision& d);
  // While backing off: whether the probe may run now (the back-off ended, or a hint showed a
  // new process behind /props).
  net::awaitable<bool> probe_retry_due();
  // Turns persistence off, with one warning line until it comes back.
  void disable_persistence(const std::string& why,
                           core::errc code = core::errc::backend_unsupported);
  // The behaviour class of the epoch, probed on `slot` when it is not known yet; persistence
  // off on a back-off when it cannot be established.
  net::awaitable<void> establish_behaviour(int slot);
  // The slots kvpersist believes hold a session that show no cached token (an erase it did
  // not make, or a restart that kept the media marker); the slots other requests hold are
  // skipped.
  net::awaitable<std::vector<int>> owned_slots_seen_empty(int own_slot);
  // Forgets those slots only; when no owned slot is left, it logs a restart behind the marker.
  void forget_emptied_slots(const std::vector<int>& emptied);
  void log_slot_emptied(int slot, const std::string& session);
  std::size_t owned_slots() const;
  void reset_when_nothing_owned();
  void warn_idle_clearing(bool others_kept);

  net::any_io_executor strand_;
  backends::kv_backend& backend_;
  const manifest_store& store_;
  core::slot_pool& pool_;
  const lease_queue& leases_;
  slot_actions& actions_;
  sleep_tracker& sleep_;
  runtime_monitor_options opts_;
  behaviour_prober behaviour_;

  net::steady_timer probe_timer_;
  bool stopped_ = false;
  std::atomic<bool> upstream_trouble_{false};
  std::atomic<bool> full_probe_due_{false};  // the next look_for_changes runs the whole probe
  std::optional<full_probe> pending_probe_;  // applied when the leases are gone
  bool warned_disabled_ = false;
  bool warned_idle_clearing_ = false;  // kv.slots.idle_cleared, once per process
  std::string disabled_why_;  // the reason persistence was turned off (kv.backend.unsupported)
  std::optional<int> erasable_slots_;  // erasable_slots(); nullopt: no probe answered yet
  manifest_store::compatibility_record compatibility_;  // as last read
  // Epochs, the behaviour class and the probe back-off (docs/design.md §4).
  core::runtime_watch watch_;
  std::optional<std::string> lora_before_;  // the adapters before the runtime change in progress
};

}  // namespace kvp::proxy
