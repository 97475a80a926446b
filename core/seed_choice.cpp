#include "core/seed_choice.hpp"

#include <algorithm>
#include <vector>

#include "core/prefix_snapshot.hpp"

namespace kvp::core {

bool reuses_foreign_prefix(std::string_view compatibility) {
  return compatibility != "experimental" && compatibility != "broken";
}

std::size_t seed_choice::shared_with_slot(const table_slot& sl, const request_identity& who) const {
  if (!rules_.allowed || sl.pending_aux || who.chain.empty() || sl.owner.empty() ||
      sl.owner == sl.pending_hash ||
      (sl.state != slot_state::ready && sl.state != slot_state::dirty))
    return 0;
  const session_record* owner = records_.find(sl.owner);
  if (!owner) return 0;
  if (!rules_.door.lets_run(sl.content, {who.credential, sl.pending_hash, false})) return 0;
  const std::size_t common = common_links(owner->chain, who.chain);
  return common >= who.min_shared_links ? common : 0;
}

std::optional<chain_index::match> seed_choice::best_seed(const request_identity& who,
                                                         const std::string& own,
                                                         std::size_t better_than) const {
  if (!rules_.allowed || who.chain.empty()) return std::nullopt;
  const auto matches = records_.index().all_longest(
      who.chain, std::max(who.min_shared_links, better_than + 1), [&](const std::string& h) {
        if (h == own) return false;
        const manifest* m = records_.find_manifest(h);
        return m && m->state == snapshot_state::ready &&
               m->runtime_fingerprint == rules_.fingerprint &&
               (!rules_.within_credential || m->credential == who.credential);
      });
  std::vector<seed_candidate> candidates;
  candidates.reserve(matches.size());
  for (const auto& m : matches)
    candidates.push_back({m.hash, m.common, records_.find_manifest(m.hash)->bytes});
  const auto best = fewest_bytes_seed(candidates);
  if (!best) return std::nullopt;
  return chain_index::match{best->hash, best->common};
}

}  // namespace kvp::core
