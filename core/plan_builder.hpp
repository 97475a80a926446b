// The pinned layout's planner, before a request (docs/design.md §6, §14, §20): which management
// calls must run on the leased slot before the request is forwarded there (save the owner,
// then restore, keep or erase), and the saves of a dirty owner outside a request (the idle
// checkpoint, a flush, a dispose), and the admin's invalidations and purges. What those calls
// and the request did comes back through core/plan_outcomes.hpp.
//
// A view over the pool's parts (core/pool_state.hpp): cheap to make, it holds a reference and
// lives no longer than the pool. Thread safety: none; every call is made on the server's
// strand, and each one that names a slot REQUIRES that the caller holds that slot's lease, so
// each slot has one mutator at a time (docs/design.md §5, invariant 8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/manifest.hpp"
#include "core/pool_state.hpp"
#include "core/request_class.hpp"

namespace kvp::core {

struct restore_step {
  int slot = 0;
  std::string hash;  // whose snapshot: verified against, and invalidated if it fails
  std::string filename;
  std::uint64_t expected_tokens = 0;
  std::uint64_t expected_bytes = 0;  // n_written at save time (file size)
  // A seed (docs/design.md §3): the hash of the session the slot is prepared for, whose
  // request shares `common_links` prefix links with `hash`'s snapshot. "" for a session's
  // own snapshot.
  std::string seed_for;
  std::size_t common_links = 0;
};

// A snapshot and a request whose overlap cannot be told (either has no prefix chain).
inline constexpr std::size_t unknown_overlap = static_cast<std::size_t>(-1);

// The management calls to run before forwarding, in this order: save, then restore or erase.
struct prepare_plan {
  int slot = 0;
  std::optional<save_step> save;
  std::optional<restore_step> restore;  // run only if the save (if any) is finished
  bool erase = false;                   // cold start: clear the slot
  // The erase is the scope's: the request may not run on the slot's content (docs/design.md
  // §20), so a failed erase fails the request rather than run it there.
  bool erase_required = false;
  // A cold start that keeps the slot's content within the scope (docs/design.md §20), and how
  // many prefix links that content shares with the request (0: none kvpersist can see).
  bool kept = false;
  std::size_t kept_links = 0;
  bool resident = false;                // the session already owns the slot: nothing to do
  bool fail = false;                    // strict mode: persistence cannot run, answer 503
  errc fail_code = errc::invariant;     // why, when fail
  std::vector<manifest> manifest_writes;  // invalidations decided while planning
};

class plan_builder {
 public:
  explicit plan_builder(pool_state& st) : st_(st) {}

  // What the door (core/slot_door.hpp, docs/design.md §24) answers for `who` on what `slot`
  // holds: run, erase, or erase and refuse the request if the erase fails.
  door_answer door_for(int slot, const request_identity& who) const;

  // REQUIRES: lease of `slot` held. Plans the management calls for a request of `who`
  // (session_id empty or purpose set: auxiliary). Marks the slot as saving/restoring before
  // returning, so no other decision can race it while the calls are in flight.
  prepare_plan prepare(const request_identity& who, int slot, steady_time now,
                       std::string_view wall_now);

  // Idle checkpoint (docs/design.md §10): when the timer fires, REQUIRES the slot's lease, and
  // re-checks that the same owner is still dirty at the same revision before asking for a save.
  std::optional<save_step> idle_checkpoint(int slot, steady_time now);
  // Flush/shutdown/admin: a save of the slot's owner if it is dirty (nothing if clean: coalesced).
  std::optional<save_step> checkpoint_slot(int slot, steady_time now);
  // A save of `hash` if it owns a slot and is dirty (flush of one session).
  std::optional<save_step> checkpoint_session(const std::string& hash, steady_time now);
  // Dispose, second half: the session gives its slot up but stays known, so its next
  // request restores from its snapshot. Only a clean owner lets go (checkpoint_session
  // first); returns false, keeping the ownership, while the slot holds unsaved turns.
  bool release_session(const std::string& hash);

  // Admin operations. REQUIRES: lease of the session's slot held (if it owns one).
  // Marks the session's snapshot invalid (reason: an errc name; note: the operator's words,
  // recorded as the manifest's invalidNote); returns the manifest to write, or nothing if the
  // session has no snapshot.
  std::optional<manifest> invalidate(const std::string& hash, errc reason,
                                     std::string_view wall_now, std::string_view note = {});
  // Forgets the session (purge): its record and, if it owns a slot, the ownership.
  // Returns whether anything was known about it.
  bool forget(const std::string& hash);

 private:
  prepare_plan paused_plan(prepare_plan plan, table_slot& sl, const request_identity& who,
                           door_answer answer);
  void choose_content(prepare_plan& plan, table_slot& sl, const request_identity& who,
                      door_answer answer, std::size_t in_slot, std::string_view wall_now);
  std::optional<std::size_t> own_snapshot_usable(session_record& r, prepare_plan& plan,
                                                 const request_identity& who,
                                                 std::string_view wall_now);
  session_record& touch_record(const std::string& hash, std::string_view session_id);

  pool_state& st_;
};

}  // namespace kvp::core
