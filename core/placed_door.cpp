#include "core/placed_door.hpp"

#include <algorithm>

#include "core/plan_outcomes.hpp"

namespace kvp::core {

void placed_door::note_pass_through(const std::string& credential) {
  st_.tenants.note_credential(credential);
  for (auto& s : st_.table.slots()) {
    const auto& c = s.content;
    const bool its_own = c.whose == content_whose::empty ||
                         ((c.whose == content_whose::known || c.credential_known) &&
                          c.credential == credential);
    s.owner.clear();
    s.state = slot_state::unknown;
    s.content = its_own ? slot_content{content_whose::unknown, credential, {}, true}
                        : slot_content{};
  }
}

std::vector<isolating_erase> placed_door::erases_before_unpinned(const request_identity& who) {
  st_.tenants.note_credential(who.credential);
  // No session's turn runs there: the door asks as for an auxiliary call (docs/design.md §24).
  const door_request unpinned{who.credential, {}, true};
  std::vector<isolating_erase> out;
  for (const auto& s : st_.table.slots()) {
    const auto answer = st_.tenants.door().ask(s.content, unpinned);
    if (answer != door_answer::run) out.push_back({s.id, answer == door_answer::erase_or_refuse});
  }
  return out;
}

void placed_door::note_unpinned_ran(int slot, const std::string& credential) {
  st_.table.forget_slot(slot);
  if (auto* s = st_.table.find(slot)) s->content = {content_whose::known, credential, {}};
}

bool placed_door::continues(const request_identity& who, const std::string& hash) const {
  const session_record* r = st_.records.find(hash);
  if (!r || r->chain.empty() || who.chain.empty()) return false;
  return common_links(r->chain, who.chain) == std::min(r->chain.size(), who.chain.size());
}

bool placed_door::wants_restore(const request_identity& who, const std::string& hash) const {
  if (hash.empty()) return false;
  const manifest* own = st_.records.find_manifest(hash);
  const bool own_ready = own && own->state == snapshot_state::ready;
  if (st_.table.slot_of(hash) >= 0) {
    if (!own_ready || who.chain.empty() || continues(who, hash)) return false;
    const session_record* r = st_.records.find(hash);
    return common_links(own->chain, who.chain) > (r ? common_links(r->chain, who.chain) : 0);
  }
  if (own) return own_ready;
  const seed_choice seeds = st_.seeds();
  std::size_t held = 0;  // llama-server's placement finds what a slot holds by itself
  for (const auto& s : st_.table.slots()) held = std::max(held, seeds.shared_with_slot(s, who, hash));
  return seeds.best_seed(who, hash, held).has_value();
}

int placed_door::restore_target(const std::string& hash) const {
  const table_slot* best = nullptr;
  for (const auto& s : st_.table.slots()) {
    if (!hash.empty() && s.owner == hash) continue;
    const bool empty = s.content.whose == content_whose::empty;
    const bool best_empty = best && best->content.whose == content_whose::empty;
    if (!best || (empty && !best_empty) || (empty == best_empty && s.last_used < best->last_used))
      best = &s;
  }
  return best ? best->id : -1;
}

std::optional<save_step> placed_door::note_session_ran(const request_identity& who,
                                                       const placed_run& run, bool turn_end,
                                                       steady_time now, bool follow) {
  plan_outcomes outcomes(st_);
  if (run.restored >= 0 && run.restored != run.ran) {
    // Prepared for the session, which ran elsewhere: the slot holds an older copy of it.
    outcomes.abort_prepare(run.restored);
    st_.table.forget_slot(run.restored);
    if (auto* s = st_.table.find(run.restored))
      s->content = {content_whose::known, who.credential, {}};
  }
  // An auxiliary call's or a sessionless request's output belongs to no session (invariant 7),
  // nor does a request without a conversation (an embedding) under a session's header.
  if (run.ran < 0 || who.session_id.empty() || !who.purpose.empty()) return std::nullopt;
  const std::string hash = st_.keys.key(who);
  if (hash.empty()) return std::nullopt;
  if (const session_record* r = st_.records.find(hash);
      r && !r->chain.empty() && (who.chain.empty() || (!follow && !continues(who, hash))))
    return std::nullopt;
  if (const int now_held = st_.table.slot_of(hash); now_held >= 0 && now_held != run.ran)
    st_.table.forget_slot(now_held);
  table_slot& sl = *st_.table.find(run.ran);
  sl.pending_hash = hash;
  sl.pending_aux = false;
  // A restore was counted when it was prepared (plan_runner).
  const bool kept = run.held == run.ran || run.restored == run.ran;
  sl.pending_kind = kept ? prepare_kind::resident : prepare_kind::cold;
  (void)outcomes.start_inference(who, run.ran);
  // The next task anywhere may clear this idle slot (docs/design.md §23): the session is
  // contended as in a one-slot pool, so the early checkpoint (§10) saves it soon after its
  // turn, before a sleep or a crash can take its last turn.
  return outcomes.end_inference(run.ran, true, now, turn_end, 1);
}

void placed_door::note_emptied(int slot) {
  if (!st_.table.owner(slot).empty()) st_.table.forget_emptied_slot(slot);
}

}  // namespace kvp::core
