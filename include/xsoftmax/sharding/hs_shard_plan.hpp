// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hs_shard_plan`: how a hierarchical softmax over a `runtime_tree` is split across ranks. The
/// tree is cut along a *frontier* of internal nodes (at first every internal node at depth
/// `cut_depth`): the nodes above it form the *top tree*, replicated on every rank, whose leaves are
/// the frontier nodes and the classes shallower than the cut; each frontier node roots a *subtree*,
/// a standalone tree owned by one rank. Since a class's probability is the product of the softmaxes
/// on its path, log p(c | h) = log p_top(s(c) | h) + log p_sub(c | h, s(c)), s(c) being c's top
/// leaf (its subtree's root, or c itself when it sits above the cut).
///
/// Subtrees go to ranks by greedy longest-processing-time balancing of their *expected work*: the
/// class frequency mass times the path cost below the cut (per node, its number of children for
/// softmax nodes, 1 for sigmoid nodes). Optionally, frontier subtrees heavier than
/// `split_above` x the mean rank work are split (the frontier moves one level down below them, and
/// a subtree of leaves only moves into the replicated top tree) before assignment, which bounds
/// the imbalance that one hot subtree causes. The top tree's work is data-parallel (every rank
/// does it for its own rows), so it is balanced by construction and not counted as rank work.

#include <xsoftmax/error.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <queue>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

/// What `hs_shard_plan` is asked for.
struct hs_shard_options {
  /// Depth of the first frontier (the root has depth 0): >= 1, and some internal node must sit
  /// there. Classes at depth <= cut_depth are leaves of the top tree.
  int cut_depth = 1;
  /// Relative frequency of each class (any non-negative scale; N entries), or empty for uniform.
  std::vector<double> class_frequency;
  /// 0: no splitting. > 0: while the heaviest subtree's expected work exceeds `split_above` x the
  /// mean work per rank, replace it by its children (internal ones become subtrees, leaves join the
  /// top tree; a subtree of leaves only is absorbed whole into the replicated top tree), unless
  /// that would leave fewer subtrees than ranks. 1.0 aims at perfect balance.
  double split_above = 0.0;
  /// Splitting stops when the top tree would get more internal nodes than this (replicated memory).
  index_t max_top_nodes = 1 << 16;
  /// Empty, or N entries: the rank that holds each class's rows today (-1: none), e.g. a previous
  /// plan's `class_owners()`. In the longest-processing-time assignment, a subtree then stays on the
  /// rank most of its classes name when that rank's load after taking it is within
  /// (1 + keep_owner_slack) x the least loaded rank's after taking it (and every rank still gets a
  /// subtree). Re-planning with hints moves fewer rows (`reshard_rows_sent`) for a slightly worse
  /// balance.
  std::vector<int> class_owner_hint;
  /// How much more loaded than the least loaded rank a hinted rank may be to keep a subtree (>= 0).
  double keep_owner_slack = 0.05;
};

/// The sharding of a hierarchical softmax over `tree` across `ranks` ranks (see the file comment).
/// Immutable once built; every rank builds the same plan from the same arguments.
///
/// Weight rows (`hierarchical_softmax<runtime_tree<MaxDepth>, ..., NodeForm>::weight_rows`): the top
/// tree's rows are replicated; rank q's *local* rows are the rows of its subtrees, subtree by
/// subtree (ascending subtree id), each in its own tree's order. `top_rows()` and `local_rows(q)`
/// give the full tree's row of each.
template <int MaxDepth = 64, class NodeForm = softmax_nodes>
class hs_shard_plan {
 public:
  using tree_type = runtime_tree<MaxDepth>;
  using node_form = NodeForm;
  static constexpr bool sigmoid_form = std::is_same_v<NodeForm, sigmoid_nodes>;

  /// Throws `invalid_argument` when ranks < 1, cut_depth < 1, no internal node sits at depth
  /// cut_depth, split_above < 0, or there are fewer subtrees than ranks (a rank would own no
  /// subtree), a negative or non-finite keep_owner_slack, or a class_owner_hint entry that is
  /// neither -1 nor a rank; `shape_error` when `class_frequency` or `class_owner_hint` is neither
  /// empty nor N long; `non_finite_error`
  /// / `invalid_argument` for a non-finite / negative frequency; `tree_error` (from the node form)
  /// when the sigmoid form gets a non-binary tree.
  hs_shard_plan(const tree_type& tree, int ranks, hs_shard_options options = {});

  /// The number of ranks the plan was made for.
  [[nodiscard]] int ranks() const { return ranks_; }
  /// Classes of the full tree.
  [[nodiscard]] index_t num_classes() const { return static_cast<index_t>(class_subtree_.size()); }
  /// Subtrees below the frontier (>= ranks()).
  [[nodiscard]] index_t num_subtrees() const { return static_cast<index_t>(subtrees_.size()); }
  /// The replicated tree above the frontier; its classes are `top_class(c)`.
  [[nodiscard]] const tree_type& top_tree() const { return top_; }
  /// Subtree s's standalone tree; its classes are `local_class(c)` for the classes c below it.
  [[nodiscard]] const tree_type& subtree(index_t s) const { return subtrees_[static_cast<std::size_t>(s)]; }
  /// The rank that owns subtree s.
  [[nodiscard]] int owner(index_t s) const { return owner_[static_cast<std::size_t>(s)]; }
  /// Rank q's subtrees, ascending.
  [[nodiscard]] const std::vector<index_t>& subtrees_of(int q) const { return by_rank_[static_cast<std::size_t>(q)]; }
  /// Class c's leaf in the top tree (its subtree's, or its own when it sits above the cut).
  [[nodiscard]] index_t top_class(index_t c) const { return class_top_[static_cast<std::size_t>(c)]; }
  /// Class c's subtree, -1 when c is a leaf of the top tree.
  [[nodiscard]] index_t subtree_of(index_t c) const { return class_subtree_[static_cast<std::size_t>(c)]; }
  /// Class c's class id in its subtree, -1 when c is a leaf of the top tree.
  [[nodiscard]] index_t local_class(index_t c) const { return class_local_[static_cast<std::size_t>(c)]; }
  /// The subtree that top-tree class j stands for, -1 when j is a class of the full tree.
  [[nodiscard]] index_t top_leaf_subtree(index_t j) const { return top_leaf_subtree_[static_cast<std::size_t>(j)]; }
  /// The full tree's class that top-tree class j is, -1 when j stands for a subtree.
  [[nodiscard]] index_t top_leaf_class(index_t j) const { return top_leaf_class_[static_cast<std::size_t>(j)]; }
  /// The full tree's class of each of subtree s's classes (its local class ids, in order).
  [[nodiscard]] const std::vector<index_t>& subtree_classes(index_t s) const {
    return subtree_classes_[static_cast<std::size_t>(s)];
  }
  /// The cost of class c's path below the frontier (the work its row brings to the owner).
  [[nodiscard]] index_t routed_cost(index_t c) const { return class_cost_[static_cast<std::size_t>(c)]; }
  /// Expected work of subtree s (frequency mass x path cost below the frontier; frequencies
  /// normalised to sum 1).
  [[nodiscard]] double subtree_work(index_t s) const { return work_[static_cast<std::size_t>(s)]; }
  /// Expected work of rank q: the sum over its subtrees.
  [[nodiscard]] double rank_work(int q) const { return rank_work_[static_cast<std::size_t>(q)]; }
  /// Largest rank work / mean rank work under the class frequencies (1 = perfect balance).
  [[nodiscard]] double expected_imbalance() const { return max_over_mean(rank_work_); }

  /// Routed work of each rank for one global batch of targets (sum of `routed_cost` of the
  /// targets whose subtree it owns); targets outside [0, N) (ignored samples) count nothing.
  [[nodiscard]] std::vector<double> batch_work(const std::vector<index_t>& targets) const {
    std::vector<double> w(static_cast<std::size_t>(ranks_), 0.0);
    for (index_t t : targets) {
      if (t < 0 || t >= num_classes() || subtree_of(t) < 0) continue;
      w[static_cast<std::size_t>(owner(subtree_of(t)))] += static_cast<double>(routed_cost(t));
    }
    return w;
  }
  /// Slowest rank / mean rank of `batch_work(targets)` (1 when nothing is routed).
  [[nodiscard]] double imbalance(const std::vector<index_t>& targets) const { return max_over_mean(batch_work(targets)); }

  /// The rank that holds each class's subtree rows, -1 for classes of the top tree (a hint for the
  /// next plan: `hs_shard_options::class_owner_hint`).
  [[nodiscard]] std::vector<int> class_owners() const {
    std::vector<int> o(static_cast<std::size_t>(num_classes()), -1);
    for (index_t c = 0; c < num_classes(); ++c)
      if (subtree_of(c) >= 0) o[static_cast<std::size_t>(c)] = owner(subtree_of(c));
    return o;
  }

  /// Full-tree weight row of each top-tree weight row.
  [[nodiscard]] const std::vector<index_t>& top_rows() const { return top_rows_; }
  /// Full-tree weight row of each of rank q's local weight rows.
  [[nodiscard]] const std::vector<index_t>& local_rows(int q) const { return local_rows_[static_cast<std::size_t>(q)]; }
  /// First local weight row of subtree s on its owner.
  [[nodiscard]] index_t local_row_offset(index_t s) const { return row_offset_[static_cast<std::size_t>(s)]; }
  /// First class of subtree s in its owner's `local_forest` (subtree s's class j is its class
  /// local_class_offset(s) + j).
  [[nodiscard]] index_t local_class_offset(index_t s) const { return class_offset_[static_cast<std::size_t>(s)]; }
  /// Rank q's subtrees as one forest (`runtime_tree::forest`, subtrees ascending): a head over it
  /// has exactly rank q's local weight rows (`local_rows(q)`, in that order), and its classes are
  /// the subtrees' (`local_class_offset`), so one call scores rows of all of q's subtrees, each in
  /// its own subtree. Built on each call (O(size of q's subtrees)). Throws `out_of_range` unless
  /// 0 <= q < ranks().
  [[nodiscard]] tree_type local_forest(int q) const {
    detail::expects<out_of_range>(q >= 0 && q < ranks_, "hs_shard_plan::local_forest: q = ", q,
                                  " is not a rank in [0, ", ranks_, ")");
    std::vector<const tree_type*> trees;
    for (index_t s : subtrees_of(q)) trees.push_back(&subtree(s));
    return tree_type::forest(trees);
  }
  /// Weight rows a head over `t` needs under the plan's node form.
  [[nodiscard]] static index_t weight_rows(const tree_type& t) {
    return hierarchical_softmax<tree_type, fp32, serial, NodeForm>::weight_rows(t);
  }

 private:
  /// Each subtree's hinted rank: the one most of its classes name in `class_owner_hint` (-1: none).
  std::vector<int> hinted_owners(const std::vector<int>& class_owner_hint) const;
  static double max_over_mean(const std::vector<double>& w) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    if (!(total > 0)) return 1.0;
    return *std::max_element(w.begin(), w.end()) / (total / static_cast<double>(w.size()));
  }

  /// The weight row of `t`'s node form at `level` of class c's path.
  static index_t form_row(const tree_type& t, index_t c, int level) {
    if constexpr (sigmoid_form) return t.step(c, level).block_begin / 2;
    else return t.path_row(c, level);
  }

  int ranks_ = 1;
  tree_type top_;
  std::vector<tree_type> subtrees_;
  std::vector<int> owner_;
  std::vector<std::vector<index_t>> by_rank_;
  std::vector<index_t> class_top_, class_subtree_, class_local_, class_cost_;
  std::vector<index_t> top_leaf_subtree_, top_leaf_class_;
  std::vector<std::vector<index_t>> subtree_classes_;
  std::vector<double> work_, rank_work_;
  std::vector<index_t> top_rows_;
  std::vector<std::vector<index_t>> local_rows_;
  std::vector<index_t> row_offset_, class_offset_;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/sharding/hs_shard_plan.inl>
