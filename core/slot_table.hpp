// The slots of one llama-server as kvpersist knows them (docs/design.md §14, §20): for each
// slot the session that owns it, its state, what its KV holds (core/slot_door.hpp
// slot_content), when it was last used, its idle checkpoint, and the request being prepared
// on it. The table records; the rules that change it are the planner's (core/plan_builder.hpp,
// core/plan_outcomes.hpp) and the door's (core/slot_door.hpp).
//
// In single-slot mode the table holds one slot (the configured slotId); in managed mode every
// slot of the server (docs/design.md §14).
//
// Thread safety: none (one per llama-server, used on its strand). A call that changes one
// slot REQUIRES that the caller holds that slot's lease; the calls that change every slot
// (on_epoch_change, on_unreachable, on_server_erased) are made when kvpersist learns something
// about the whole server (docs/design.md §5, invariant 8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/slot_door.hpp"
#include "core/steady_time.hpp"

namespace kvp::core {

enum class slot_state { unknown, idle, saving, restoring, ready, inference, dirty };
std::string_view to_string(slot_state s);

// How the request on a slot was prepared (for logs, metrics and the reuse counters).
enum class prepare_kind { none, resident, cold, restored, cold_fallback, auxiliary };
std::string_view to_string(prepare_kind k);

struct table_slot {
  int id = 0;
  std::string owner;  // hash of the owning session, "" when unowned
  slot_state state = slot_state::unknown;
  std::uint64_t last_used = 0;  // the table's logical clock: larger is more recent
  std::optional<steady_time> idle_deadline;
  std::uint64_t idle_rev = 0;  // the owner's dirty revision the idle checkpoint was armed for
  // The request being prepared on this slot.
  std::string pending_hash;
  bool pending_aux = false;
  prepare_kind pending_kind = prepare_kind::none;
  slot_content content;
  slot_content prepared_content;  // what the plan left there, before the request ran
};

class slot_table {
 public:
  // One slot, `first_id`. `reserve_aux`: keep the highest slot of a pool of several for
  // auxiliary calls (docs/design.md §6).
  slot_table(int first_id, bool reserve_aux);

  // The slot ids to manage (managed mode: 0..total_slots-1). A new layout starts from
  // scratch; the same one keeps every slot as it is. Ignores an empty list.
  void set_ids(const std::vector<int>& ids);
  std::vector<int> ids() const;
  // The slot reserved for auxiliary calls, or -1.
  int aux_slot() const;
  // The slots sessions contend for: all but the reserved one.
  std::size_t session_slots() const;

  // nullptr for an id outside the table.
  table_slot* find(int id);
  const table_slot* find(int id) const;
  std::vector<table_slot>& slots() { return slots_; }
  const std::vector<table_slot>& slots() const { return slots_; }

  // "" / unknown / unknown content for an id outside the table.
  const std::string& owner(int id) const;
  slot_state state(int id) const;
  const slot_content& content(int id) const;
  // The slot the session owns, or -1 ("" owns none).
  int slot_of(const std::string& hash) const;
  // The session owns a slot or one is being prepared for it.
  bool in_use(const std::string& hash) const;
  // The earliest idle checkpoint deadline over the table.
  std::optional<steady_time> idle_deadline() const;
  // The slot was just used: it becomes the most recently used.
  void touch(table_slot& s) { s.last_used = ++use_clock_; }

  // The slot's content is unknown (a request kvpersist did not plan may have run on it):
  // nobody owns it, and no idle checkpoint waits for it.
  void forget_slot(int id);
  // llama-server shows the slot empty (GET /slots, docs/design.md §4): as forget_slot, and it
  // holds nothing. The other slots are not touched.
  void forget_emptied_slot(int id);
  // The server process changed (new media_marker, a sleep, new adapters): every slot is
  // empty, nobody is resident.
  void on_epoch_change();
  // The server did not answer (docs/design.md §20): nobody is resident, and each slot's content
  // is unknown, kept as the credential that put it there when that was known.
  void on_unreachable();
  // Every slot of the server was erased: each holds nothing (owners and states untouched).
  void on_server_erased();
  // The runtime changed in the same process (adapters): no slot holds KV anybody may reuse
  // blindly, so every content is unknown.
  void clear_contents();

 private:
  std::vector<table_slot> slots_;
  bool reserve_aux_;
  std::uint64_t use_clock_ = 0;
};

}  // namespace kvp::core
