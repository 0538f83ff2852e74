// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax`: construction and the training run (host backends: planning runs per level,
/// dense-softmax GEMMs or per-sample gather-dot; the cuda backend's run is detail/cuda/
/// hierarchical_softmax.cuh). Evaluation (top-k, class-range log-probabilities) is in
/// hierarchical_softmax_search.inl.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <vector>

namespace xsoftmax {

namespace detail {

/// log(1 + exp(x)) without overflow.
inline float softplus(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

/// Rows stable-sorted by their target's leaf rank: below any node, samples form one contiguous run.
template <class Policy, class TreeView, class Batch, class Upstream>
Batch sort_by_leaf_rank(const Policy& policy, const TreeView& tree, const Batch& in, Upstream& upstream) {
  const index_t n = in.rows, d = in.dim;
  std::vector<index_t> keys(static_cast<std::size_t>(n)), order(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) keys[r] = tree.leaf_rank(in.target[r]);
  thrust::sequence(policy, order.begin(), order.end());
  thrust::stable_sort_by_key(policy, keys.begin(), keys.end(), order.begin());
  Batch out;
  out.dim = d;
  out.rows = n;
  out.sample.resize(static_cast<std::size_t>(n));
  out.target.resize(static_cast<std::size_t>(n));
  out.hidden.resize(in.hidden.size());
  Upstream up(upstream.size());
  for (index_t r = 0; r < n; ++r) {
    out.sample[r] = in.sample[order[r]];
    out.target[r] = in.target[order[r]];
    if (!upstream.empty()) up[r] = upstream[order[r]];
  }
  const float* src = in.hidden.data();
  float* dst = out.hidden.data();
  const index_t* ord = order.data();
  parallel_for(policy, n, [=](index_t r) { std::copy(src + ord[r] * d, src + ord[r] * d + d, dst + r * d); });
  upstream.swap(up);
  return out;
}

}  // namespace detail

/// A run of sorted samples that share one node at one level, and where its gradient rows go.
template <class Tree, class P, class B, class F>
struct hierarchical_softmax<Tree, P, B, F>::run_range {
  int level = 0;
  index_t begin = 0, end = 0;  ///< sorted rows
  index_t block_begin = 0, block_size = 0;
  index_t grad_offset = 0;  ///< first row of this run's block in the sparse gradient
};

template <class Tree, class P, class B, class F>
index_t hierarchical_softmax<Tree, P, B, F>::weight_rows(const Tree& tree) {
  return sigmoid_form ? tree.num_rows() / 2 : tree.num_rows();
}

namespace detail {
template <bool Sigmoid, class Tree>
void check_node_form(const Tree& tree) {
  if constexpr (Sigmoid) {
    const auto tv = tree.view();
    for (index_t c = 0; c < tv.num_classes(); ++c)
      for (int l = 0; l < tv.depth(c); ++l) {
        const path_step s = tv.step(c, l);
        expects<tree_error>(s.block_size == 2, "hierarchical_softmax<sigmoid_nodes>: the node at level ", l,
                            " on class ", c, "'s path has ", s.block_size,
                            " children; the sigmoid form needs a binary tree (every node exactly 2)");
      }
  }
}
}  // namespace detail

template <class Tree, class P, class B, class F>
hierarchical_softmax<Tree, P, B, F>::hierarchical_softmax(Tree tree, index_t dim, bool with_bias,
                                                          init_options init, backend_resources<B> resources)
    : tree_(std::move(tree)), resources_(resources) {
  detail::check_node_form<sigmoid_form>(tree_);
  store_ = detail::weight_store<storage_type, B>("hierarchical_softmax", weight_rows(tree_), dim, with_bias, init);
}

template <class Tree, class P, class B, class F>
hierarchical_softmax<Tree, P, B, F>::hierarchical_softmax(Tree tree, matrix_view<storage_type> weights,
                                                          storage_type* bias, backend_resources<B> resources)
    : tree_(std::move(tree)), resources_(resources) {
  detail::check_node_form<sigmoid_form>(tree_);
  detail::expects<shape_error>(weights.rows == weight_rows(tree_), "hierarchical_softmax: weights.rows = ",
                               weights.rows, " but the tree needs ", weight_rows(tree_), " rows");
  store_ = detail::weight_store<storage_type, B>("hierarchical_softmax", weights, bias);
}

template <class Tree, class P, class B, class F>
template <class H>
float hierarchical_softmax<Tree, P, B, F>::run_(const char* where, matrix_view<const H> hidden,
                                               vector_view<const index_t> targets, loss_options options,
                                               vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                               gradient_type* grad_weights,
                                               vector_view<const float> grad_output) const {
  if constexpr (is_host_backend<B>) {
    return run_host(where, hidden, targets, options, per_sample, grad_hidden, grad_weights, grad_output);
  } else {
    return detail::device_heads<B>::hs_run(*this, where, hidden, targets, options, per_sample, grad_hidden,
                                           grad_weights, grad_output);
  }
}

template <class Tree, class P, class B, class F>
template <class H>
float hierarchical_softmax<Tree, P, B, F>::run_host(const char* where, matrix_view<const H> hidden,
                                                    vector_view<const index_t> targets, loss_options options,
                                                    vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                    gradient_type* grad_weights,
                                                    vector_view<const float> grad_output) const {
  const auto policy = backend_traits<B>::policy(resources_);
  const detail::execution<B> ex{resources_};
  const auto tv = tree_.view();
  const index_t d = dim();
  // Inputs were checked by head_verbs; packing, upstream gradients, scatter and the reduction are
  // the generic primitives every head uses.

  const bool want_grad = grad_weights != nullptr;
  backend_vector<B, float> upstream;
  const detail::batch_rows<B> packed = detail::pack_rows(ex, hidden, targets, options.ignore_index);
  if (want_grad) upstream = detail::upstream_gradients(ex, where, packed, hidden.rows, options.reduce, grad_output);
  const detail::batch_rows<B> batch = detail::sort_by_leaf_rank(policy, tv, packed, upstream);
  const index_t rows = batch.rows;

  // Runs of samples sharing a node, level by level; each run's block gets its own gradient rows.
  std::vector<run_range> runs;
  std::vector<std::size_t> level_first{0};
  index_t grad_rows = 0;
  for (int l = 0; l < Tree::max_depth; ++l) {
    bool any = false;
    for (index_t r = 0; r < rows; ++r) {
      if (tv.depth(batch.target[r]) <= l) continue;
      any = true;
      const path_step s = tv.step(batch.target[r], l);
      if (runs.size() > level_first.back() && runs.back().block_begin == s.block_begin && runs.back().end == r) {
        ++runs.back().end;
        continue;
      }
      runs.push_back({l, r, r + 1, s.block_begin, s.block_size, grad_rows});
      grad_rows += sigmoid_form ? 1 : s.block_size;
    }
    level_first.push_back(runs.size());
    if (!any) break;
  }

  if (want_grad) {
    gradient_type& g = *grad_weights;
    g.dim = d;
    g.rows.resize(static_cast<std::size_t>(grad_rows));
    for (const run_range& run : runs) {
      if (sigmoid_form) g.rows[run.grad_offset] = run.block_begin / 2;
      else
        for (index_t j = 0; j < run.block_size; ++j) g.rows[run.grad_offset + j] = run.block_begin + j;
    }
    g.values.resize(static_cast<std::size_t>(grad_rows * d));
    g.bias_values.resize(has_bias() ? static_cast<std::size_t>(grad_rows) : 0);
  }

  std::vector<float> losses(static_cast<std::size_t>(rows), 0.f);
  std::vector<float> grad_packed(want_grad ? static_cast<std::size_t>(rows * d) : 0, 0.f);
  const auto w = matrix_view<const storage_type>(weights());
  const storage_type* bias = store_.bias();
  const float* hs = batch.hidden.data();
  const index_t* tgt = batch.target.data();
  const float* up = upstream.data();
  float* loss = losses.data();
  float* gh = grad_packed.data();
  float* gw = want_grad ? thrust::raw_pointer_cast(grad_weights->values.data()) : nullptr;
  float* gb = want_grad && bias ? thrust::raw_pointer_cast(grad_weights->bias_values.data()) : nullptr;
  const index_t gemm_min_run = gemm_min_run_;

  // Runs at least this long use the whole policy; shorter ones run side by side, one thread each.
  constexpr index_t parallel_inside = 256;

  // One run: scores of its samples against the node's block, loss, and (optionally) gradients.
  // Runs of one level touch disjoint samples and disjoint gradient rows, so they run in parallel.
  auto process = [=](const auto& inner_policy, const run_range& run) {
    const index_t len = run.end - run.begin;
    const float* h = hs + run.begin * d;
    if constexpr (sigmoid_form) {
      // A long run (the root's is most of a binary tree's work) takes two passes, each split over
      // the policy's threads: per sample the score, loss, dLoss/ds and its grad_hidden row; then
      // the node's weight-gradient row, columns split over threads, each column summed over the
      // run's samples in order — the order of the one-thread pass, so the result is bitwise the
      // same for every backend and thread count.
      const index_t node = run.block_begin / 2;
      const storage_type* wr = w.row(node);
      float* gwr = gw ? gw + run.grad_offset * d : nullptr;
      if (len < parallel_inside) {  // a short run, on one thread: one fused pass, no buffer
        if (gwr) std::fill(gwr, gwr + d, 0.f);
        float bias_acc = 0.f;
        for (index_t i = 0; i < len; ++i) {
          const index_t r = run.begin + i;
          float sc;
          detail::gather_dot(h + i * d, w, bias, node, 1, &sc);
          const bool first = tv.step(tgt[r], run.level).child == 0;
          loss[r] += detail::softplus(first ? -sc : sc);
          if (!gwr) continue;
          const float g = (detail::sigmoid(sc) - (first ? 1.f : 0.f)) * up[r];
          for (index_t p = 0; p < d; ++p) {
            gh[r * d + p] += g * to_float(wr[p]);
            gwr[p] += g * h[i * d + p];
          }
          bias_acc += g;
        }
        if (gb) gb[run.grad_offset] = bias_acc;
        return;
      }
      std::vector<float> gs_buffer(gwr ? static_cast<std::size_t>(len) : 0);
      float* gs = gs_buffer.data();
      const index_t level = run.level, begin = run.begin;
      detail::parallel_for(inner_policy, len, [=](index_t i) {
        const index_t r = begin + i;
        float sc;
        detail::gather_dot(h + i * d, w, bias, node, 1, &sc);
        const bool first = tv.step(tgt[r], level).child == 0;
        loss[r] += detail::softplus(first ? -sc : sc);
        if (!gwr) return;
        const float g = (detail::sigmoid(sc) - (first ? 1.f : 0.f)) * up[r];
        gs[i] = g;
        for (index_t p = 0; p < d; ++p) gh[r * d + p] += g * to_float(wr[p]);
      });
      if (!gwr) return;
      constexpr index_t column_block = 16;  // 64 bytes of a row per sample and block
      detail::parallel_for(inner_policy, (d + column_block - 1) / column_block, [=](index_t cb) {
        const index_t p0 = cb * column_block, p1 = p0 + column_block < d ? p0 + column_block : d;
        float acc[column_block] = {};
        for (index_t i = 0; i < len; ++i)
          for (index_t p = p0; p < p1; ++p) acc[p - p0] += gs[i] * h[i * d + p];
        for (index_t p = p0; p < p1; ++p) gwr[p] = acc[p - p0];
      });
      if (gb) {
        float bias_acc = 0.f;
        for (index_t i = 0; i < len; ++i) bias_acc += gs[i];
        gb[run.grad_offset] = bias_acc;
      }
    } else if (len >= gemm_min_run) {
      // A dense softmax of the run's rows over the node's block, chunked over the block's columns,
      // so a wide node (the root of a shallow tree) never holds more than len x chunk scores.
      std::vector<index_t> child(static_cast<std::size_t>(len));
      for (index_t i = 0; i < len; ++i) child[i] = tv.step(tgt[run.begin + i], run.level).child;
      detail::dense_softmax_args a;
      a.h = matrix_view<const float>(h, len, d);
      a.target = child.data();
      a.first = run.block_begin;
      a.n = run.block_size;
      a.chunk = detail::default_chunk_columns(len);
      a.loss = loss + run.begin;
      if (gw) {
        a.upstream = up + run.begin;
        a.grad_h = gh + run.begin * d;
        a.grad_w = gw + run.grad_offset * d;
        a.grad_b = gb ? gb + run.grad_offset : nullptr;
      }
      detail::dense_softmax(inner_policy, w, bias, a);
    } else {
      // Gather-dot: each sample against the node's rows, read in place in their storage type.
      const index_t bs = run.block_size;
      std::vector<float> s(static_cast<std::size_t>(len * bs));
      float* sp = s.data();
      for (index_t i = 0; i < len; ++i) detail::gather_dot(h + i * d, w, bias, run.block_begin, bs, sp + i * bs);
      for (index_t i = 0; i < len; ++i) {
        const index_t r = run.begin + i;
        float* si = sp + i * bs;
        const index_t child = tv.step(tgt[r], run.level).child;
        const float lse = detail::row_logsumexp(si, bs);
        loss[r] += lse - si[child];
        if (gw) {
          for (index_t j = 0; j < bs; ++j) si[j] = std::exp(si[j] - lse) * up[r];
          si[child] -= up[r];
        }
      }
      if (!gw) return;
      float* gwb = gw + run.grad_offset * d;
      float* ghr = gh + run.begin * d;
      std::fill(gwb, gwb + bs * d, 0.f);
      for (index_t i = 0; i < len; ++i)
        for (index_t j = 0; j < bs; ++j) {
          const float gij = sp[i * bs + j];
          const storage_type* wr = w.row(run.block_begin + j);
          float* gwr = gwb + j * d;
          for (index_t p = 0; p < d; ++p) {
            ghr[i * d + p] += gij * to_float(wr[p]);
            gwr[p] += gij * h[i * d + p];
          }
        }
      if (gb)
        for (index_t j = 0; j < bs; ++j) {
          float acc = 0.f;
          for (index_t i = 0; i < len; ++i) acc += sp[i * bs + j];
          gb[run.grad_offset + j] = acc;
        }
    }
  };

  // Long runs (the root's, wide top levels) use the whole policy inside one GEMM; the many short
  // runs of deeper levels run side by side, one thread each.
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    std::vector<run_range> small;
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      if (runs[i].end - runs[i].begin >= parallel_inside) process(policy, runs[i]);
      else small.push_back(runs[i]);
    }
    const run_range* sr = small.data();
    detail::parallel_for(policy, static_cast<index_t>(small.size()),
                         [=](index_t i) { process(thrust::cpp::par, sr[i]); });
  }

  if (grad_hidden) detail::scatter_rows(ex, batch, grad_packed.data(), *grad_hidden);
  if (per_sample.size != 0) detail::scatter_losses(ex, batch, losses.data(), per_sample);
  return detail::reduce_losses(ex, losses.data(), rows, options.reduce);
}

// The queue-only forms of the cuda backend (head_verbs runs the blocking verbs on host backends).

template <class Tree, class P, class B, class F>
template <class H>
void hierarchical_softmax<Tree, P, B, F>::run_async_(const char* where, matrix_view<const H> hidden,
                                                     vector_view<const index_t> targets, loss_options options,
                                                     vector_view<float> per_sample, matrix_view<float>* grad_hidden,
                                                     gradient_type* grad_weights,
                                                     vector_view<const float> grad_output, float* loss) const {
  detail::device_heads<B>::hs_run_async(*this, where, hidden, targets, options, per_sample, grad_hidden,
                                        grad_weights, grad_output, loss);
}

}  // namespace xsoftmax

#include <xsoftmax/detail/hierarchical_softmax_search.inl>
