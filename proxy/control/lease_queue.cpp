#include "proxy/control/lease_queue.hpp"

#include <algorithm>
#include <utility>

#include "core/log.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

std::string slot_name(const lease_ticket& t) {
  return t.slot < 0 ? std::string("all") : std::to_string(t.slot);
}

}  // namespace

lease_queue::lease_queue(std::size_t max_waiting, slot_chooser pool,
                         std::function<void(const ticket&)> wake)
    : max_waiting_(max_waiting), pool_(std::move(pool)), wake_(std::move(wake)) {}

bool lease_queue::enqueue(const ticket& t) {
  t->id = next_id_++;
  queue_.push_back(t);
  grant_waiting(t.get());
  if (!t->granted && queue_.size() > max_waiting_) {
    std::erase(queue_, t);
    if (t->runtime_change) runtime_change_pending_ = false;
    return false;
  }
  return true;
}

void lease_queue::enqueue_unbounded(const ticket& t) {
  t->id = next_id_++;
  queue_.push_back(t);
  grant_waiting(t.get());
}

bool lease_queue::settle(const ticket& t) {
  if (t->granted) return true;
  std::erase(queue_, t);
  if (t->runtime_change) runtime_change_pending_ = false;
  grant_waiting();  // an exclusive waiter leaving may unblock others
  return false;
}

bool lease_queue::admit_runtime_change(const ticket& t) {
  if (!t->runtime_change) return true;
  if (runtime_change_pending_) return false;
  runtime_change_pending_ = true;
  return true;
}

void lease_queue::begin_pass_through(const ticket& t) {
  t->pass_through = true;
  ++passing_through_;
}

bool lease_queue::end_pass_through(const ticket& t) {
  if (!std::exchange(t->pass_through, false)) return false;
  if (--passing_through_ > 0) return false;
  grant_waiting();  // leases asked for since persistence came back
  return true;
}

void lease_queue::release(const ticket& t) {
  std::erase_if(leased_, [&](const auto& kv) { return kv.second == t; });
  if (t->runtime_change) runtime_change_pending_ = false;
}

void lease_queue::hold_slot(int slot, const ticket& t) {
  t->slot = slot;
  leased_[slot] = t;
}

bool lease_queue::holds(const ticket& t) const {
  return std::any_of(leased_.begin(), leased_.end(),
                     [&](const auto& kv) { return kv.second == t; });
}

std::vector<int> lease_queue::free_slots() const {
  std::vector<int> out;
  for (int id : pool_.slot_ids())
    if (!leased_.contains(id)) out.push_back(id);
  return out;
}

// A session holding a lease (even one still preparing, not yet the slot's owner) must wait
// for it: its requests stay in order on one slot.
bool lease_queue::same_session_holds(const ticket& t) const {
  if (t->who.session_id.empty() || !t->who.purpose.empty()) return false;
  return std::any_of(leased_.begin(), leased_.end(), [&](const auto& kv) {
    return kv.second->who.session_id == t->who.session_id && kv.second->who.purpose.empty();
  });
}

bool lease_queue::try_grant(const ticket& t) {
  // A pass-through request may run on any slot: none is managed until it has finished.
  if (passing_through_ > 0) return false;
  // In managed mode a request llama-server cannot pin could land on any slot: it needs them all.
  // So does every request where llama-server places them all.
  if ((t->unpinnable && pool_.pins_requests()) || pool_.places_requests()) t->exclusive = true;
  if (t->exclusive) {
    if (!leased_.empty()) return false;
    for (int id : pool_.slot_ids()) leased_[id] = t;
    t->slot = -1;
  } else {
    if (same_session_holds(t)) return false;
    auto slot = pool_.choose_slot(t->who, free_slots());
    if (!slot) return false;
    leased_[*slot] = t;
    t->slot = *slot;
    t->pinned = pool_.pins_requests();
  }
  t->granted = true;
  log(log_level::debug, "kv.slot.acquire", {{"slot", slot_name(*t)}, {"ticket", std::to_string(t->id)}});
  return true;
}

void lease_queue::grant_waiting() { grant_waiting(nullptr); }

// FIFO, without letting a request overtake an earlier one of the same session or anything
// overtake an exclusive waiter.
void lease_queue::grant_waiting(const lease_ticket* quiet) {
  std::vector<std::string> blocked_sessions;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto t = *it;
    const std::string key = t->who.session_id.empty() || !t->who.purpose.empty()
                                ? std::string()
                                : pool_.session_key(t->who);
    const bool blocked = !key.empty() && std::find(blocked_sessions.begin(),
                                                   blocked_sessions.end(),
                                                   key) != blocked_sessions.end();
    if (!blocked && try_grant(t)) {
      it = queue_.erase(it);
      if (t.get() != quiet) wake_(t);
      continue;
    }
    if (t->exclusive) break;
    if (!key.empty()) blocked_sessions.push_back(key);
    ++it;
  }
}

}  // namespace kvp::proxy
