// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax`'s evaluation: top-k by best-first (or beam) search over the tree, and
/// log-probabilities of a class range (host backends; the cuda backend's are in
/// detail/cuda/hs_search.cuh). Included by hierarchical_softmax.inl.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

namespace xsoftmax {

template <class Tree, class P, class B, class F>
void hierarchical_softmax<Tree, P, B, F>::child_log_probs(const float* h, index_t block_begin,
                                                          index_t block_size, float* out) const {
  const auto w = matrix_view<const storage_type>(weights());
  if constexpr (sigmoid_form) {
    float s;
    detail::gather_dot(h, w, store_.bias(), block_begin / 2, 1, &s);
    out[0] = -detail::softplus(-s);
    out[1] = -detail::softplus(s);
  } else {
    detail::gather_dot(h, w, store_.bias(), block_begin, block_size, out);
    const float lse = detail::row_logsumexp(out, block_size);
    for (index_t j = 0; j < block_size; ++j) out[j] -= lse;
  }
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::topk_(matrix_view<const H> hidden, index_t k,
                                                matrix_view<index_t> classes, matrix_view<float> log_probs,
                                                search_options options) const {
  if constexpr (!is_host_backend<B>) {
    detail::device_heads<B>::hs_topk(*this, hidden, k, classes, log_probs, options);
  } else {
    topk_host(hidden, k, classes, log_probs, options);
  }
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::topk_host(matrix_view<const H> hidden, index_t k,
                                                    matrix_view<index_t> classes, matrix_view<float> log_probs,
                                                    search_options options) const {
  const char* where = "hierarchical_softmax::topk";
  const auto policy = backend_traits<B>::policy(resources_);
  // hidden, k and the outputs were checked by head_verbs; the search options are this head's own.
  detail::expects(options.beam_width >= 0, where, ": beam_width = ", options.beam_width, " must be >= 0");
  const detail::batch_rows<B> batch = detail::pack_rows(detail::execution<B>{resources_}, hidden, {}, 0);
  const auto tv = tree_.view();
  const index_t d = dim(), beam = options.beam_width;
  const float* hs = batch.hidden.data();
  detail::parallel_for(policy, batch.rows, [=](index_t r) {
    // Open nodes as a max-heap on log-probability (ties: smaller row first, for determinism).
    struct open_node {
      float log_prob;
      index_t row;
      bool operator<(const open_node& o) const { return log_prob < o.log_prob || (log_prob == o.log_prob && row > o.row); }
    };
    std::vector<open_node> heap;
    std::vector<float> lp;
    const float* h = hs + r * d;
    auto expand = [&](index_t block_begin, index_t block_size, float base) {
      lp.resize(static_cast<std::size_t>(block_size));
      child_log_probs(h, block_begin, block_size, lp.data());
      for (index_t j = 0; j < block_size; ++j) {
        heap.push_back({base + lp[j], block_begin + j});
        std::push_heap(heap.begin(), heap.end());
      }
      if (beam > 0 && static_cast<index_t>(heap.size()) > beam) {
        std::sort(heap.begin(), heap.end(), [](const open_node& a, const open_node& b) { return b < a; });
        heap.resize(static_cast<std::size_t>(beam));
        std::make_heap(heap.begin(), heap.end());
      }
    };
    expand(0, tv.root_block_size(), 0.f);
    index_t found = 0;
    while (found < k && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const open_node best = heap.back();
      heap.pop_back();
      const child_ref c = tv.child(best.row);
      if (c.is_leaf) {
        classes(r, found) = c.leaf_class;
        log_probs(r, found) = best.log_prob;
        ++found;
      } else {
        expand(c.block_begin, c.block_size, best.log_prob);
      }
    }
    for (; found < k; ++found) {  // only a narrow beam can run dry
      classes(r, found) = -1;
      log_probs(r, found) = -std::numeric_limits<float>::infinity();
    }
  });
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::log_distribution_(matrix_view<const H> hidden, index_t class_begin,
                                                            index_t class_end, matrix_view<float> out) const {
  if constexpr (!is_host_backend<B>) {
    detail::device_heads<B>::hs_log_distribution(*this, hidden, class_begin, class_end, out);
  } else {
    log_distribution_host(hidden, class_begin, class_end, out);
  }
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::log_distribution_host(matrix_view<const H> hidden, index_t class_begin,
                                                                index_t class_end, matrix_view<float> out) const {
  const auto policy = backend_traits<B>::policy(resources_);  // inputs were checked by head_verbs
  const detail::batch_rows<B> batch = detail::pack_rows(detail::execution<B>{resources_}, hidden, {}, 0);
  const auto tv = tree_.view();
  const index_t d = dim();
  const float* hs = batch.hidden.data();
  detail::parallel_for(policy, batch.rows, [=](index_t r) {
    std::unordered_map<index_t, std::vector<float>> node_log_probs;  // per block, computed once
    for (index_t c = class_begin; c < class_end; ++c) {
      float total = 0.f;
      for (int l = 0; l < tv.depth(c); ++l) {
        const path_step s = tv.step(c, l);
        auto it = node_log_probs.find(s.block_begin);
        if (it == node_log_probs.end()) {
          it = node_log_probs.emplace(s.block_begin, std::vector<float>(static_cast<std::size_t>(s.block_size))).first;
          child_log_probs(hs + r * d, s.block_begin, s.block_size, it->second.data());
        }
        total += it->second[s.child];
      }
      out(r, c - class_begin) = total;
    }
  });
}

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::log_distribution_async_(matrix_view<const H> hidden, index_t class_begin,
                                                                  index_t class_end, matrix_view<float> out) const {
  detail::device_heads<B>::hs_log_distribution_async(*this, hidden, class_begin, class_end, out);
}

}  // namespace xsoftmax
