#include "core/placed_door.hpp"

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

}  // namespace kvp::core
