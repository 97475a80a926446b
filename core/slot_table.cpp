#include "core/slot_table.hpp"

#include <algorithm>

namespace kvp::core {

std::string_view to_string(slot_state s) {
  switch (s) {
    case slot_state::unknown: return "unknown";
    case slot_state::idle: return "idle";
    case slot_state::saving: return "saving";
    case slot_state::restoring: return "restoring";
    case slot_state::ready: return "ready";
    case slot_state::inference: return "inference";
    case slot_state::dirty: return "dirty";
  }
  return "unknown";
}

std::string_view to_string(prepare_kind k) {
  switch (k) {
    case prepare_kind::none: return "none";
    case prepare_kind::resident: return "resident";
    case prepare_kind::cold: return "cold";
    case prepare_kind::restored: return "restored";
    case prepare_kind::cold_fallback: return "cold_fallback";
    case prepare_kind::auxiliary: return "auxiliary";
  }
  return "none";
}

namespace {

table_slot new_table_slot(int id) {
  table_slot s;
  s.id = id;
  return s;
}

// What may be in a slot after kvpersist lost sight of it: known content stays its
// credential's; an empty slot is unknown, of nobody known.
slot_content unknown_since(const slot_content& c) {
  switch (c.whose) {
    case content_whose::known: return {content_whose::unknown, c.credential, {}, true};
    case content_whose::unknown: return c;
    case content_whose::empty: break;
  }
  return {};
}

}  // namespace

slot_table::slot_table(int first_id, bool reserve_aux) : reserve_aux_(reserve_aux) {
  slots_.push_back(new_table_slot(first_id));
}

void slot_table::set_ids(const std::vector<int>& ids) {
  if (ids.empty()) return;
  bool same = ids.size() == slots_.size();
  for (std::size_t i = 0; same && i < ids.size(); ++i) same = slots_[i].id == ids[i];
  if (same) return;
  slots_.clear();
  for (int id : ids) slots_.push_back(new_table_slot(id));
}

std::vector<int> slot_table::ids() const {
  std::vector<int> out;
  for (const auto& s : slots_) out.push_back(s.id);
  return out;
}

int slot_table::aux_slot() const {
  return reserve_aux_ && slots_.size() > 1 ? slots_.back().id : -1;
}

std::size_t slot_table::session_slots() const {
  std::size_t n = slots_.size();
  if (aux_slot() >= 0 && n > 1) --n;
  return n;
}

table_slot* slot_table::find(int id) {
  for (auto& s : slots_)
    if (s.id == id) return &s;
  return nullptr;
}

const table_slot* slot_table::find(int id) const {
  for (const auto& s : slots_)
    if (s.id == id) return &s;
  return nullptr;
}

const std::string& slot_table::owner(int id) const {
  static const std::string none;
  const auto* s = find(id);
  return s ? s->owner : none;
}

slot_state slot_table::state(int id) const {
  const auto* s = find(id);
  return s ? s->state : slot_state::unknown;
}

const slot_content& slot_table::content(int id) const {
  static const slot_content none;
  const auto* s = find(id);
  return s ? s->content : none;
}

int slot_table::slot_of(const std::string& hash) const {
  if (hash.empty()) return -1;
  for (const auto& s : slots_)
    if (s.owner == hash) return s.id;
  return -1;
}

bool slot_table::in_use(const std::string& hash) const {
  return std::any_of(slots_.begin(), slots_.end(), [&](const table_slot& s) {
    return s.owner == hash || s.pending_hash == hash;
  });
}

std::optional<steady_time> slot_table::idle_deadline() const {
  std::optional<steady_time> out;
  for (const auto& s : slots_)
    if (s.idle_deadline && (!out || *s.idle_deadline < *out)) out = s.idle_deadline;
  return out;
}

void slot_table::forget_slot(int id) {
  if (auto* s = find(id)) {
    s->owner.clear();
    s->state = slot_state::unknown;
    s->idle_deadline.reset();
    s->content = {};
  }
}

void slot_table::forget_emptied_slot(int id) {
  forget_slot(id);
  if (auto* s = find(id)) s->content = {content_whose::empty, {}, {}};
}

void slot_table::on_epoch_change() {
  for (auto& s : slots_) {
    s.owner.clear();
    s.state = slot_state::unknown;
    s.idle_deadline.reset();
    s.content = {content_whose::empty, {}, {}};  // a new process holds nothing
  }
}

void slot_table::on_unreachable() {
  for (auto& s : slots_) {
    s.owner.clear();
    s.state = slot_state::unknown;
    s.idle_deadline.reset();
    s.content = unknown_since(s.content);
  }
}

void slot_table::on_server_erased() {
  for (auto& s : slots_) s.content = {content_whose::empty, {}, {}};
}

void slot_table::clear_contents() {
  for (auto& s : slots_) s.content = {};
}

}  // namespace kvp::core
