// One llama-server's slots and sessions as kvpersist knows them, and the state of persistence
// itself: the parts every planner reads and writes. The planner of pinned requests is
// core/plan_builder.hpp (before a request) with core/plan_outcomes.hpp (what its calls and
// inference did); requests llama-server places itself ask core/placed_door.hpp. Another
// layout (docs/design.md §23's placed layout) is another planner over the same parts.
//
// Each part keeps its own contract: the slot table (core/slot_table.hpp), the session records
// (core/session_records.hpp), the tenancy (core/tenancy.hpp), the session keys
// (core/session_keys.hpp), the checkpoint policy (core/checkpoint_policy.hpp) and the
// backend's health (core/backend_health.hpp). core/slot_pool.hpp owns one and keeps its
// fields consistent across runtime changes.
//
// Thread safety: none. One instance per llama-server, touched only on that server's strand.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/backend_health.hpp"
#include "core/checkpoint_policy.hpp"
#include "core/errc.hpp"
#include "core/identity.hpp"
#include "core/seed_choice.hpp"
#include "core/session_keys.hpp"
#include "core/session_records.hpp"
#include "core/slot_pool_options.hpp"
#include "core/slot_table.hpp"
#include "core/tenancy.hpp"

namespace kvp::core {

struct core_stats {
  std::uint64_t restores = 0, restore_hits = 0, restore_failures = 0, cold_starts = 0,
                saves = 0, save_failures = 0, empty_saves = 0, switches = 0,
                save_bytes = 0, restore_bytes = 0, invalidations = 0;
  // A returning session (one with a snapshot record) that ran cold: its snapshot was invalid,
  // from another runtime, failed to restore, or restores were off or paused. First visits
  // are cold starts, not misses.
  std::uint64_t restore_misses = 0;
};

struct save_step {
  int slot = 0;
  std::string hash;
  std::string filename;  // the generation the manifest does not point at
  char generation = 'a';
  std::uint64_t revision = 0;  // the dirty revision this save captures
};

struct pool_state {
  explicit pool_state(slot_pool_options o);

  // A save of `slot`'s owner (REQUIRES one) into the generation its manifest does not point
  // at, capturing its current dirty revision. Marks the slot as saving.
  save_step save_of(table_slot& slot);
  // Whether a cold start may keep what the slot holds: only for model kinds that reuse a
  // prefix of foreign KV; the others reprocess it anyway, so they get an erase (§20).
  bool keeps_content() const { return reuses_foreign_prefix(compatibility); }
  // The seeding choice under the current scope, runtime and verdict (docs/design.md §3).
  seed_choice seeds() const;

  slot_pool_options opts;
  // Persistence turns on when a probe shows a usable server; until then every plan is empty
  // (docs/design.md §13). Not probed yet counts as unreachable.
  bool enabled = false;
  errc disabled_reason = errc::backend_unavailable;
  runtime_info runtime;
  std::string fingerprint;               // runtime.fingerprint()
  std::string compatibility = "unknown";  // the last `doctor --verify` verdict; new manifests carry it

  slot_table table;
  session_records records;
  tenancy tenants;
  session_keys keys;
  checkpoint_policy checkpoints;
  backend_health health;
  core_stats stats;
};

}  // namespace kvp::core
