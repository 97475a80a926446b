// Seeding (docs/design.md §3): which content a session without a usable snapshot of its own
// may start from instead of an empty slot. Two candidates: another session's ready snapshot
// that shares the longest start of the request's prefix chain (the fewest bytes among
// equals: a prefix snapshot before a whole donor), and what the slot holds now, when it is
// another session's within the sharing scope. The planner ranks them with the session's own
// snapshot (core/plan_builder.hpp).
//
// A view over the session records, for one plan: it keeps references, so it lives no longer
// than the records it reads. Pure; thread safety: none.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/chain_index.hpp"
#include "core/request_class.hpp"
#include "core/session_records.hpp"
#include "core/slot_door.hpp"
#include "core/slot_table.hpp"

namespace kvp::core {

// Whether the model kind reuses a prefix of KV it did not compute itself: a sliding-window or
// recurrent model that `doctor --verify` judged `experimental` or `broken` reprocesses a
// restored or kept state unless the prompt continues it exactly.
bool reuses_foreign_prefix(std::string_view compatibility);

struct seed_rules {
  // The scope lets sessions share (not `session`), restores are on, and the model kind
  // reuses a foreign prefix (reuses_foreign_prefix).
  bool allowed = false;
  bool within_credential = false;  // `sharing: credential`: only that credential's snapshots
  std::string_view fingerprint;    // the running runtime's: another's snapshot seeds nothing
  slot_door door;                  // who may run on what a slot holds
};

class seed_choice {
 public:
  seed_choice(const session_records& records, seed_rules rules)
      : records_(records), rules_(rules) {}

  // Links the content of `slot` shares with the request the slot is being prepared for
  // (`slot.pending_hash`), when that content is another session's last request, ready or
  // dirty, within the scope, and shares at least `who.min_shared_links`; 0 otherwise.
  std::size_t shared_with_slot(const table_slot& slot, const request_identity& who) const;
  // Another session's ready snapshot of this runtime (not `own`'s), within the scope,
  // sharing more than `better_than` links (and at least `who.min_shared_links`): among those
  // sharing most, the one that reads the fewest bytes. nullopt when none does.
  std::optional<chain_index::match> best_seed(const request_identity& who, const std::string& own,
                                              std::size_t better_than) const;

 private:
  const session_records& records_;
  seed_rules rules_;
};

}  // namespace kvp::core
