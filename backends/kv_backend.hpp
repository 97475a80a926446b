// The KvBackend interface (docs/architecture.md): everything kvpersist asks of an inference server's
// slot state. Only implementations know URLs; the coordinator sees these calls alone.
#pragma once

#include <string>
#include <vector>

#include "backends/net.hpp"
#include "core/backend_types.hpp"
#include "core/behaviour.hpp"
#include "core/result.hpp"

namespace kvp::backends {

struct slot_info {
  int id = 0;
  std::int64_t n_ctx = 0;
  bool is_processing = false;
  std::int64_t n_prompt_tokens = -1;  // -1: the server did not say (never-used slot)
  std::int64_t id_task = -1;          // the current or last task on the slot, -1 if none
};

// One inference server. Each call uses its own connection and its own deadline
// (failure.managementTimeoutMs), independent of any inference request. Calls may run on any
// executor; the coordinator serializes those that mutate a slot.
class kv_backend {
 public:
  virtual ~kv_backend() = default;

  // Runtime identity and whether slot actions work, without side effects on any slot.
  virtual net::awaitable<core::result<core::server_probe>> probe() = 0;
  // Only the runtime identity (GET /props for llama-server): the cheap restart check.
  // The default runs the full probe.
  virtual net::awaitable<core::result<core::runtime_info>> read_runtime() {
    auto p = co_await probe();
    if (!p) co_return p.err();
    co_return p->runtime;
  }
  // The LoRA adapters with their scales in core::runtime_info's canonical form (GET
  // /lora-adapters): whether a runtime change had an effect. The default runs the full probe.
  virtual net::awaitable<core::result<std::string>> read_lora_adapters() {
    auto p = co_await probe();
    if (!p) co_return p.err();
    co_return p->runtime.lora_adapters;
  }
  virtual net::awaitable<core::result<std::vector<slot_info>>> inspect_slots() = 0;
  // `filename` is an opaque name produced by core::snapshot_filename.
  virtual net::awaitable<core::result<core::slot_saved>> save(int slot, std::string filename) = 0;
  // Destructive on failure: llama-server clears the slot when a restore fails.
  virtual net::awaitable<core::result<core::slot_restored>> restore(int slot,
                                                                    std::string filename) = 0;
  virtual net::awaitable<core::result<core::slot_erased>> erase(int slot) = 0;
  // The behavioural fingerprint (core/behaviour.hpp): a one-token completion of
  // core::behaviour_prompt on `slot`, whose content it overwrites. An empty signature: the
  // server cannot tell. The default cannot.
  virtual net::awaitable<core::result<core::behaviour_signature>> probe_behaviour(int slot) {
    (void)slot;
    co_return core::behaviour_signature{};
  }
  // Runs kvpersist's own inference request `body` (pinned to `slot` already: "id_slot") on the
  // inference route `target`, for what it leaves in the slot: the cut request that makes a
  // prefix snapshot (docs/design.md §3, "Prefix snapshots"). The reply is not read beyond its
  // status. The default cannot.
  virtual net::awaitable<core::result<core::unit>> run_on_slot(int slot, std::string target,
                                                               std::string body) {
    (void)slot, (void)target, (void)body;
    co_return core::error{core::errc::backend_unsupported, 0, "no inference through the backend"};
  }
};

}  // namespace kvp::backends
