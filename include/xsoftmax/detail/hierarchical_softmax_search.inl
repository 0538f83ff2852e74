// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax`'s evaluation on every backend: top-k by best-first (or beam) search over
/// the tree, and log-probabilities of a class range (the generic algorithms of
/// detail/hierarchical/tree_search.hpp). Included by hierarchical_softmax.inl.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/tree_access.hpp>
#include <xsoftmax/detail/hierarchical/range_log_probs.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>
#include <xsoftmax/detail/hierarchical/search_levels.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <type_traits>
#include <utility>

namespace xsoftmax {

namespace detail {
/// Whether `T` may be a forest (`runtime_tree::forest`): it then says how many trees it holds.
template <class T, class = void>
struct has_num_trees : std::false_type {};
template <class T>
struct has_num_trees<T, std::void_t<decltype(std::declval<const T&>().num_trees())>> : std::true_type {};
}  // namespace detail

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::topk_(matrix_view<const H> hidden, index_t k,
                                                matrix_view<index_t> classes, matrix_view<float> log_probs,
                                                search_options options) const {
  // hidden, k and the outputs were checked by head_verbs; the search options are this head's own.
  detail::expects(options.beam_width >= 0, "hierarchical_softmax::topk: beam_width = ", options.beam_width,
                  " must be >= 0");
  if (options.expansions.size != 0)
    detail::check_output("hierarchical_softmax::topk", "search_options::expansions", options.expansions, hidden.rows);
  // The search packs a weight row into 32 bits of its open-list keys (tree_search.hpp).
  detail::expects(tree_.num_rows() <= index_t(0xFFFFFFFF), "hierarchical_softmax::topk: the tree has ",
                  tree_.num_rows(), " weight rows; the search supports at most 2^32 - 1");
  // The search starts at the root's block: a forest has one per tree (and widest_block would
  // miss the other roots' blocks).
  if constexpr (detail::has_num_trees<Tree>::value)
    detail::expects(tree_.num_trees() <= 1, "hierarchical_softmax::topk: the tree is a forest of ",
                    tree_.num_trees(), " trees; search each tree on its own");
  const detail::execution<B> ex{resources_};
  const index_t widest = widest_search_block_();
  const auto tv = detail::tree_access<B, Tree>::view(tree_, backend_cache_, resources_);
  const auto search = [&](matrix_view<const float> h) {
    detail::tree_topk<sigmoid_form>(ex, tv, h, matrix_view<const storage_type>(weights()), store_.bias(),
                                    widest, k, options.beam_width, classes, log_probs, nullptr, nullptr,
                                    options.expansions.size != 0 ? options.expansions.data : nullptr);
  };
  // Contiguous fp32 rows are searched in place: packing would only copy them (about a tenth of an
  // exact top-1 call's instructions at d = 100, binary Huffman tree).
  if constexpr (std::is_same_v<H, float>)
    if (hidden.stride == hidden.cols) return search(hidden);
  search(detail::pack_rows(ex, hidden, {}, 0).hidden_view());
}

// A sigmoid head's tree is binary (checked at construction: every node has 2 children), so its
// widest block needs no walk over the tree's rows (1.7M instructions at N = 1e5: a quarter of a
// top-1 call of 1024 rows, on the first call). Otherwise every child block, and every root's block:
// a forest has one root per tree, and detail::widest_block sees the first only.
template <class Tree, class P, class B, class F>
index_t hierarchical_softmax<Tree, P, B, F>::widest_search_block_() const {
  if (widest_block_ != 0) return widest_block_;
  index_t widest = sigmoid_form ? 2 : detail::widest_block(tree_.view());
  if constexpr (detail::has_num_trees<Tree>::value) {
    const auto& bo = tree_.block_offsets();
    for (const index_t root : tree_.root_nodes())
      widest = std::max(widest, bo[static_cast<std::size_t>(root) + 1] - bo[static_cast<std::size_t>(root)]);
  }
  return widest_block_ = widest;
}

template <class Tree, class P, class B, class F>
void hierarchical_softmax<Tree, P, B, F>::topk_in_trees(matrix_view<const float> hidden,
                                                        vector_view<const index_t> trees, index_t k,
                                                        matrix_view<index_t> classes,
                                                        matrix_view<float> log_probs) const {
  static_assert(detail::has_num_trees<Tree>::value,
                "xsoftmax: hierarchical_softmax::topk_in_trees needs a runtime_tree (a forest of trees)");
  constexpr const char* where = "hierarchical_softmax::topk_in_trees";
  const detail::execution<B> ex{resources_};
  const index_t rows = hidden.rows;
  detail::check_hidden(ex, where, hidden, dim());
  detail::expects(k >= 1, where, ": k = ", k, " must be >= 1");
  detail::expects<shape_error>(trees.size == rows && (trees.data != nullptr || rows == 0), where, ": trees has ",
                               trees.size, " entries but hidden has ", rows, " rows");
  detail::expects<shape_error>(classes.rows == rows && classes.cols == k && log_probs.rows == rows &&
                                   log_probs.cols == k,
                               where, ": classes is ", classes.rows, " x ", classes.cols, " and log_probs ",
                               log_probs.rows, " x ", log_probs.cols, " but hidden has ", rows, " rows and k = ", k);
  detail::expects(tree_.num_rows() <= index_t(0xFFFFFFFF), where, ": the tree has ", tree_.num_rows(),
                  " weight rows; the search supports at most 2^32 - 1");
  if (rows == 0) return;
  // Each row's search starts at its tree's root block (host arithmetic on B tree indices).
  std::vector<index_t> tree_of(static_cast<std::size_t>(rows)), begin(tree_of.size()), size(tree_of.size());
  detail::backend_ops<B>::copy(resources_, tree_of.data(), trees.data, rows);
  detail::backend_ops<B>::synchronize(resources_);
  const auto& roots = tree_.root_nodes();
  const auto& bo = tree_.block_offsets();
  for (index_t r = 0; r < rows; ++r) {
    const index_t t = tree_of[static_cast<std::size_t>(r)];
    detail::expects<out_of_range>(t >= 0 && t < tree_.num_trees(), where, ": trees[", r, "] = ", t,
                                  " is out of range [0, ", tree_.num_trees(), ")");
    const auto root = static_cast<std::size_t>(roots[static_cast<std::size_t>(t)]);
    begin[static_cast<std::size_t>(r)] = bo[root];
    size[static_cast<std::size_t>(r)] = bo[root + 1] - bo[root];
  }
  const index_t widest = widest_search_block_();
  const backend_vector<B, index_t> begin_d(begin.begin(), begin.end()), size_d(size.begin(), size.end());
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    for (index_t e = 0; e < k; ++e) classes(r, e) = -1, log_probs(r, e) = -INFINITY;
  });
  const auto tv = detail::tree_access<B, Tree>::view(tree_, backend_cache_, resources_);
  const auto search = [&](matrix_view<const float> h) {
    detail::tree_topk<sigmoid_form>(ex, tv, h, matrix_view<const storage_type>(weights()), store_.bias(), widest, k,
                                    0, classes, log_probs, thrust::raw_pointer_cast(begin_d.data()),
                                    thrust::raw_pointer_cast(size_d.data()));
  };
  if (hidden.stride == hidden.cols) search(hidden);
  else search(detail::pack_rows(ex, hidden, {}, 0).hidden_view());
  detail::backend_ops<B>::synchronize(resources_);
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::log_distribution_(matrix_view<const H> hidden, index_t class_begin,
                                                            index_t class_end, matrix_view<float> out) const {
  log_distribution_async_(hidden, class_begin, class_end, out);  // inputs were checked by head_verbs
  detail::backend_ops<B>::synchronize(resources_);
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::log_distribution_async_(matrix_view<const H> hidden, index_t class_begin,
                                                                  index_t class_end, matrix_view<float> out) const {
  const detail::execution<B> ex{resources_};
  const auto run = [&](matrix_view<const float> h) {
    detail::tree_log_distribution<sigmoid_form>(ex, tree_.view(), h, matrix_view<const storage_type>(weights()),
                                                store_.bias(), class_begin, class_end, out);
  };
  if constexpr (std::is_same_v<H, float>)
    if (hidden.stride == hidden.cols) return run(hidden);  // as topk_: no copy of contiguous fp32 rows
  run(detail::pack_rows(ex, hidden, {}, 0).hidden_view());
}

}  // namespace xsoftmax
