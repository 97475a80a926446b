#include "core/retention.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace kvp::core {

retention_plan plan_retention(std::vector<retention_entry> entries, const retention_limits& limits,
                              std::int64_t now_s) {
  std::sort(entries.begin(), entries.end(), [](const retention_entry& a, const retention_entry& b) {
    if (a.invalid != b.invalid) return a.invalid;
    return a.updated_s != b.updated_s ? a.updated_s < b.updated_s : a.hash < b.hash;
  });
  retention_plan plan;
  plan.remaining_sessions = entries.size();
  for (const auto& e : entries) plan.remaining_bytes += e.bytes;
  const std::int64_t max_age_s = std::int64_t{limits.max_age_days} * 86400;
  for (const auto& e : entries) {
    if (e.in_use) continue;
    const bool too_old = limits.max_age_days > 0 && now_s - e.updated_s > max_age_s;
    const bool too_many = limits.max_sessions > 0 && plan.remaining_sessions > limits.max_sessions;
    const bool too_big = limits.max_total_bytes > 0 && plan.remaining_bytes > limits.max_total_bytes;
    if (!too_old && !too_many && !too_big) continue;
    plan.evict.push_back({e.hash, e.bytes, too_old ? "age" : too_many ? "sessions" : "bytes"});
    plan.remaining_bytes -= e.bytes;
    --plan.remaining_sessions;
  }
  return plan;
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
