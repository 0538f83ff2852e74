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
#include <xsoftmax/detail/primitives/batch_rows.hpp>

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
  // The search packs a weight row into 32 bits of its open-list keys (tree_search.hpp).
  detail::expects(tree_.num_rows() <= index_t(0xFFFFFFFF), "hierarchical_softmax::topk: the tree has ",
                  tree_.num_rows(), " weight rows; the search supports at most 2^32 - 1");
  // The search starts at the root's block: a forest has one per tree (and widest_block would
  // miss the other roots' blocks).
  if constexpr (detail::has_num_trees<Tree>::value)
    detail::expects(tree_.num_trees() <= 1, "hierarchical_softmax::topk: the tree is a forest of ",
                    tree_.num_trees(), " trees; search each tree on its own");
  const detail::execution<B> ex{resources_};
  // A sigmoid head's tree is binary (checked at construction: every node has 2 children), so its
  // widest block needs no walk over the tree's rows (1.7M instructions at N = 1e5: a quarter of a
  // top-1 call of 1024 rows, on the first call).
  if (widest_block_ == 0) widest_block_ = sigmoid_form ? 2 : detail::widest_block(tree_.view());
  const auto tv = detail::tree_access<B, Tree>::view(tree_, backend_cache_, resources_);
  const auto search = [&](matrix_view<const float> h) {
    detail::tree_topk<sigmoid_form>(ex, tv, h, matrix_view<const storage_type>(weights()), store_.bias(),
                                    widest_block_, k, options.beam_width, classes, log_probs);
  };
  // Contiguous fp32 rows are searched in place: packing would only copy them (about a tenth of an
  // exact top-1 call's instructions at d = 100, binary Huffman tree).
  if constexpr (std::is_same_v<H, float>)
    if (hidden.stride == hidden.cols) return search(hidden);
  search(detail::pack_rows(ex, hidden, {}, 0).hidden_view());
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
