// How one llama-server's slot pool is configured (README "Configuration": checkpoint,
// restore, failure, sessions.sharing, retention.maxSessions), as the coordinator derives it
// from the config. Plain values; each part of the pool (core/pool_state.hpp) reads its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "core/retention.hpp"

namespace kvp::core {

struct slot_pool_options {
  std::string instance_key = "default";
  std::string runtime_key;
  int slot_id = 0;
  bool save_on_switch = true;
  bool save_on_turn_end = false;   // after a reply that hands the conversation to the user
  bool save_on_step_end = false;   // after every model call
  std::chrono::milliseconds idle_checkpoint{30'000};  // 0: off
  // Early checkpoint (docs/design.md §10): after a reply that ends the user's turn, while
  // more sessions took turns within `contention_window` than there are session slots (so the
  // next switch would wait for a save), save once the slot has been idle this long, or twice
  // the session's last save time if that is longer, so that the switch is a restore only.
  // A single conversation never pays for it. 0: off.
  std::chrono::milliseconds early_checkpoint{0};
  std::chrono::milliseconds contention_window{600'000};
  bool restore_enabled = true;
  bool verify_restore = true;
  bool strict = false;
  int max_consecutive_failures = 3;
  std::chrono::milliseconds cooldown{60'000};
  // Managed multi-slot mode: keep the highest slot for auxiliary calls (titles, summaries)
  // so they never evict a session (docs/design.md §6).
  bool reserve_aux_slot = false;
  // Seeding (docs/design.md §3): a session without a usable snapshot of its own may start
  // from another session's whose prefix chain it shares; with `seed_within_credential`, only
  // from a session of the same credential.
  // The same two switches are the sharing scope of the slot's content (docs/design.md §20):
  // instance (true, false), credential (true, true), session (false, either).
  bool seed_across_sessions = true;
  bool seed_within_credential = false;
  // Sessions remembered without a snapshot (a first visit not saved yet, a save that came
  // back empty): beyond this many the least recently used one that no slot holds or is being
  // prepared for is forgotten (docs/design.md §12). Those with a snapshot are retention's.
  std::size_t max_records_without_snapshot = default_record_limit;
};

}  // namespace kvp::core
