// The door for requests that llama-server places on a slot of its own choosing
// (docs/design.md §14, §20, §24): an unpinnable request in managed mode (`/v1/messages`,
// embeddings, rerank), and any request while persistence is off (a pass-through). kvpersist
// cannot say which slot such a request will run on, so the door is asked for every slot of
// the server, and what the request leaves is recorded afterwards.
//
// A view over the slot table and the tenancy (core/pool_state.hpp): cheap to make, it holds
// references and lives no longer than the pool. Thread safety: none; calls are made on the
// server's strand.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/plan_builder.hpp"
#include "core/pool_state.hpp"
#include "core/request_class.hpp"

namespace kvp::core {

// Where a session's placed request was before it ran, and where it ran (-1: none, unknown).
struct placed_run {
  int restored = -1;  // the slot restored for it just before
  int held = -1;      // the slot that held the session before (it was resident there)
  int ran = -1;       // the slot llama-server ran it on
};

// An erase before a request that llama-server places itself (docs/design.md §14, §20).
struct isolating_erase {
  int slot = 0;
  bool required = false;  // the sharing scope's: a failed erase fails the request
};

class placed_door {
 public:
  explicit placed_door(pool_state& st) : st_(st) {}

  // Persistence off (docs/design.md §5 "Without persistence", §20): a request of `credential`
  // runs there, so any slot may hold its content from now on; nobody owns a slot.
  void note_pass_through(const std::string& credential);

  // Managed mode, an unpinnable request: the slots to erase before it, those whose content
  // `who` may not run on, by the rule of an auxiliary call (§20). REQUIRES every slot's lease
  // (an exclusive lease); the owners of dirty slots saved first.
  std::vector<isolating_erase> erases_before_unpinned(const request_identity& who);
  // ... and afterwards: it ran on `slot`, which now holds content of `credential` that belongs
  // to no session. REQUIRES the exclusive lease.
  void note_unpinned_ran(int slot, const std::string& credential);

  // A session's request that llama-server places (docs/design.md §23). Before it: whether a
  // restore into restore_target() serves the session `hash` of `who`, which no slot holds:
  // its own ready snapshot, or for a session without one a seed (§3) that shares more than
  // any slot's content does. llama-server then places it there (the longest common prefix).
  // A resident session whose request does not continue what its slot holds (another
  // conversation under its header) restores its own snapshot when that shares more.
  bool wants_restore(const request_identity& who, const std::string& hash) const;
  // Whether the request continues what the session `hash` last ran (its chain and the
  // session's are one the other's start): its next step, which llama-server places on the same
  // slot, so that slot needs no save before it.
  bool continues(const request_identity& who, const std::string& hash) const;
  // An empty slot if there is one, else the least recently used one, not the one `hash`
  // holds. REQUIRES every slot.
  int restore_target(const std::string& hash = {}) const;
  // After it: the slot that ran it is the session's from now on; a restored or held slot it
  // did not run on is forgotten. Returns the turn- or step-end save to run, as end_inference
  // does. REQUIRES the exclusive lease.
  // `follow`: the session follows its request even when it did not continue the session (mode
  // auto, where every request is placed); otherwise (an unpinnable request in managed mode,
  // whose session runs pinned) only a request that continues it is adopted.
  std::optional<save_step> note_session_ran(const request_identity& who, const placed_run& run,
                                            bool turn_end, steady_time now, bool follow = true);
  // An owned slot seen empty after a placed request: llama-server cleared it (idle-slot
  // caching moved it to RAM), so its owner is no longer resident.
  void note_emptied(int slot);

 private:
  pool_state& st_;
};

}  // namespace kvp::core
