// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hs_shard_plan`'s construction: expected work per node (bottom-up over the breadth-first node
/// numbering, where children come after their parent), the frontier (cut depth, then hot-subtree
/// splits), the top tree and the subtrees rebuilt as parent arrays (children in the full tree's
/// child order, so each tree's row order follows the full tree's), the row maps read off matching
/// paths, and the longest-processing-time assignment.

#include <cmath>
#include <utility>
#include <vector>

namespace xsoftmax {

template <int MaxDepth, class NodeForm>
hs_shard_plan<MaxDepth, NodeForm>::hs_shard_plan(const tree_type& tree, int ranks, hs_shard_options o)
    : ranks_(ranks) {
  using std::size_t;
  constexpr const char* who = "hs_shard_plan: ";
  const index_t n = tree.num_classes();
  detail::expects(ranks >= 1, who, "ranks = ", ranks, " must be >= 1");
  detail::expects(n >= 1, who, "the tree is empty (default-constructed)");
  detail::expects(o.cut_depth >= 1, who, "cut_depth = ", o.cut_depth, " must be >= 1 (the root has depth 0)");
  detail::expects(o.split_above >= 0 && std::isfinite(o.split_above), who, "split_above = ", o.split_above,
                  " must be finite and >= 0");
  detail::expects<shape_error>(o.class_frequency.empty() || static_cast<index_t>(o.class_frequency.size()) == n,
                               who, "class_frequency has ", o.class_frequency.size(), " entries but the tree has ", n,
                               " classes");
  detail::expects(o.keep_owner_slack >= 0 && std::isfinite(o.keep_owner_slack), who, "keep_owner_slack = ",
                  o.keep_owner_slack, " must be finite and >= 0");
  detail::expects<shape_error>(o.class_owner_hint.empty() || static_cast<index_t>(o.class_owner_hint.size()) == n,
                               who, "class_owner_hint has ", o.class_owner_hint.size(), " entries but the tree has ",
                               n, " classes");
  for (index_t c = 0; c < static_cast<index_t>(o.class_owner_hint.size()); ++c) {
    const int h = o.class_owner_hint[static_cast<size_t>(c)];
    detail::expects(h >= -1 && h < ranks, who, "class_owner_hint[", c, "] = ", h, " is neither -1 nor a rank in [0, ",
                    ranks, ")");
  }
  if constexpr (sigmoid_form)
    detail::expects<tree_error>(tree.is_binary(), who,
                                "the sigmoid node form needs a binary tree (every internal node two children)");
  std::vector<double> freq(static_cast<size_t>(n), 1.0);
  if (!o.class_frequency.empty()) freq = o.class_frequency;
  double mass_total = 0;
  for (index_t c = 0; c < n; ++c) {
    const double f = freq[static_cast<size_t>(c)];
    detail::expects<non_finite_error>(std::isfinite(f), who, "class_frequency[", c, "] = ", f, " is not finite");
    detail::expects(f >= 0, who, "class_frequency[", c, "] = ", f, " is negative");
    mass_total += f;
  }
  detail::expects(mass_total > 0, who, "class_frequency sums to 0");
  for (double& f : freq) f /= mass_total;

  // Expected work below every internal node k (its own softmax included).
  const auto& bo = tree.block_offsets();
  const auto& rc = tree.row_children();
  const index_t nodes = tree.num_internal_nodes();
  const auto unit = [&](index_t k) -> double {
    return sigmoid_form ? 1.0 : static_cast<double>(bo[static_cast<size_t>(k) + 1] - bo[static_cast<size_t>(k)]);
  };
  std::vector<int> depth(static_cast<size_t>(nodes), 0);
  for (index_t k = 0; k < nodes; ++k)
    for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r)
      if (rc[static_cast<size_t>(r)] >= 0) depth[static_cast<size_t>(rc[static_cast<size_t>(r)])] = depth[static_cast<size_t>(k)] + 1;
  std::vector<double> mass(static_cast<size_t>(nodes), 0.0), work(static_cast<size_t>(nodes), 0.0);
  for (index_t k = nodes - 1; k >= 0; --k) {
    double m = 0, below = 0;
    for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r) {
      const index_t code = rc[static_cast<size_t>(r)];
      if (code < 0) m += freq[static_cast<size_t>(detail::decode_leaf(code))];
      else m += mass[static_cast<size_t>(code)], below += work[static_cast<size_t>(code)];
    }
    mass[static_cast<size_t>(k)] = m;
    work[static_cast<size_t>(k)] = m * unit(k) + below;
  }

  // The frontier: the internal nodes at cut_depth, then the hot ones split.
  std::vector<char> frontier(static_cast<size_t>(nodes), 0);
  index_t top_nodes = 0, cut_nodes = 0;
  double routed_total = 0;
  std::priority_queue<std::pair<double, index_t>> heaviest;  // (work, -node): ties to the smaller node
  for (index_t k = 0; k < nodes; ++k) {
    if (depth[static_cast<size_t>(k)] < o.cut_depth) ++top_nodes;
    if (depth[static_cast<size_t>(k)] != o.cut_depth) continue;
    frontier[static_cast<size_t>(k)] = 1, ++cut_nodes;
    routed_total += work[static_cast<size_t>(k)];
    heaviest.push({work[static_cast<size_t>(k)], -k});
  }
  detail::expects(cut_nodes > 0, who, "cut_depth = ", o.cut_depth,
                  ": no internal node sits at that depth (the deepest internal nodes are at depth ", tree.height() - 1,
                  ")");
  // A split node joins the top tree: its internal children become subtrees, its leaves top leaves
  // (a subtree of leaves only is thus absorbed whole into the replicated top tree, where every
  // rank does its own rows' share of it).
  index_t frontier_size = cut_nodes;
  while (o.split_above > 0 && !heaviest.empty() && top_nodes < o.max_top_nodes) {
    const auto [w, minus_k] = heaviest.top();
    const index_t k = -minus_k;
    if (w <= o.split_above * routed_total / ranks) break;
    index_t internal_children = 0;
    for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r)
      internal_children += rc[static_cast<size_t>(r)] >= 0 ? 1 : 0;
    if (frontier_size - 1 + internal_children < ranks) break;  // a rank would be left without a subtree
    heaviest.pop();
    frontier_size += internal_children - 1;
    frontier[static_cast<size_t>(k)] = 0, ++top_nodes;
    routed_total -= w;
    for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r) {
      const index_t code = rc[static_cast<size_t>(r)];
      if (code < 0) continue;
      frontier[static_cast<size_t>(code)] = 1;
      routed_total += work[static_cast<size_t>(code)];
      heaviest.push({work[static_cast<size_t>(code)], -code});
    }
  }
  std::vector<index_t> roots, node_subtree(static_cast<size_t>(nodes), -1);
  for (index_t k = 0; k < nodes; ++k)
    if (frontier[static_cast<size_t>(k)]) node_subtree[static_cast<size_t>(k)] = static_cast<index_t>(roots.size()), roots.push_back(k);
  const index_t subtrees = static_cast<index_t>(roots.size());
  detail::expects(subtrees >= ranks, who, "cut_depth = ", o.cut_depth, " gives ", subtrees, " subtrees for ", ranks,
                  " ranks: a rank would own no subtree (cut deeper or use fewer ranks)");

  // The top tree, breadth-first from the root, stopping at frontier nodes and classes.
  class_top_.assign(static_cast<size_t>(n), -1);
  class_subtree_.assign(static_cast<size_t>(n), -1);
  class_local_.assign(static_cast<size_t>(n), -1);
  class_cost_.assign(static_cast<size_t>(n), 0);
  std::vector<index_t> top_representative, subtree_top(static_cast<size_t>(subtrees), -1);
  {
    std::vector<index_t> parent{-1}, leaf{-1};
    std::vector<std::pair<index_t, index_t>> queue{{0, 0}};  // (full node, top node)
    for (size_t h = 0; h < queue.size(); ++h) {
      const auto [k, v] = queue[h];
      for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r) {
        const index_t code = rc[static_cast<size_t>(r)], id = static_cast<index_t>(parent.size());
        parent.push_back(v);
        if (code >= 0 && !frontier[static_cast<size_t>(code)]) {
          leaf.push_back(-1);
          queue.push_back({code, id});
          continue;
        }
        const index_t j = static_cast<index_t>(top_representative.size());
        leaf.push_back(j);
        if (code < 0) {
          const index_t c = detail::decode_leaf(code);
          class_top_[static_cast<size_t>(c)] = j;
          top_representative.push_back(c);
          top_leaf_class_.push_back(c);
          top_leaf_subtree_.push_back(-1);
        } else {
          subtree_top[static_cast<size_t>(node_subtree[static_cast<size_t>(code)])] = j;
          top_representative.push_back(-1);  // filled below with the subtree's first class
          top_leaf_class_.push_back(-1);
          top_leaf_subtree_.push_back(node_subtree[static_cast<size_t>(code)]);
        }
      }
    }
    top_ = tree_type::from_parents(std::move(parent), std::move(leaf), static_cast<index_t>(top_representative.size()));
  }

  // Each subtree, breadth-first from its root; its row map read off matching paths.
  std::vector<std::vector<index_t>> sub_rows(static_cast<size_t>(subtrees));
  work_.resize(static_cast<size_t>(subtrees));
  for (index_t s = 0; s < subtrees; ++s) {
    const index_t root = roots[static_cast<size_t>(s)];
    const int cut = depth[static_cast<size_t>(root)];
    std::vector<index_t> parent{-1}, leaf{-1}, classes;
    std::vector<std::pair<index_t, index_t>> queue{{root, 0}};
    for (size_t h = 0; h < queue.size(); ++h) {
      const auto [k, v] = queue[h];
      for (index_t r = bo[static_cast<size_t>(k)]; r < bo[static_cast<size_t>(k) + 1]; ++r) {
        const index_t code = rc[static_cast<size_t>(r)], id = static_cast<index_t>(parent.size());
        parent.push_back(v);
        if (code >= 0) {
          leaf.push_back(-1);
          queue.push_back({code, id});
          continue;
        }
        const index_t c = detail::decode_leaf(code), j = static_cast<index_t>(classes.size());
        leaf.push_back(j);
        classes.push_back(c);
        class_top_[static_cast<size_t>(c)] = subtree_top[static_cast<size_t>(s)];
        class_subtree_[static_cast<size_t>(c)] = s;
        class_local_[static_cast<size_t>(c)] = j;
        index_t cost = 0;
        for (int l = cut; l < tree.depth(c); ++l) cost += sigmoid_form ? 1 : tree.step(c, l).block_size;
        class_cost_[static_cast<size_t>(c)] = cost;
      }
    }
    top_representative[static_cast<size_t>(subtree_top[static_cast<size_t>(s)])] = classes.front();
    subtree_classes_.push_back(classes);
    subtrees_.push_back(tree_type::from_parents(std::move(parent), std::move(leaf), static_cast<index_t>(classes.size())));
    const tree_type& sub = subtrees_.back();
    std::vector<index_t>& map = sub_rows[static_cast<size_t>(s)];
    map.assign(static_cast<size_t>(weight_rows(sub)), -1);
    for (index_t j = 0; j < sub.num_classes(); ++j)
      for (int l = 0; l < sub.depth(j); ++l)
        map[static_cast<size_t>(form_row(sub, j, l))] = form_row(tree, classes[static_cast<size_t>(j)], cut + l);
    work_[static_cast<size_t>(s)] = work[static_cast<size_t>(root)];
  }
  top_rows_.assign(static_cast<size_t>(weight_rows(top_)), -1);
  for (index_t j = 0; j < top_.num_classes(); ++j)
    for (int l = 0; l < top_.depth(j); ++l)
      top_rows_[static_cast<size_t>(form_row(top_, j, l))] = form_row(tree, top_representative[static_cast<size_t>(j)], l);

  // Longest processing time first: heaviest subtree to the least loaded rank (then the one with
  // fewer subtrees, so that every rank gets one even when works tie at 0; then the lower rank).
  // With owner hints, a subtree goes to its hinted rank (the one most of its classes name) instead
  // when that rank's load after taking it is within (1 + keep_owner_slack) x the least loaded
  // rank's after taking it, unless the remaining subtrees are needed for the ranks without one.
  std::vector<index_t> order(static_cast<size_t>(subtrees));
  std::iota(order.begin(), order.end(), index_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](index_t a, index_t b) { return work_[static_cast<size_t>(a)] > work_[static_cast<size_t>(b)]; });
  const std::vector<int> hinted =
      o.class_owner_hint.empty() ? std::vector<int>(static_cast<size_t>(subtrees), -1) : hinted_owners(o.class_owner_hint);
  owner_.assign(static_cast<size_t>(subtrees), 0);
  rank_work_.assign(static_cast<size_t>(ranks), 0.0);
  by_rank_.assign(static_cast<size_t>(ranks), {});
  index_t unplaced = subtrees, empty_ranks = ranks;
  for (index_t s : order) {
    int best = 0;
    for (int q = 1; q < ranks; ++q) {
      const auto qs = static_cast<size_t>(q), bs = static_cast<size_t>(best);
      if (rank_work_[qs] < rank_work_[bs] || (rank_work_[qs] == rank_work_[bs] && by_rank_[qs].size() < by_rank_[bs].size()))
        best = q;
    }
    const double w = work_[static_cast<size_t>(s)];
    const int h = hinted[static_cast<size_t>(s)];
    if (h >= 0 && h != best && unplaced > empty_ranks &&
        rank_work_[static_cast<size_t>(h)] + w <= (rank_work_[static_cast<size_t>(best)] + w) * (1 + o.keep_owner_slack))
      best = h;
    if (by_rank_[static_cast<size_t>(best)].empty()) --empty_ranks;
    --unplaced;
    owner_[static_cast<size_t>(s)] = best;
    rank_work_[static_cast<size_t>(best)] += w;
    by_rank_[static_cast<size_t>(best)].push_back(s);
  }
  row_offset_.assign(static_cast<size_t>(subtrees), 0);
  class_offset_.assign(static_cast<size_t>(subtrees), 0);
  local_rows_.assign(static_cast<size_t>(ranks), {});
  for (int q = 0; q < ranks; ++q) {
    auto& mine = by_rank_[static_cast<size_t>(q)];
    std::sort(mine.begin(), mine.end());
    auto& rows = local_rows_[static_cast<size_t>(q)];
    index_t forest_classes = 0;
    for (index_t s : mine) {
      class_offset_[static_cast<size_t>(s)] = forest_classes;
      forest_classes += subtrees_[static_cast<size_t>(s)].num_classes();
      row_offset_[static_cast<size_t>(s)] = static_cast<index_t>(rows.size());
      rows.insert(rows.end(), sub_rows[static_cast<size_t>(s)].begin(), sub_rows[static_cast<size_t>(s)].end());
    }
  }
}

template <int MaxDepth, class NodeForm>
std::vector<int> hs_shard_plan<MaxDepth, NodeForm>::hinted_owners(const std::vector<int>& class_owner_hint) const {
  std::vector<int> hinted(subtrees_.size(), -1);
  std::vector<int> hints;
  for (std::size_t s = 0; s < subtrees_.size(); ++s) {
    hints.clear();
    for (index_t c : subtree_classes_[s])
      if (class_owner_hint[static_cast<std::size_t>(c)] >= 0) hints.push_back(class_owner_hint[static_cast<std::size_t>(c)]);
    std::sort(hints.begin(), hints.end());
    std::size_t best_count = 0;
    for (std::size_t i = 0; i < hints.size();) {  // the most named rank; the lower one on a tie
      std::size_t j = i;
      while (j < hints.size() && hints[j] == hints[i]) ++j;
      if (j - i > best_count) best_count = j - i, hinted[s] = hints[i];
      i = j;
    }
  }
  return hinted;
}

}  // namespace xsoftmax
