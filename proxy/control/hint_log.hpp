// Hints (core/request_hints.hpp): what requests to one server show that keeps new conversations
// from starting warm. Each request that shows one is counted (note, thread-safe); the first
// sighting of each hint in this process is logged once (kv.hint.<id>) and recorded, with its
// time, in the state directory's hints.json for `kvpersist doctor`; the counts are reported in
// GET /kv/status (write_status) and /metrics (write_metrics).
//
// note may be called from any thread. The first sighting is recorded on the owner's strand
// (`strand`), through slot_actions' file pool; write_status REQUIRES that strand (it reads the
// first-seen times the recording writes).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "backends/net.hpp"
#include "core/json_writer.hpp"
#include "core/metrics.hpp"
#include "core/request_hints.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

class hint_log {
 public:
  // Every reference must outlive this object.
  hint_log(std::string server_name, net::any_io_executor strand, const manifest_store& store,
           slot_actions& actions);

  // A request showed `h`: counted; the first in this process is recorded (log line and
  // hints.json) on the strand, after everything already submitted to it. Thread-safe.
  void note(core::hint_id h);

  // GET /kv/status's "hints": one object per hint seen (hint, requests, firstSeenAt, effect,
  // fix), README "Admin API". Strand-only.
  void write_status(core::json_writer& w) const;
  // kvpersist_hint_requests_total, one sample per hint (0 for those not seen) with `labels`.
  void write_metrics(core::prom_writer& w, const std::string& labels) const;

 private:
  // The first sighting of `h`: its time, its log line and hints.json (every hint seen so far).
  net::awaitable<void> record_first(core::hint_id h, std::string seen_at);

  std::string server_name_;
  net::any_io_executor strand_;
  const manifest_store& store_;
  slot_actions& actions_;
  std::array<std::atomic<std::uint64_t>, core::hint_count> seen_{};  // requests, by hint
  std::array<std::string, core::hint_count> first_seen_at_;          // strand-only; "" unseen
};

}  // namespace kvp::proxy
