// Prefix snapshots (docs/design.md §3, "Prefix snapshots"): a snapshot of the preamble that
// several sessions share, so that a seed reads about the bytes of the prefix it reuses rather
// than a whole donor conversation. Pure decisions: which snapshot a seed restores, when a
// prefix snapshot is worth making, and what the proxy is asked to make. The proxy carries
// them out (restore the donor, the cut request, the save) off the request path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/prefix_chain.hpp"

namespace kvp::core {

// A ready snapshot that may seed a request: the links it shares with the request's chain and
// the bytes a restore of it reads (n_written at save time).
struct seed_candidate {
  std::string hash;
  std::size_t common = 0;
  std::uint64_t bytes = 0;
};

// The seed to restore: among the candidates that share the most links, the one that reads the
// fewest bytes for them. Ties keep the earlier candidate (the order `candidates` gives).
std::optional<seed_candidate> fewest_bytes_seed(const std::vector<seed_candidate>& candidates);

// A seed is worth a prefix snapshot when llama-server reused (timings.cache_n) less than this
// share of the tokens the restore loaded: the rest of the donor was read for nothing.
inline constexpr double prefix_worth_below = 0.8;
bool worth_prefix_snapshot(std::uint64_t restored_tokens, std::uint64_t reused_tokens);

// The session id of the prefix snapshot of the chain ending in `last`: "prefix:" and its 32
// hex digits. Scoped by the donor's credential like any session id (slot_pool::hash_for).
std::string prefix_session_id(const chain_link& last);
bool is_prefix_session(std::string_view session_id);

// What a wish is known by: the credential and the last shared link.
std::string prefix_key(std::string_view credential, const chain_link& last);

// A prefix snapshot to make: restore `donor`'s snapshot, send the seeded request cut after
// its first `links.size()` links (the proxy keeps that body, bounded like a chained one),
// save the slot as prefix_session_id(links.back()) under `credential`.
struct prefix_wish {
  std::string credential;          // credential_key() of the donor and of the seeded request
  std::string donor;               // the donor snapshot's session hash
  std::uint64_t donor_tokens = 0;  // what its manifest says a restore loads
  std::vector<chain_link> links;   // the shared links, the prefix snapshot's chain
};

// Which prefix snapshots are wanted, once per (credential, last shared link): a few pending,
// oldest first, and the keys already asked for or made (bounded; the oldest are forgotten, so
// a forgotten key can be asked for once more, which costs one redundant snapshot at most).
class prefix_wishes {
 public:
  static constexpr std::size_t default_max_pending = 8;
  static constexpr std::size_t default_max_known = 4096;
  explicit prefix_wishes(std::size_t max_pending = default_max_pending,
                         std::size_t max_known = default_max_known);

  // What a seed's reply said: `donor` (whose snapshot had `donor_links` links, `restored`
  // tokens) was restored for a request whose chain shares `common` links with it, and
  // llama-server reused `reused` tokens. Adds a wish and returns true when that is worth a
  // prefix snapshot not asked for yet; a donor that is itself exactly the prefix never is.
  bool note_seed(const std::string& credential, const std::string& donor, std::size_t donor_links,
                 std::uint64_t restored, std::uint64_t reused,
                 const std::vector<chain_link>& request_chain, std::size_t common);
  // A prefix snapshot that exists (read from its manifest at startup, or just made).
  void note_made(const std::string& credential, const chain_link& last);

  bool empty() const { return pending_.empty(); }
  std::size_t pending() const { return pending_.size(); }
  // The oldest wish, removed: the proxy makes it, or drops it (no retry: the key stays known).
  std::optional<prefix_wish> take();
  // The donor was forgotten or invalidated: its wishes cannot be made, and since nothing was
  // tried, a later seed may ask for them again.
  void drop_donor(const std::string& donor);

 private:
  bool known(const std::string& key) const;
  void remember(std::string key);
  void forget(const std::string& key);

  std::size_t max_pending_;
  std::size_t max_known_;
  std::vector<prefix_wish> pending_;
  std::unordered_set<std::string> known_;
  std::deque<std::string> known_order_;  // oldest first, to forget beyond max_known_
};

}  // namespace kvp::core
