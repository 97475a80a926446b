#include "core/slot_pool.hpp"

#include <algorithm>
#include <utility>

namespace kvp::core {

void slot_pool::set_runtime(const runtime_info& rt) {
  auto& st = state_;
  const bool model_changed = st.enabled && rt.model_path != st.runtime.model_path;
  const std::string before = st.fingerprint;
  st.runtime = rt;
  st.runtime.runtime_key = st.opts.runtime_key;
  st.keys.set_model(st.runtime.model_path);
  st.fingerprint = st.runtime.fingerprint();
  // Another runtime in the same process (LoRA scales changed): no slot holds KV it can use.
  const bool runtime_changed = st.enabled && st.fingerprint != before;
  st.enabled = true;
  if (model_changed || runtime_changed) {
    st.table.on_epoch_change();
    // Adapters changed in the same process: the slots keep KV that nobody may reuse blindly.
    if (!model_changed) st.table.clear_contents();
  }
}

// Requests now run without a plan: what the slots hold is unknown, as after a stall.
void slot_pool::disable_persistence(errc why) {
  state_.enabled = false;
  state_.disabled_reason = why;
  state_.keys.clear();
  state_.table.on_unreachable();
}

std::string slot_pool::hash_for(std::string_view session_id) const {
  return state_.keys.key(session_id);
}

std::string slot_pool::hash_for(const request_identity& who) const { return state_.keys.key(who); }

// docs/design.md §20: a header names a conversation by its preamble (tools, options, system
// prompt: link 0). A request under the header with another preamble (a title call, a
// sub-agent) is the sub-session `<id>#<its link 0>`. An empty preamble names nothing: the
// header decides, as it does before the session's first request is known.
void slot_pool::resolve_session(request_identity& who) const {
  if (!state_.enabled || who.session_id.empty() || !who.purpose.empty() ||
      is_content_session(who.session_id) || who.chain.empty() || who.min_shared_links > 1)
    return;
  const session_record* r = state_.records.find(hash_for(who));
  if (!r) return;
  const auto& held = !r->chain.empty() || !r->snapshot ? r->chain : r->snapshot->chain;
  if (held.empty() || held.front() == who.chain.front()) return;
  who.session_id = sub_session_id(who.session_id, to_hex(who.chain.front()).substr(0, 16));
}

std::optional<int> slot_pool::choose_slot(const request_identity& who,
                                          const std::vector<int>& free_slots) const {
  auto is_free = [&](int id) {
    return std::find(free_slots.begin(), free_slots.end(), id) != free_slots.end();
  };
  const auto& table = state_.table;
  const bool aux = who.session_id.empty() || !who.purpose.empty();
  const int reserved = table.aux_slot();
  if (aux && reserved >= 0) return is_free(reserved) ? std::optional<int>(reserved) : std::nullopt;
  if (!aux && state_.enabled) {
    const std::string h = hash_for(who);
    int own = table.slot_of(h);
    for (const auto& s : table.slots())
      if (own < 0 && s.pending_hash == h) own = s.id;  // being prepared for this session
    if (own >= 0) return is_free(own) ? std::optional<int>(own) : std::nullopt;
    if (auto shared = slot_sharing_prefix(who, h, free_slots)) return shared;
  }
  const table_slot* best = nullptr;
  auto rank = [&](const table_slot& s) {
    if (s.owner.empty()) return 0;                  // empty (or unknown) first
    return state_.records.dirty(s.owner) ? 2 : 1;  // then clean, then dirty
  };
  for (const auto& s : table.slots()) {
    if (s.id == reserved || !is_free(s.id)) continue;
    if (!best || rank(s) < rank(*best) || (rank(s) == rank(*best) && s.last_used < best->last_used))
      best = &s;
  }
  if (!best) return std::nullopt;
  return best->id;
}

// docs/design.md §14, §23: a session new to kvpersist (no snapshot) goes to the free slot whose
// content shares the longest prefix with it, within the scope, as llama-server's similarity
// choice places it; the owner there is saved first like on any switch. Not when a ready
// snapshot shares as much: that seed restores into an empty slot and the owner stays.
std::optional<int> slot_pool::slot_sharing_prefix(const request_identity& who, const std::string& h,
                                                  const std::vector<int>& free_slots) const {
  if (state_.table.session_slots() < 2 || state_.records.find_manifest(h)) return std::nullopt;
  const seed_choice seeds = state_.seeds();
  const table_slot* best = nullptr;
  std::size_t most = 0;
  for (const auto& s : state_.table.slots()) {
    if (s.id == state_.table.aux_slot() ||
        std::find(free_slots.begin(), free_slots.end(), s.id) == free_slots.end())
      continue;
    const std::size_t links = seeds.shared_with_slot(s, who, h);
    if (links == 0) continue;
    if (!best || links > most || (links == most && s.last_used < best->last_used)) {
      best = &s;
      most = links;
    }
  }
  if (!best || seeds.best_seed(who, h, most - 1)) return std::nullopt;
  return best->id;
}

bool slot_pool::pass_through_needs_erase(const std::string& credential) const {
  // docs/design.md §24: the whole server is one slot's worth of content.
  const slot_door d = state_.tenants.door_with(credential);
  const auto& slots = state_.table.slots();
  return std::any_of(slots.begin(), slots.end(), [&](const table_slot& s) {
    return d.ask(s.content, {credential, {}, true}) == door_answer::erase_or_refuse;
  });
}

void slot_pool::add_manifest(manifest m) {
  if (state_.table.slot_of(m.session_hash) >= 0) return;  // resident here: our record is newer
  state_.tenants.note_credential(m.credential);
  state_.records.add_manifest(std::move(m));
}

}  // namespace kvp::core
