// The runtime the unit tests probe (FakeBackend answers it): one llama-server of a 7B Q4 model,
// one slot, 8192 tokens.
#pragma once

#include "core/identity.hpp"

namespace kvp::testing {

inline kvp::core::runtime_info qwen7b_runtime() {
  kvp::core::runtime_info rt;
  rt.model_path = "/models/qwen2.5-7b-instruct-q4_k_m.gguf";
  rt.build_info = "b6123-80fb11a";
  rt.n_ctx = 8192;
  rt.total_slots = 1;
  rt.media_marker = "<__media_1__>";
  return rt;
}

}  // namespace kvp::testing
