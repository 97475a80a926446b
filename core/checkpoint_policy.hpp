// When a dirty slot is saved (docs/design.md §10): before a switch, at each step's or turn's
// end when configured, once the slot has been idle for checkpoint.idleMs, and early after a
// turn end while sessions contend for the slots (the early checkpoint), so that the next
// switch finds the session saved and is a restore only. A single conversation never pays for
// the early checkpoint: it remembers which sessions took a turn lately (at most 64) to tell.
//
// It decides only when; the slot's idle deadline and the save itself are the planner's
// (core/plan_outcomes.hpp). Pure: takes `now` from its caller. Thread safety: none (one per
// llama-server, used on its strand).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_map>

#include "core/slot_pool_options.hpp"
#include "core/steady_time.hpp"

namespace kvp::core {

class checkpoint_policy {
 public:
  // Reads save_on_switch, save_on_turn_end, save_on_step_end, idle_checkpoint,
  // early_checkpoint and contention_window.
  explicit checkpoint_policy(const slot_pool_options& opts);

  // Whether a dirty owner is saved before another session takes its slot (invariant I3).
  bool saves_on_switch() const { return opts_.save_on_switch; }
  // Whether a request that left its session dirty is saved before its lease is released:
  // after every step, or at a turn end (`turn_end`: its reply handed the turn to the user).
  bool saves_at_end(bool turn_end) const;

  // The session `hash` took a turn at `now`. Turns older than the contention window are
  // forgotten; beyond 64 sessions the one whose turn is oldest goes.
  void note_turn(const std::string& hash, steady_time now);
  // Whether more sessions took a turn within the contention window than there are
  // `session_slots`.
  bool contended(steady_time now, std::size_t session_slots) const;

  // How long a slot left dirty at `now` waits before its idle checkpoint; 0: none. After a
  // turn end while contended, the early checkpoint's delay (at least twice
  // `last_save_ms`, the session's last save time, so a user who answers quickly rarely
  // finds the save in progress); otherwise checkpoint.idleMs.
  std::chrono::milliseconds idle_before_checkpoint(double last_save_ms, bool turn_end,
                                                   steady_time now,
                                                   std::size_t session_slots) const;

  // checkpoint.idleMs from now on (a learned sleep period, docs/design.md §4).
  void set_idle_checkpoint(std::chrono::milliseconds idle) { opts_.idle_checkpoint = idle; }
  std::chrono::milliseconds idle_checkpoint() const { return opts_.idle_checkpoint; }

 private:
  slot_pool_options opts_;
  std::unordered_map<std::string, steady_time> recent_turns_;  // session hash -> its last turn
  static constexpr std::size_t max_recent_turns = 64;
};

}  // namespace kvp::core
