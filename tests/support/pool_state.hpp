// A core::pool_state with persistence on, as core::slot_pool::set_runtime leaves it, for the
// unit tests of the parts and views that work on one without a slot_pool (core/pool_state.hpp).
#pragma once

#include <utility>
#include <vector>

#include "core/pool_state.hpp"
#include "tests/support/runtime.hpp"

namespace kvp::testing {

// `slots` slots (0..slots-1), the qwen7b runtime under runtime key "rk", no idle checkpoint.
inline core::pool_state enabled_pool_state(int slots = 1, core::slot_pool_options o = {}) {
  o.runtime_key = "rk";
  o.idle_checkpoint = std::chrono::milliseconds(0);
  core::pool_state st(std::move(o));
  std::vector<int> ids;
  for (int i = 0; i < slots; ++i) ids.push_back(i);
  st.table.set_ids(ids);
  st.runtime = qwen7b_runtime();
  st.runtime.runtime_key = st.opts.runtime_key;
  st.fingerprint = st.runtime.fingerprint();
  st.keys.set_model(st.runtime.model_path);
  st.enabled = true;
  return st;
}

// A ready snapshot of `who` (100 tokens, 4096 bytes, its chain) under the running runtime.
inline core::manifest add_ready_snapshot(core::pool_state& st, const core::request_identity& who) {
  core::manifest m;
  m.session_hash = st.keys.key(who);
  m.runtime_fingerprint = st.fingerprint;
  m.tokens = 100;
  m.bytes = 4096;
  m.credential = who.credential;
  m.chain = who.chain;
  st.records.add_manifest(m);
  return m;
}

}  // namespace kvp::testing
