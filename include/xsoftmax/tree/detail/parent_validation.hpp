// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Validation of a tree given as a parent array (`parent[i]` = parent node of node `i`, -1 for the
/// root) plus a class per leaf. Every check runs before anything is built and throws `tree_error`
/// (or `shape_error` / `invalid_argument` for bad sizes) naming the argument and the offending
/// node. All passes are O(M) in the number of nodes and iterative, so deep or huge trees cannot
/// overflow the stack.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <cstddef>
#include <vector>

namespace xsoftmax::detail {

/// A parent array known to be one tree: a single root from which every node is reachable.
struct parent_topology {
  index_t root = -1;
  /// Children of node `v` are `children[child_offset[v], child_offset[v + 1])`, ascending by node
  /// index. `child_offset` has M + 1 entries, `children` M - 1.
  std::vector<index_t> child_offset;
  std::vector<index_t> children;
  /// All M nodes in breadth-first order, root first, each node's children in the order above.
  std::vector<index_t> bfs_order;

  [[nodiscard]] index_t num_nodes() const { return static_cast<index_t>(bfs_order.size()); }
  [[nodiscard]] index_t num_children(index_t v) const {
    return child_offset[static_cast<std::size_t>(v) + 1] -
           child_offset[static_cast<std::size_t>(v)];
  }
};

/// Checks that `parent` is a single tree and returns its topology. Throws `tree_error` for: no node
/// at all or no root, more than one root, a parent index outside [-1, M), a root without children,
/// a cycle, and a node that is not reachable from the root (an orphan hanging below a cycle).
/// `who` prefixes every message ("runtime_tree::from_parents: ").
[[nodiscard]] inline parent_topology validate_parent_structure(const std::vector<index_t>& parent,
                                                               const char* who) {
  const auto m = static_cast<index_t>(parent.size());
  expects<tree_error>(m >= 1, who,
                      "parent is empty: no root (a tree needs a root node whose parent "
                      "is -1)");
  parent_topology t;
  index_t root = -1;
  for (index_t i = 0; i < m; ++i) {
    const index_t p = parent[static_cast<std::size_t>(i)];
    expects<tree_error>(p >= -1 && p < m, who, "parent[", i, "] = ", p, " is out of range [-1, ", m,
                        ")");
    if (p == -1) {
      expects<tree_error>(root < 0, who, "more than one root: parent[", root, "] = parent[", i,
                          "] = -1");
      root = i;
    }
  }
  expects<tree_error>(root >= 0, who, "no root: no node has parent -1 (so parent has a cycle)");
  t.root = root;

  // Counting sort of nodes by parent; scanning nodes in index order keeps each node's children
  // ascending by index, which is the child order the contract promises.
  t.child_offset.assign(static_cast<std::size_t>(m) + 1, 0);
  for (index_t i = 0; i < m; ++i) {
    const index_t p = parent[static_cast<std::size_t>(i)];
    if (p >= 0) ++t.child_offset[static_cast<std::size_t>(p) + 1];
  }
  for (index_t v = 0; v < m; ++v) {
    t.child_offset[static_cast<std::size_t>(v) + 1] += t.child_offset[static_cast<std::size_t>(v)];
  }
  t.children.resize(static_cast<std::size_t>(m - 1));
  {
    std::vector<index_t> fill(t.child_offset.begin(), t.child_offset.end() - 1);
    for (index_t i = 0; i < m; ++i) {
      const index_t p = parent[static_cast<std::size_t>(i)];
      if (p >= 0) t.children[static_cast<std::size_t>(fill[static_cast<std::size_t>(p)]++)] = i;
    }
  }
  expects<tree_error>(t.num_children(root) > 0, who, "the root (node ", root,
                      ") is a leaf: the root must be an internal node with at least one child");

  // Breadth-first search from the root. A node reached twice is impossible (each node has one
  // parent), so the search visits every node at most once; nodes it misses sit below a cycle.
  t.bfs_order.reserve(static_cast<std::size_t>(m));
  t.bfs_order.push_back(root);
  for (std::size_t head = 0; head < t.bfs_order.size(); ++head) {
    const auto v = static_cast<std::size_t>(t.bfs_order[head]);
    for (index_t k = t.child_offset[v]; k < t.child_offset[v + 1]; ++k) {
      t.bfs_order.push_back(t.children[static_cast<std::size_t>(k)]);
    }
  }
  if (t.num_nodes() != m) {
    std::vector<char> reached(static_cast<std::size_t>(m), 0);
    for (index_t v : t.bfs_order) reached[static_cast<std::size_t>(v)] = 1;
    index_t orphan = 0;
    while (reached[static_cast<std::size_t>(orphan)]) ++orphan;
    // An unreached node's ancestors are all unreached (else it would be reached) and never end at
    // -1 (the only -1 is the root), so m steps up its parent chain land on a cycle.
    index_t on_cycle = orphan;
    for (index_t s = 0; s < m; ++s) on_cycle = parent[static_cast<std::size_t>(on_cycle)];
    bool orphan_on_cycle = false;
    index_t x = on_cycle;
    do {
      orphan_on_cycle = orphan_on_cycle || x == orphan;
      x = parent[static_cast<std::size_t>(x)];
    } while (x != on_cycle);
    expects<tree_error>(!orphan_on_cycle, who, "parent has a cycle through node ", orphan,
                        " (node ", orphan, " is its own ancestor)");
    expects<tree_error>(false, who, "node ", orphan,
                        " is an orphan: it is not reachable from the "
                        "root (node ",
                        t.root, "); its ancestors form a cycle through node ", on_cycle);
  }
  return t;
}

/// Checks the argument sizes before anything else, so that nothing is allocated for a size the
/// inputs cannot have: throws `invalid_argument` when `num_classes < 1`, `shape_error` when
/// `leaf_class.size() != parent.size()`, and `tree_error` when a non-empty `parent` has fewer
/// nodes than `num_classes` (every class is a leaf node of its own; an empty `parent` is left to
/// the structure check, which reports it as having no root).
inline void validate_parent_sizes(const std::vector<index_t>& parent,
                                  const std::vector<index_t>& leaf_class, index_t num_classes,
                                  const char* who) {
  expects(num_classes >= 1, who, "num_classes = ", num_classes, " must be >= 1");
  expects<shape_error>(leaf_class.size() == parent.size(), who,
                       "leaf_class.size() = ", leaf_class.size(),
                       " differs from parent.size() = ", parent.size());
  expects<tree_error>(parent.empty() || static_cast<std::size_t>(num_classes) <= parent.size(), who,
                      "num_classes = ", num_classes, " exceeds the ", parent.size(),
                      " nodes of parent: each class must be a leaf node of its own");
}

/// Checks the class of every node of a validated tree and returns, for each class, the node that
/// is its leaf (`num_classes` entries). Expects `validate_parent_sizes` to have passed. Throws
/// `tree_error` for: a class id outside [0, num_classes) (-1 marks internal nodes), an internal
/// node that carries a class, a leaf that is not a class, a class on two leaves, a class on no
/// leaf.
[[nodiscard]] inline std::vector<index_t> validate_leaf_classes(
    const parent_topology& t, const std::vector<index_t>& leaf_class, index_t num_classes,
    const char* who) {
  const index_t m = t.num_nodes();
  std::vector<index_t> leaf_node(static_cast<std::size_t>(num_classes), -1);
  index_t covered = 0;
  for (index_t v = 0; v < m; ++v) {
    const index_t c = leaf_class[static_cast<std::size_t>(v)];
    expects<tree_error>(c >= -1 && c < num_classes, who, "leaf_class[", v, "] = ", c,
                        " is out of range [0, num_classes = ", num_classes,
                        ") (-1 marks an internal node)");
    const bool internal = t.num_children(v) > 0;
    expects<tree_error>(!(internal && c >= 0), who, "internal node ", v, " (it has ",
                        t.num_children(v), " children) carries class ", c, " (leaf_class[", v,
                        "] = ", c, "); classes must be leaves");
    expects<tree_error>(internal || c >= 0, who, "node ", v,
                        " is a leaf that is not a class (leaf_class[", v, "] = -1)");
    if (c < 0) continue;
    index_t& owner = leaf_node[static_cast<std::size_t>(c)];
    expects<tree_error>(owner < 0, who, "class ", c, " is listed twice (duplicate): on nodes ",
                        owner, " and ", v);
    owner = v;
    ++covered;
  }
  if (covered != num_classes) {
    index_t missing = 0;
    while (leaf_node[static_cast<std::size_t>(missing)] >= 0) ++missing;
    expects<tree_error>(false, who, "class ", missing, " is missing: the tree covers ", covered,
                        " of num_classes = ", num_classes, " classes");
  }
  return leaf_node;
}

/// Depth (number of internal nodes above) of every node of a validated tree, saturated at
/// `max_depth + 1` so a degenerate chain cannot overflow. Throws `tree_error` naming the first
/// class whose depth exceeds `max_depth`, with its exact depth.
[[nodiscard]] inline std::vector<int> validate_depths(const parent_topology& t,
                                                      const std::vector<index_t>& parent,
                                                      const std::vector<index_t>& leaf_node,
                                                      int max_depth, const char* who) {
  std::vector<int> depth(static_cast<std::size_t>(t.num_nodes()), 0);
  for (index_t v : t.bfs_order) {
    const auto d = depth[static_cast<std::size_t>(v)];
    const auto vs = static_cast<std::size_t>(v);
    for (index_t k = t.child_offset[vs]; k < t.child_offset[vs + 1]; ++k) {
      depth[static_cast<std::size_t>(t.children[static_cast<std::size_t>(k)])] =
          d > max_depth ? d : d + 1;
    }
  }
  for (std::size_t c = 0; c < leaf_node.size(); ++c) {
    const index_t leaf = leaf_node[c];
    if (depth[static_cast<std::size_t>(leaf)] <= max_depth) continue;
    index_t exact = 0;
    for (index_t v = leaf; parent[static_cast<std::size_t>(v)] >= 0;
         v = parent[static_cast<std::size_t>(v)]) {
      ++exact;
    }
    expects<tree_error>(false, who, "class ", c, " (node ", leaf, ") has depth ", exact,
                        " > MaxDepth = ", max_depth,
                        "; use a larger MaxDepth template argument or a shallower tree");
  }
  return depth;
}

}  // namespace xsoftmax::detail
