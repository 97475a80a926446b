#include "core/behaviour.hpp"

#include <algorithm>

#include "core/identity.hpp"

namespace kvp::core {

bool same_behaviour(const behaviour_signature& a, const behaviour_signature& b) {
  if (a.top.empty() || b.top.empty()) return false;
  if (a.top.front() == b.top.front()) return true;
  std::size_t shared = 0;
  for (auto id : a.top) shared += std::count(b.top.begin(), b.top.end(), id) > 0 ? 1 : 0;
  return 2 * shared >= std::max(a.top.size(), b.top.size());
}

std::string behaviour_class_id(const behaviour_signature& s) {
  std::string in = "kvpersist-behaviour-v1;";
  for (auto id : s.top) in += std::to_string(id) + ",";
  return sha256_hex(in).substr(0, 16);
}

std::optional<std::string> match_behaviour(const std::vector<behaviour_signature>& known,
                                           const behaviour_signature& probe) {
  for (const auto& k : known)
    if (same_behaviour(k, probe)) return behaviour_class_id(k);
  return std::nullopt;
}

}  // namespace kvp::core
