// The behavioural fingerprint's probes (docs/design.md §4): what the model answers to a fixed
// prompt on a leased slot, judged against the behaviour classes recorded for the runtime's
// metadata in the state directory (core::runtime_watch::judge_first_behaviour). A class seen
// before needs one probe; a new one three that agree, and is then recorded and logged. The
// runtime monitor applies the class it returns, or backs off when it returns none.
//
// Strand-only: one per runtime monitor, used on the coordinator's strand. Each probe REQUIRES
// the slot's lease.
#pragma once

#include <string>
#include <vector>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/behaviour.hpp"
#include "core/result.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's parts the prober uses; each must outlive it.
struct behaviour_prober_parts {
  backends::kv_backend& backend;  // the probes
  const manifest_store& store;    // the behaviour classes
  slot_actions& actions;          // its file pool
};

class behaviour_prober {
 public:
  behaviour_prober(behaviour_prober_parts parts, std::string server_name);

  // The behaviour class (core/behaviour.hpp's id) of the runtime whose metadata fingerprint is
  // `meta_fp`, probed on `slot`. The error's message says why it stays unknown: a probe failed
  // or answered unlike before, the probes of one runtime disagree, the classes recorded cannot
  // be read.
  net::awaitable<core::result<std::string>> establish(int slot, std::string meta_fp);

 private:
  // A class not seen under `meta_fp` (`known`): two more probes must agree with `first`, then
  // it is recorded beside the others.
  net::awaitable<core::result<std::string>> confirm_new(int slot, std::string meta_fp,
                                                       core::behaviour_signature first,
                                                       std::vector<core::behaviour_signature> known);

  backends::kv_backend& backend_;
  const manifest_store& store_;
  slot_actions& actions_;
  std::string server_name_;
};

}  // namespace kvp::proxy
