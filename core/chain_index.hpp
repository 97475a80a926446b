// Which saved snapshots share the longest start with a request's prefix chain
// (docs/design.md §3, "Seeding"), without reading manifests: every link of every indexed
// chain maps to the sessions whose chain holds it. A link names its whole prefix (it hashes
// the link before it), so the longest match is the last link of the request's chain that the
// index knows: at most one lookup per link.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/manifest.hpp"
#include "core/prefix_chain.hpp"

namespace kvp::core {

class chain_index {
 public:
  // Indexes `chain` (its first max_chain_links links) as session `hash`'s, replacing what it had.
  void put(const std::string& hash, const std::vector<chain_link>& chain);
  void erase(const std::string& hash);

  struct match {
    std::string hash;
    std::size_t common = 0;  // links shared with the request's chain
  };
  // The session sharing the most links with `chain` among those `accept` takes, or nullopt
  // when none shares at least `min_common`. Among equals, the one indexed last.
  std::optional<match> longest(const std::vector<chain_link>& chain, std::size_t min_common,
                               const std::function<bool(const std::string&)>& accept) const;

  // The sessions `accept` takes among those sharing the most links with `chain` (at least
  // `min_common`); empty when none does. What seeding chooses the smallest from
  // (core/prefix_snapshot.hpp): first every one whose chain ends at that link (a prefix
  // snapshot, or a session that holds nothing more), then at most `max_others` of the rest,
  // the one indexed last first, so that 10,000 snapshots sharing a preamble cost 64 checks.
  static constexpr std::size_t default_max_others = 64;
  std::vector<match> all_longest(const std::vector<chain_link>& chain, std::size_t min_common,
                                 const std::function<bool(const std::string&)>& accept,
                                 std::size_t max_others = default_max_others) const;

  std::size_t sessions() const { return chains_.size(); }

 private:
  struct link_hash {
    std::size_t operator()(const chain_link& l) const noexcept;
  };
  std::unordered_map<std::string, std::vector<chain_link>> chains_;  // session -> its links
  std::unordered_map<chain_link, std::vector<std::string>, link_hash> holders_;
  // link -> the sessions whose indexed chain ends there
  std::unordered_map<chain_link, std::vector<std::string>, link_hash> enders_;
  static void remove_from(std::unordered_map<chain_link, std::vector<std::string>, link_hash>& m,
                          const chain_link& l, const std::string& hash);
};

}  // namespace kvp::core
