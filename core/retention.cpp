#include "core/retention.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <set>
#include <utility>

namespace kvp::core {

namespace {

bool evicts_before(const retention_entry& a, const retention_entry& b) {
  if (a.invalid != b.invalid) return a.invalid;
  return a.updated_s != b.updated_s ? a.updated_s < b.updated_s : a.hash < b.hash;
}

// `budget` less `room`, still a limit (at least 1 byte); 0 (no limit) stays 0.
std::uint64_t budget_less_room(std::uint64_t budget, std::uint64_t room) {
  if (budget == 0) return 0;
  return budget - std::min(budget - 1, room);
}

// One credential's sessions while a plan is made.
struct tenant {
  std::size_t sessions = 0;  // not yet evicted, in use or not
  std::uint64_t bytes = 0;
  std::uint64_t room = 0;    // its largest last_file_bytes among the entries not too old
  std::deque<const retention_entry*> evictable;  // not in use, in eviction order
};

// A tenant with something to evict, as a budget ranks it: an invalid candidate first (the
// oldest first), then the tenant holding the most, then the older candidate. Candidates'
// hashes are unique, so the order is total and a rank names one tenant.
struct tenant_rank {
  bool invalid = false;
  std::uint64_t held = 0;
  const retention_entry* next = nullptr;
  tenant* owner = nullptr;
};

struct rank_order {
  bool operator()(const tenant_rank& a, const tenant_rank& b) const {
    if (a.invalid != b.invalid) return a.invalid;
    if (!a.invalid && a.held != b.held) return a.held > b.held;
    return evicts_before(*a.next, *b.next);
  }
};

class retention_planner {
 public:
  retention_planner(std::vector<retention_entry> entries, const retention_limits& limits,
                    retention_room room)
      : entries_(std::move(entries)), limits_(limits), room_(std::move(room)) {
    std::sort(entries_.begin(), entries_.end(), evicts_before);
    plan_.remaining_sessions = entries_.size();
    for (const auto& e : entries_) plan_.remaining_bytes += e.bytes;
  }

  retention_plan run(std::int64_t now_s) {
    forget_old(now_s);
    keep_room_for_the_saver();
    cap_credentials();
    for (auto& [credential, t] : tenants_) rank(t);
    meet_budgets();
    return std::move(plan_);
  }

 private:
  bool over_sessions() const {
    return limits_.max_sessions > 0 && plan_.remaining_sessions > limits_.max_sessions;
  }
  bool over_bytes() const {
    return max_total_bytes_ > 0 && plan_.remaining_bytes > max_total_bytes_;
  }

  // Evicts what is too old; everything else joins its credential's tenant.
  void forget_old(std::int64_t now_s) {
    const std::int64_t max_age_s = std::int64_t{limits_.max_age_days} * 86400;
    for (const auto& e : entries_) {
      if (!e.in_use && limits_.max_age_days > 0 && now_s - e.updated_s > max_age_s) {
        evict(e, "age");
        continue;
      }
      auto& t = tenants_[e.credential];
      ++t.sessions;
      t.bytes += e.bytes;
      t.room = std::max(t.room, e.last_file_bytes);
      if (!e.in_use) t.evictable.push_back(&e);
    }
  }

  // The whole byte budget less the saver's room (none when no save is named).
  void keep_room_for_the_saver() {
    std::uint64_t room = 0;
    if (room_.saver)
      if (const auto it = tenants_.find(*room_.saver); it != tenants_.end()) room = it->second.room;
    max_total_bytes_ = budget_less_room(limits_.max_total_bytes, room);
  }

  bool over_credential_caps(const tenant& t) const {
    const auto sessions = limits_.max_sessions_per_credential;
    const auto bytes = budget_less_room(limits_.max_bytes_per_credential,
                                        room_.per_credential ? t.room : 0);
    return (sessions > 0 && t.sessions > sessions) || (bytes > 0 && t.bytes > bytes);
  }

  void cap_credentials() {
    for (auto& [credential, t] : tenants_)
      while (over_credential_caps(t) && !t.evictable.empty()) evict_next(t, "credential");
  }

  void meet_budgets() {
    for (;;) {
      const bool sessions = over_sessions();
      if (!sessions && !over_bytes()) return;
      const auto& ranking = sessions ? by_sessions_ : by_bytes_;
      if (ranking.empty()) return;
      tenant& t = *ranking.begin()->owner;
      unrank(t);
      evict_next(t, sessions ? "sessions" : "bytes");
      rank(t);
    }
  }

  void rank(tenant& t) {
    if (t.evictable.empty()) return;
    const auto* next = t.evictable.front();
    by_sessions_.insert({next->invalid, t.sessions, next, &t});
    by_bytes_.insert({next->invalid, t.bytes, next, &t});
  }
  void unrank(tenant& t) {
    const auto* next = t.evictable.front();
    by_sessions_.erase({next->invalid, t.sessions, next, &t});
    by_bytes_.erase({next->invalid, t.bytes, next, &t});
  }

  void evict_next(tenant& t, std::string_view why) {
    const retention_entry& e = *t.evictable.front();
    t.evictable.pop_front();
    --t.sessions;
    t.bytes -= e.bytes;
    evict(e, why);
  }
  void evict(const retention_entry& e, std::string_view why) {
    plan_.evict.push_back({e.hash, e.bytes, why});
    plan_.remaining_bytes -= e.bytes;
    --plan_.remaining_sessions;
  }

  std::vector<retention_entry> entries_;
  retention_limits limits_;
  retention_room room_;
  std::uint64_t max_total_bytes_ = 0;  // limits_.max_total_bytes less the saver's room
  std::map<std::string, tenant> tenants_;
  std::set<tenant_rank, rank_order> by_sessions_;
  std::set<tenant_rank, rank_order> by_bytes_;
  retention_plan plan_;
};

}  // namespace

retention_plan plan_retention(std::vector<retention_entry> entries, const retention_limits& limits,
                              std::int64_t now_s, const retention_room& room) {
  return retention_planner(std::move(entries), limits, room).run(now_s);
}

std::int64_t parse_utc(std::string_view s) {
  std::tm tm{};
  const std::string text(s);
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<std::int64_t>(timegm(&tm));
}

}  // namespace kvp::core
