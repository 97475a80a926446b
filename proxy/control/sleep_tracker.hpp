// llama-server's sleep mode as kvpersist follows it (docs/design.md §4, docs/llama-server.md
// §11): when kvpersist last used the server (each slot's last request, the last slot list read:
// both restart its sleep timer), what /props's is_sleeping means (core::sleep_watch decides): a
// sleep entered ends every slot's residency and, without upstream.sleepIdleSeconds, may teach
// the sleep period, which is recorded in sleep.json and moves the idle checkpoint before it;
// and whether a slot's owner may have slept since its last request.
//
// Strand-only: one per coordinator, every call on the coordinator's strand (`strand`).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "backends/net.hpp"
#include "core/sleep_watch.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// checkpoint.idleMs as it applies to a server that sleeps after `sleep_idle` (0: never): the
// idle checkpoint runs at the latest a second before (at half of a short period).
std::chrono::milliseconds checkpoint_before_sleep(std::chrono::milliseconds idle,
                                                  std::chrono::seconds sleep_idle);

// The coordinator's parts the tracker works on; each must outlive it.
struct sleep_tracker_parts {
  core::slot_pool& pool;        // residency ends on a sleep; its idle checkpoint moves
  const manifest_store& store;  // sleep.json
  slot_actions& actions;        // its file pool
};

struct sleep_tracker_options {
  std::string server_name = "default";
  std::chrono::seconds sleep_idle{0};            // upstream.sleepIdleSeconds; 0: learned
  std::chrono::milliseconds idle_checkpoint{0};  // checkpoint.idleMs as configured
};

class sleep_tracker {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  sleep_tracker(net::any_io_executor strand, sleep_tracker_parts parts,
                sleep_tracker_options opts);

  // Adopts the period an earlier process learned (sleep.json), unless upstream.sleepIdleSeconds
  // is set.
  net::awaitable<void> start();
  // /props said `sleeping` now. Entering sleep ends every slot's residency (kv.backend.sleeping,
  // with the dirty sessions it cost) and may teach a shorter period (kv.backend.sleep_learned,
  // sleep.json written on the file pool); waking is logged.
  void note_sleeping(bool sleeping);
  // A request on `slot` ended at `at`: the sleep period is measured from it.
  void note_request_finished(int slot, time_point at);
  // kvpersist read the slot list at `at` (GET /slots restarts llama-server's sleep timer).
  void note_slots_read(time_point at) { last_slots_read_ = at; }
  // The slot's owner has been idle for llama-server's whole sleep period.
  bool may_have_slept(int slot, time_point now) const;
  // upstream.sleepIdleSeconds, else the period learned (0: the server is not known to sleep).
  std::chrono::seconds period() const { return watch_.sleep_period(); }

 private:
  // The end of the last request, or the last slot list read; nullopt until a request ended.
  std::optional<time_point> last_server_use() const;
  void adopt_period(std::chrono::seconds period);

  net::any_io_executor strand_;
  core::slot_pool& pool_;
  const manifest_store& store_;
  slot_actions& actions_;
  sleep_tracker_options opts_;
  core::sleep_watch watch_;
  time_point last_slots_read_{};
  std::map<int, time_point> finished_at_;  // slot -> when its last request ended
};

}  // namespace kvp::proxy
