// The parts a coordinator hands to its slot actions, retention keeper and session admin, over a
// FakeBackend and a fresh state directory: the setup their unit tests share (each harness
// derives from it and adds the type under test).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>
#include <utility>

#include "core/reuse_stats.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/commit_pipeline.hpp"
#include "proxy/control/file_io.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/control/snapshot_files.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvp::testing {

// One runtime key, no idle checkpoint, no seeding: a cold start erases the slot.
inline core::slot_pool_options control_pool_options() {
  core::slot_pool_options o;
  o.instance_key = "test";
  o.runtime_key = "qwen7b-f16kv";
  o.idle_checkpoint = std::chrono::milliseconds(0);
  o.seed_across_sessions = false;
  return o;
}

// A lease queue's chooser for one slot, 0: a request takes it when it is free; every session
// is its own key and nothing is pinned.
inline proxy::slot_chooser one_slot_chooser() {
  proxy::slot_chooser c;
  c.slot_ids = [] { return std::vector<int>{0}; };
  c.choose_slot = [](const core::request_identity&,
                     const std::vector<int>& free) -> std::optional<int> {
    if (free.empty()) return std::nullopt;
    return free.front();
  };
  c.session_key = [](const core::request_identity& who) { return who.session_id; };
  c.pins_requests = [] { return false; };
  return c;
}

// Holds `slot` as a running request's lease would, until `leases.release(ticket)`: what a
// part under test must wait for or leave alone.
inline std::shared_ptr<proxy::lease_ticket> hold_slot(proxy::lease_queue& leases,
                                                      net::io_context& ioc, int slot) {
  auto ticket = std::make_shared<proxy::lease_ticket>(ioc.get_executor());
  leases.hold_slot(slot, ticket);
  return ticket;
}

// Server-owned snapshots (llama-server's files), manifests in `dir`.
struct control_parts {
  temp_dir dir;
  net::io_context ioc;
  FakeBackend fake;
  proxy::manifest_store store{dir.path()};
  core::slot_pool pool;
  proxy::file_io files;
  proxy::commit_pipeline commits{ioc.get_executor()};
  proxy::snapshot_files snapshots{""};
  core::reuse_stats reuse;

  explicit control_parts(std::chrono::milliseconds file_timeout = std::chrono::seconds(5),
                         core::slot_pool_options pool_options = control_pool_options())
      : pool(std::move(pool_options)), files(1, 8, file_timeout) {}
};

}  // namespace kvp::testing
