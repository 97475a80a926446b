// What the coordinator's probes of llama-server's runtime mean (docs/design.md §4): whether a
// probe's answer starts a new epoch, keeps or turns persistence off, and backs the probe off;
// and the behaviour class established for the epoch (its sleep is core/sleep_watch.hpp's). Pure: the coordinator runs the probes
// (proxy/control/runtime_monitor.cpp), feeds their results here with the time, and
// applies and logs what comes back. Thread safety: none (one per coordinator, on its strand).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/backend_types.hpp"
#include "core/behaviour.hpp"
#include "core/errc.hpp"
#include "core/result.hpp"

namespace kvp::core {

// The full probe and, when it failed, whether /props still answers (docs/design.md §4: a
// probe that fails after /props is retried on a back-off, not before every request).
struct full_probe {
  result<server_probe> probe;
  std::optional<std::string> answering_marker;  // /props answered (awake): its media_marker
};

// What the coordinator knows when a probe's answer arrives, read before it changes anything.
struct probe_context {
  bool persistence_enabled = false;
  std::string current_marker;  // the media_marker of the runtime in use
  bool single_slot = true;
  int slot_id = 0;             // single-slot mode: the slot kvpersist manages
  std::string runtime_key;     // runtime.key, part of the fingerprint
  // compatibility.json as last read (doctor --verify): the fingerprint it judged, its verdict.
  std::string compatibility_fingerprint;
  std::string compatibility_verdict = "unknown";
};

// What a probe's answer means for persistence.
struct probe_decision {
  enum class action {
    disable,      // persistence off (`why`, `code`) until a later probe reads a usable answer
    unavailable,  // the server did not answer: requests are forwarded, looked at again soon
    adopt,        // the runtime is usable: `identity` and `verdict` become the pool's
  };
  action what = action::disable;
  std::string why;  // disable, unavailable: the reason
  errc code = errc::backend_unsupported;
  runtime_info identity;          // adopt: the runtime with its key and known behaviour class
  std::string verdict;            // adopt: the compatibility verdict for its fingerprint
  bool restarted = false;         // adopt: another process than the one persistence was on
  bool newly_ready = false;       // adopt: persistence was off
};

// What the behaviour probe's first answer says, against the classes known for the metadata.
struct behaviour_judgement {
  enum class action {
    adopt,    // `class_id` is the epoch's class ("": the server cannot tell)
    suspect,  // `why`: the class stays unknown, persistence off for a back-off
    confirm,  // an unknown class: two more probes must agree before it is recorded
  };
  action what = action::confirm;
  std::string class_id;
  std::string why;
};

class runtime_watch {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  static constexpr std::chrono::seconds probe_retry_first{1};
  static constexpr std::chrono::seconds probe_retry_cap{30};

  // The full probe's answer at `now`. A failure after /props answered starts a back-off; an
  // adopted runtime becomes the epoch, with its behaviour class when one was established
  // for it (which also ends the back-off). The slot layout (managed mode) is the
  // coordinator's, checked before this.
  probe_decision judge_probe(const full_probe& fp, const probe_context& ctx, time_point now);

  // Probe back-off (docs/design.md §4): a probe failed while the server answered; tried
  // again after 1 s, 2 s, 4 s ... at most 30 s, or at once on a new process than `marker`.
  void back_off(const std::string& marker, time_point now);
  bool backing_off(bool persistence_enabled) const {
    return probe_failures_ > 0 && !persistence_enabled;
  }
  bool retry_time_reached(time_point now) const { return now >= probe_retry_at_; }
  const std::string& retry_marker() const { return probe_retry_marker_; }
  int probe_failures() const { return probe_failures_; }

  // The behaviour class (docs/design.md §4): probed once per epoch.
  bool behaviour_known() const { return runtime_epoch_ == behaviour_epoch_; }
  const std::string& runtime_epoch() const { return runtime_epoch_; }
  const std::string& meta_fingerprint() const { return meta_fingerprint_; }
  static behaviour_judgement judge_first_behaviour(const std::vector<behaviour_signature>& known,
                                                   const behaviour_signature& first);
  // `id` is the class of the epoch `epoch`; the back-off ends.
  void adopt_behaviour(const std::string& epoch, const std::string& id);
  // The process behind the marker may run another model now.
  void forget_behaviour() { behaviour_epoch_.clear(); }

 private:
  // Why persistence cannot run on the probed server (a disable decision), or nullopt.
  static std::optional<probe_decision> unusable(const server_probe& p, const probe_context& ctx);

  std::string meta_fingerprint_;  // the runtime's fingerprint without its behaviour class
  std::string runtime_epoch_;     // media_marker "|" meta_fingerprint_, set with the runtime
  std::string behaviour_epoch_;   // the runtime_epoch_ the behaviour class was established for
  std::string behaviour_class_;   // core/behaviour.hpp class id ("": the server cannot tell)
  // Probes that failed in a row while /props answered (the full probe after /props, or the
  // behaviour probe): persistence is off until probe_retry_at_.
  int probe_failures_ = 0;
  time_point probe_retry_at_{};
  std::string probe_retry_marker_;  // the process they failed on: a new one is probed at once
};

}  // namespace kvp::core
