// SPDX-License-Identifier: Apache-2.0
#pragma once
// The 1M-class trees and the Zipf(1.0) frequencies of the sharded-HS benchmarks (hs_shard_balance,
// hs_replan_drift), deterministic, so that both programs study the same problem.

#include <xsoftmax/tree/runtime_tree.hpp>

#include <vector>

namespace hs_shard_bench {

using xsoftmax::index_t;
using tree = xsoftmax::runtime_tree<>;

inline constexpr index_t classes = 1000000;

/// Zipf(1.0) frequency of each class by id: class c has weight 1 / (c + 1).
inline std::vector<double> zipf() {
  std::vector<double> f(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) f[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
  return f;
}

/// Uniform tree over `classes` with the given fan-outs (root first); leaves in id order
/// (`interleave` false: class c below node c / fan-out) or interleaved (class c below c % nodes).
inline tree uniform(const std::vector<index_t>& fan, bool interleave) {
  // Levels of internal nodes, bottom-up: `count[l]` nodes at depth l.
  const int depth = static_cast<int>(fan.size());
  std::vector<index_t> count(static_cast<std::size_t>(depth));
  count[0] = 1;
  for (int l = 1; l < depth; ++l) count[static_cast<std::size_t>(l)] = count[static_cast<std::size_t>(l - 1)] * fan[static_cast<std::size_t>(l - 1)];
  std::vector<index_t> first(static_cast<std::size_t>(depth));  // node id of the first node at depth l
  index_t next = classes;
  for (int l = depth - 1; l >= 0; --l) first[static_cast<std::size_t>(l)] = next, next += count[static_cast<std::size_t>(l)];
  std::vector<index_t> parent(static_cast<std::size_t>(next), -1);
  const index_t bottom = count[static_cast<std::size_t>(depth - 1)];
  for (index_t c = 0; c < classes; ++c)
    parent[static_cast<std::size_t>(c)] =
        first[static_cast<std::size_t>(depth - 1)] + (interleave ? c % bottom : c / fan[static_cast<std::size_t>(depth - 1)]);
  for (int l = 1; l < depth; ++l)
    for (index_t k = 0; k < count[static_cast<std::size_t>(l)]; ++k)
      parent[static_cast<std::size_t>(first[static_cast<std::size_t>(l)] + k)] =
          first[static_cast<std::size_t>(l - 1)] + k / fan[static_cast<std::size_t>(l - 1)];
  return tree::from_parents(parent, classes);
}

}  // namespace hs_shard_bench
