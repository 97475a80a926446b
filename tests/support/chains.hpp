// Prefix chains for unit tests (core/prefix_chain.hpp): link i of chain({t0, t1, ...}) is a
// function of t0..ti and of i, so chains built from the same leading tags share exactly those
// links, as the chained hashes of prefix_chain_of do.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/prefix_chain.hpp"

namespace kvp::testing {

inline std::vector<kvp::core::chain_link> chain(std::initializer_list<int> tags) {
  std::vector<kvp::core::chain_link> out;
  std::uint32_t acc = 7;
  for (int t : tags) {
    acc = acc * 131 + static_cast<std::uint32_t>(t);
    kvp::core::chain_link l{};
    for (int i = 0; i < 4; ++i) l[i] = static_cast<std::uint8_t>(acc >> (8 * i));
    l[4] = static_cast<std::uint8_t>(out.size());
    out.push_back(l);
  }
  return out;
}

}  // namespace kvp::testing
