// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hierarchical_softmax` on the `cuda` backend: the verbs behind `device_heads<cuda>::hs_*`. Same
/// checks, messages and semantics as detail/hierarchical_softmax.inl, and the same gradient row
/// layout (run by run, level by level), so results compare row by row with the host backends.
///
/// forward / backward:
///  1. Validate, pack the non-ignored rows, compute upstream gradients (packed order).
///  2. Sort the packed rows once by leaf_rank(target) (thrust::stable_sort_by_key: CUB radix sort).
///     Below any node the samples are then one contiguous run at every level.
///  3. Plan: per level, each row's path step (a kernel), runs of equal block_begin
///     (thrust::reduce_by_key; rows whose path ended have key -1 and are skipped), copied to the
///     host. The run list fixes the gradient rows, exactly as the host builds them.
///  4. Level by level (a level's runs touch disjoint rows and disjoint gradient rows):
///     - runs of at least gemm_min_run() rows (softmax nodes) go through the dense-block machinery
///       of dense.cuh (cuBLAS GEMMs + online log-sum-exp) against the node's block of child rows;
///       blocks wider than `gather_max_block` always do, since the gather path keeps a block's
///       scores per sample;
///     - the other runs (and every run of sigmoid nodes) go through the gather-dot kernel: one warp
///       per sample reads the node's rows in place, writes the sample's dLoss/dscore values to a
///       flat buffer and adds into its own grad_hidden row; then one block per (run, child row)
///       sums G_ij * h_i over the run's samples in order.
///     - a level's dense runs whose node block fits one chunk of scores may instead go through the
///       grouped path (`dense_grouping`; by default when a level has >= 2 of them): one grouped
///       scores GEMM for all of them, one segmented kernel (bias, log-sum-exp, target logit, loss,
///       dLoss/dscore), one grouped GEMM for both gradients of every run and one bias-sum kernel.
///       A level with thousands of small nodes is otherwise launch-bound (~6+ launches per run,
///       each doing a few kFLOPs): grouped, a level costs 4 launches per batch whatever its node
///       count. FLOPs: the same, minus the backward's recomputation of the scores (kept from the
///       forward here: 2 x len x block x dim per run saved). Bytes: the same weight, hidden and
///       gradient traffic; the scores of every grouped run (len x block fp32, plus a storage-type
///       copy for bf16/fp16 gradients) are held at once, in batches of at most
///       `grouped_budget_values` values, instead of one run's chunk reused from run to run (which
///       small runs would keep in L2). cuBLAS's grouped GEMM takes no 16-bit inputs with fp32
///       outputs, so for bf16/fp16 storage the GEMMs stay one per run (grouped_gemm.cuh) and only
///       the kernels are grouped.
///     No atomics: every output element is written by one thread, in a fixed order (deterministic).
///
/// The kernels of each stage are in hs_levels.cuh; topk and log_distribution in hs_search.cuh.

#include <xsoftmax/detail/cuda/packed_batch.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>
#include <xsoftmax/detail/cuda/grouped_gemm.cuh>
#include <xsoftmax/detail/cuda/hs_levels.cuh>
#include <xsoftmax/detail/cuda/hs_search.cuh>
#include <xsoftmax/detail/cuda/tree.cuh>
#include <xsoftmax/hierarchical_softmax.hpp>

#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/iterator/constant_iterator.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// forward / backward
// ------------------------------------------------------------------------------------------------

/// forward / forward_backward / backward / log_prob. Blocking (`wait`): returns the reduced loss
/// after synchronising the stream. `_async` (`!wait`): writes the reduced loss to the device float
/// `loss_out` (when given) and returns 0 without waiting for the stream's last kernels; the checks
/// and the per-level planning still read results back on the way (see hierarchical_softmax.hpp).
template <class Head, class H>
float hs_run(const Head& head, const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
             loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
             sparse_gradient<cuda, float>* grad_weights, vector_view<const float> grad_output, bool wait = true,
             float* loss_out = nullptr) {
  using T = typename Head::storage_type;
  using Tree = typename Head::tree_type;
  constexpr bool sigmoid = Head::sigmoid_form;
  const cuda_resources& res = head.resources();
  const cudaStream_t stream = res.stream();
  const auto policy = backend_traits<cuda>::policy(res);
  const index_t d = head.dim(), batch = hidden.rows;
  // Inputs were checked by head_verbs.

  const bool want_grad = grad_weights != nullptr;
  arena a(res.workspace(), stream);
  index_t* packed_sample = a.take<index_t>(batch);
  index_t* packed_target = a.take<index_t>(batch);
  float* packed_upstream = a.take<float>(batch);
  index_t* sample = a.take<index_t>(batch);
  index_t* target = a.take<index_t>(batch);
  float* upstream = a.take<float>(batch);
  index_t* key = a.take<index_t>(batch);
  index_t* order = a.take<index_t>(batch);
  index_t* block_size = a.take<index_t>(batch);
  index_t* child = a.take<index_t>(batch);
  index_t* run_key = a.take<index_t>(batch);
  index_t* run_count = a.take<index_t>(batch);
  index_t* run_size = a.take<index_t>(batch);
  T* hs = a.take<T>(batch * d);
  float* loss = a.take<float>(batch);
  float* grad_h = want_grad ? a.take<float>(batch * d) : nullptr;
  // Per-row arrays now; scores / grad come after planning, once the widest dense run is known.
  dense_scratch<T> sc = dense_scratch<T>::take(a, batch, /*chunk=*/0, /*with_grad=*/false);

  // 1. Pack, upstream gradients (packed order, as the host checks them).
  const index_t rows = select_rows(res, targets, options.ignore_index, packed_sample);
  thrust::gather(policy, packed_sample, packed_sample + rows, targets.data, packed_target);
  if (want_grad)
    upstream_gradients(where, res, packed_sample, rows, batch, options.reduce, grad_output, packed_upstream);

  // 2. Sort once by leaf rank (stable: equal targets keep batch order, as on the host).
  const device_tree<Tree> dtree(head.tree(), head.backend_cache(), stream);
  const auto tv = dtree.view();
  if (rows > 0) {
    leaf_rank_kernel<<<grid_for(rows), block_threads, 0, stream>>>(tv, packed_target, rows, key);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    thrust::sequence(policy, order, order + rows);
    thrust::stable_sort_by_key(policy, key, key + rows, order);
    thrust::gather(policy, order, order + rows, packed_sample, sample);
    thrust::gather(policy, order, order + rows, packed_target, target);
    if (want_grad) thrust::gather(policy, order, order + rows, packed_upstream, upstream);
  }
  pack_rows(res, hidden, sample, rows, hs);

  // 3. Plan the runs, level by level, on the host (as the host implementation lays them out).
  std::vector<level_run> runs;
  std::vector<std::size_t> level_first{0};
  index_t grad_rows = 0;
  for (int l = 0; l < Tree::max_depth && rows > 0; ++l) {
    level_steps_kernel<<<grid_for(rows), block_threads, 0, stream>>>(tv, target, rows, l, key, block_size, child);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    const auto ends = thrust::reduce_by_key(policy, key, key + rows, thrust::constant_iterator<index_t>(1), run_key,
                                            run_count);
    const index_t n = static_cast<index_t>(ends.first - run_key);
    thrust::reduce_by_key(policy, key, key + rows, block_size, run_key, run_size, thrust::equal_to<index_t>(),
                          thrust::maximum<index_t>());  // equal within a run: the max is that size
    const std::vector<index_t> keys = to_host(run_key, n, stream);
    const std::vector<index_t> counts = to_host(run_count, n, stream);
    const std::vector<index_t> sizes = to_host(run_size, n, stream);
    bool any = false;
    index_t begin = 0;
    for (index_t i = 0; i < n; ++i) {
      if (keys[i] >= 0) {
        any = true;
        runs.push_back({l, begin, begin + counts[i], keys[i], sizes[i], grad_rows});
        grad_rows += sigmoid ? 1 : sizes[i];
      }
      begin += counts[i];
    }
    level_first.push_back(runs.size());
    if (!any) break;
  }

  // Which runs use the GEMMs, and the scratch each path needs (maxima over levels).
  const index_t gemm_min_run = head.gemm_min_run();
  const auto is_dense = [&](const level_run& run) {
    return !sigmoid && (run.end - run.begin >= gemm_min_run || run.block_size > gather_max_block);
  };
  // Grouped dense runs (see dense_grouping): per level, the dense runs whose block fits one chunk
  // (as the per-run path would size it), cut into batches of at most grouped_budget_values scores.
  const xsoftmax::dense_grouping grouping = head.dense_grouping();
  std::vector<char> grouped(runs.size(), 0);
  std::vector<dense_run> dense_runs;
  std::vector<grouped_batch<T>> batches;
  std::vector<std::size_t> level_batches{0};  // level lv's batches: [level_batches[lv], level_batches[lv + 1])
  index_t grouped_values = 0;                 // the largest batch's scores
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    std::vector<std::size_t> eligible;
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      const level_run& run = runs[i];
      if (is_dense(run) && default_chunk(run.end - run.begin, run.block_size) == run.block_size)
        eligible.push_back(i);
    }
    const bool group = grouping == xsoftmax::dense_grouping::grouped
                           ? !eligible.empty()
                           : grouping == xsoftmax::dense_grouping::automatic && eligible.size() >= 2;
    if (group) {
      for (const std::size_t i : eligible) {
        const level_run& run = runs[i];
        const index_t len = run.end - run.begin, values = len * run.block_size;
        if (batches.size() == level_batches.back() || batches.back().values + values > grouped_budget_values) {
          batches.emplace_back();
          batches.back().first = dense_runs.size();
        }
        grouped_batch<T>& bt = batches.back();
        dense_runs.push_back({run.begin, run.end, run.block_begin, run.block_size, run.grad_offset, bt.rows,
                              bt.values});
        ++bt.count;
        bt.rows += len;
        bt.values += values;
        bt.max_block = std::max(bt.max_block, run.block_size);
        grouped_values = std::max(grouped_values, bt.values);
        grouped[i] = 1;
      }
    }
    level_batches.push_back(batches.size());
  }

  index_t dense_scores = 0, max_gather_runs = 0, max_gather_values = 0;
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    index_t n_gather = 0, values = 0;
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      const level_run& run = runs[i];
      const index_t len = run.end - run.begin;
      if (grouped[i]) continue;
      if (is_dense(run)) {
        dense_scores = std::max(dense_scores, len * default_chunk(len, run.block_size));
      } else {
        ++n_gather;
        values += len * (sigmoid ? 1 : run.block_size);
      }
    }
    max_gather_runs = std::max(max_gather_runs, n_gather);
    max_gather_values = std::max(max_gather_values, values);
  }
  sc.scores = a.take<float>(dense_scores);
  if (want_grad && !std::is_same_v<T, float>) sc.grad = a.take<T>(dense_scores);
  gather_run* gather_runs = a.take<gather_run>(max_gather_runs);
  float* gather_values = a.take<float>(max_gather_values);
  float* g_scores = a.take<float>(grouped_values);
  T* g_storage = want_grad && !std::is_same_v<T, float> ? a.take<T>(grouped_values) : nullptr;

  // Gradient rows: run by run, level by level (the host layout).
  float* gw = nullptr;
  float* gb = nullptr;
  if (want_grad) {
    sparse_gradient<cuda, float>& g = *grad_weights;
    g.dim = d;
    std::vector<index_t> grad_row_ids(static_cast<std::size_t>(grad_rows));
    for (const level_run& run : runs) {
      if (sigmoid) grad_row_ids[run.grad_offset] = run.block_begin / 2;
      else
        for (index_t j = 0; j < run.block_size; ++j) grad_row_ids[run.grad_offset + j] = run.block_begin + j;
    }
    g.rows.resize(static_cast<std::size_t>(grad_rows));
    g.values.resize(static_cast<std::size_t>(grad_rows * d));
    g.bias_values.resize(head.has_bias() ? static_cast<std::size_t>(grad_rows) : 0);
    to_device(thrust::raw_pointer_cast(g.rows.data()), grad_row_ids, stream);
    gw = thrust::raw_pointer_cast(g.values.data());
    gb = head.has_bias() ? thrust::raw_pointer_cast(g.bias_values.data()) : nullptr;
  }

  // 4. Level by level.
  const auto w = matrix_view<const T>(head.weights());
  const T* bias = head.bias();
  if (rows > 0) thrust::fill_n(policy, loss, rows, 0.f);
  if (want_grad && rows > 0) thrust::fill_n(policy, grad_h, rows * d, 0.f);
  const float scale = want_grad && scales_gradient<T> ? gradient_scale(res, upstream, rows) : 1.f;

  // The grouped batches' GEMMs, and their descriptors and pointer arrays on the device (one copy
  // each for the whole call; the batches of all levels reuse one scores buffer, in stream order).
  constexpr bool fp32 = std::is_same_v<T, float>;
  const float g_scale = scale;  // 1 unless scales_gradient<T>
  const float g_alpha = 1.f / g_scale;  // exact: a power of two
  const T* g_values = fp32 ? reinterpret_cast<const T*>(g_scores) : g_storage;  // G as the GEMMs read it
  std::vector<const void*> host_ptrs;
  for (grouped_batch<T>& bt : batches) {
    for (std::size_t k = bt.first; k < bt.first + bt.count; ++k) {
      const dense_run& run = dense_runs[k];
      const index_t len = run.end - run.begin, bs = run.block_size;
      const T* h_run = hs + run.begin * d;
      const T* w_block = w.row(run.block_begin);
      // S (len x bs) = H_run W_block^T
      bt.scores.add({op::none, op::transpose, len, bs, d, 1.f, h_run, d, w_block, w.stride, 0.f,
                     g_scores + run.s_offset, bs});
      if (want_grad) {
        // grad_h[run] += G W_block;  grad_w[grad_offset ...] = G^T H_run
        bt.grads.add({op::none, op::none, len, d, bs, g_alpha, g_values + run.s_offset, bs, w_block, w.stride, 1.f,
                      grad_h + run.begin * d, d});
        bt.grads.add({op::transpose, op::none, bs, d, len, g_alpha, g_values + run.s_offset, bs, h_run, d, 0.f,
                      gw + run.grad_offset * d, d});
      }
    }
    bt.scores_ptrs = host_ptrs.size();
    bt.scores.pointers(host_ptrs);
    bt.grads_ptrs = host_ptrs.size();
    bt.grads.pointers(host_ptrs);
  }
  dense_run* d_dense_runs = a.take<dense_run>(static_cast<index_t>(dense_runs.size()));
  const void** d_ptrs = a.take<const void*>(static_cast<index_t>(host_ptrs.size()));
  to_device(d_dense_runs, dense_runs, stream);
  to_device(d_ptrs, host_ptrs, stream);
  const auto run_grouped = [&](const grouped_batch<T>& bt) {
    const dense_run* dr = d_dense_runs + bt.first;
    const index_t n = static_cast<index_t>(bt.count);
    bt.scores.run(res.cublas(), d_ptrs + bt.scores_ptrs);
    T* gst = want_grad ? g_storage : nullptr;
    // Narrow blocks (the common case in deep trees) waste fewer idle threads with one warp per row.
    if (bt.max_block <= 2 * warp_size)
      grouped_rows_kernel<warp_size, T><<<grid_rows(bt.rows), warp_size, 0, stream>>>(
          dr, n, bt.rows, g_scores, gst, bias, child, upstream, loss, want_grad, g_scale);
    else
      grouped_rows_kernel<lse_threads, T><<<grid_rows(bt.rows), lse_threads, 0, stream>>>(
          dr, n, bt.rows, g_scores, gst, bias, child, upstream, loss, want_grad, g_scale);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    if (!want_grad) return;
    bt.grads.run(res.cublas(), d_ptrs + bt.grads_ptrs);
    if (gb) {
      grouped_bias_grad_kernel<><<<grid_rows(n), 128, 0, stream>>>(dr, n, g_scores, gb);  // gb: bias grads
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    }
  };
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    if (level_first[lv] == level_first[lv + 1]) continue;
    const int level = runs[level_first[lv]].level;
    level_steps_kernel<<<grid_for(rows), block_threads, 0, stream>>>(tv, target, rows, level, key, block_size,
                                                                     child);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    std::vector<gather_run> gathered;
    index_t values = 0, max_width = 1;
    for (std::size_t b = level_batches[lv]; b < level_batches[lv + 1]; ++b) run_grouped(batches[b]);
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      const level_run& run = runs[i];
      const index_t len = run.end - run.begin;
      if (grouped[i]) continue;
      if (!is_dense(run)) {
        const index_t width = sigmoid ? 1 : run.block_size;
        gathered.push_back({run.begin, run.end, run.block_begin, run.block_size, run.grad_offset, values});
        values += len * width;
        max_width = std::max(max_width, width);
        continue;
      }
      // A long run: the node's block as a dense problem over the run's rows.
      dense_block<T> block;
      block.h = hs + run.begin * d;
      block.rows = len;
      block.dim = d;
      block.w = w;
      block.bias = bias;
      block.first = run.block_begin;
      block.n = run.block_size;
      block.target_col = child + run.begin;
      dense_scratch<T> rs = sc;
      rs.chunk = default_chunk(len, run.block_size);
      rs.run_max = sc.run_max + run.begin;
      rs.run_sum = sc.run_sum + run.begin;
      rs.target_logit = sc.target_logit + run.begin;
      rs.lse = sc.lse + run.begin;
      dense_lse(res, block, rs);
      dense_losses(res, block, rs, loss + run.begin, true);
      if (want_grad)
        dense_backward(res, block, rs, upstream + run.begin, scale, grad_h + run.begin * d, gw + run.grad_offset * d,
                       gb ? gb + run.grad_offset : nullptr);
    }
    if (gathered.empty()) continue;
    const index_t n_gather = static_cast<index_t>(gathered.size());
    to_device(gather_runs, gathered, stream);
    const index_t warps_per_block = block_threads / warp_size;
    gather_level_kernel<sigmoid, T><<<grid_for(rows, warps_per_block), block_threads, 0, stream>>>(
        gather_runs, n_gather, rows, hs, d, w, bias, child, upstream, loss, gather_values, grad_h);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    if (want_grad) {
      expects(n_gather <= static_cast<index_t>(INT_MAX), "hierarchical_softmax: ", n_gather,
              " gather runs in one level exceed the CUDA grid limit");
      const dim3 grid(static_cast<unsigned>(n_gather), static_cast<unsigned>(std::min<index_t>(max_width, 64)));
      gather_weight_grad_kernel<sigmoid, T><<<grid, 128, 0, stream>>>(gather_runs, gather_values, hs, d, gw, gb);
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    }
  }

  if (want_grad && grad_hidden) scatter_rows(res, grad_h, sample, rows, *grad_hidden);
  if (per_sample.size != 0) scatter_losses(res, loss, sample, rows, per_sample);
  const execution<::xsoftmax::cuda> ex{res};
  if (wait) return detail::reduce_losses(ex, loss, rows, options.reduce);  // waits for the stream
  if (loss_out) detail::reduce_losses_into(ex, loss, rows, options.reduce, loss_out);
  return 0.f;
}

}  // namespace xsoftmax::detail::gpu
