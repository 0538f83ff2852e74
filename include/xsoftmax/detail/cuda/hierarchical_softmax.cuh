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
///     No atomics: every output element is written by one thread, in a fixed order (deterministic).
///
/// topk: best-first search, one warp per sample, open list in global memory (see hs_topk).
/// log_distribution: one warp per (sample, class), summing the path's log-probabilities.

#include <xsoftmax/detail/cuda/common.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>
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

/// Blocks at most this wide may use the gather path (its flat buffer holds len x block scores).
inline constexpr index_t gather_max_block = 1024;

// ------------------------------------------------------------------------------------------------
// Warp helpers
// ------------------------------------------------------------------------------------------------

inline constexpr int warp_size = 32;
inline constexpr unsigned full_mask = 0xffffffffu;

/// Sum over the warp by butterfly shuffles: every lane ends with the same value, bit for bit
/// (each step adds the same two operands on both lanes of a pair).
__device__ inline float warp_sum(float v) {
  for (int o = warp_size / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// h . w over d elements (both in storage type, widened), lanes striding over d; all lanes get it.
template <class T>
__device__ float warp_dot(const T* h, const T* w, index_t d, int lane) {
  float acc = 0.f;
  for (index_t p = lane; p < d; p += warp_size) acc += to_float(h[p]) * to_float(w[p]);
  return warp_sum(acc);
}

__device__ inline float softplus_f(float x) { return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }
__device__ inline float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// ------------------------------------------------------------------------------------------------
// Sorting and planning
// ------------------------------------------------------------------------------------------------

template <class View>
__global__ void leaf_rank_kernel(View tv, const index_t* target, index_t rows, index_t* key) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) key[r] = tv.leaf_rank(target[r]);
}

/// Row r's node at `level`: key = its block_begin (-1 when r's path ended above), its block size
/// and the child r's target takes.
template <class View>
__global__ void level_steps_kernel(View tv, const index_t* target, index_t rows, int level, index_t* key,
                                   index_t* block_size, index_t* child) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) {
    const index_t t = target[r];
    if (tv.depth(t) > level) {
      const path_step s = tv.step(t, level);
      key[r] = s.block_begin;
      block_size[r] = s.block_size;
      child[r] = s.child;
    } else {
      key[r] = -1;
      block_size[r] = 0;
      child[r] = 0;
    }
  }
}

/// A run of sorted rows sharing one node at one level, and where its gradient rows go.
struct level_run {
  int level = 0;
  index_t begin = 0, end = 0;  ///< sorted rows
  index_t block_begin = 0, block_size = 0;
  index_t grad_offset = 0;  ///< first row of this run's block in the sparse gradient
};

/// A gather-path run as the kernels see it. `g_offset`: the run's first entry in the level's flat
/// buffer, which holds (end - begin) x width values (width = block_size, 1 for sigmoid nodes).
struct gather_run {
  index_t begin, end, block_begin, block_size, grad_offset, g_offset;
};

// ------------------------------------------------------------------------------------------------
// Gather-dot path
// ------------------------------------------------------------------------------------------------

/// One warp per sorted row r in a gather run of this level (rows of other runs, or whose path
/// ended, are skipped): scores against the node's rows read in place, loss[r] += -log p(child),
/// and, when grad_h is given, the row's dLoss/dscore into the flat buffer and grad_h[r] += G W.
/// The flat buffer `g` must be given for softmax nodes even without gradients (it holds scores).
template <bool Sigmoid, class T>
__global__ void gather_level_kernel(const gather_run* runs, index_t n_runs, index_t rows, const T* hs, index_t d,
                                    matrix_view<const T> w, const T* bias, const index_t* child,
                                    const float* upstream, float* loss, float* g, float* grad_h) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size;
  for (index_t r = global_thread() / warp_size; r < rows; r += warps) {
    // The run holding r: the last one with begin <= r (runs are in row order). Warp-uniform.
    index_t lo = 0, hi = n_runs;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (runs[mid].begin <= r) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0) continue;
    const gather_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const T* h = hs + r * d;
    const index_t i = r - run.begin;
    const index_t c = child[r];
    if constexpr (Sigmoid) {
      // word2vec form: one row per internal node; p(first child) = sigmoid(h . v).
      const index_t node = run.block_begin / 2;
      const T* wr = w.row(node);
      const float s = warp_dot(h, wr, d, lane) + (bias ? to_float(bias[node]) : 0.f);
      const bool first = c == 0;
      if (lane == 0) loss[r] += softplus_f(first ? -s : s);
      if (grad_h) {
        const float gs = (sigmoid_f(s) - (first ? 1.f : 0.f)) * upstream[r];
        if (lane == 0) g[run.g_offset + i] = gs;
        for (index_t p = lane; p < d; p += warp_size) grad_h[r * d + p] += gs * to_float(wr[p]);
      }
    } else {
      const index_t bs = run.block_size;
      float* sr = g + run.g_offset + i * bs;
      float m = -INFINITY;
      for (index_t j = 0; j < bs; ++j) {
        const index_t row = run.block_begin + j;
        const float s = warp_dot(h, w.row(row), d, lane) + (bias ? to_float(bias[row]) : 0.f);
        if (lane == 0) sr[j] = s;
        m = s > m ? s : m;  // identical on every lane
      }
      __syncwarp();  // lane 0's score writes are visible to the warp
      float part = 0.f;
      for (index_t j = lane; j < bs; j += warp_size) part += expf(sr[j] - m);
      const float lse = m + logf(warp_sum(part));
      if (lane == 0) loss[r] += lse - sr[c];
      if (grad_h) {
        const float u = upstream[r];
        __syncwarp();  // every lane has read the scores it needs before they are overwritten
        for (index_t j = lane; j < bs; j += warp_size) {
          float gj = expf(sr[j] - lse) * u;
          if (j == c) gj -= u;
          sr[j] = gj;
        }
        __syncwarp();  // G visible to the warp
        for (index_t j = 0; j < bs; ++j) {
          const float gj = sr[j];
          const T* wr = w.row(run.block_begin + j);
          for (index_t p = lane; p < d; p += warp_size) grad_h[r * d + p] += gj * to_float(wr[p]);
        }
      }
    }
  }
}

/// Weight (and bias) gradient of the gather runs: block (run, y) handles the run's child rows
/// j = y, y + gridDim.y, ...; thread p sums G_ij * h_i[p] over the run's rows i in order.
template <bool Sigmoid, class T>
__global__ void gather_weight_grad_kernel(const gather_run* runs, const float* g, const T* hs, index_t d,
                                          float* grad_w, float* grad_b) {
  const gather_run run = runs[blockIdx.x];
  const index_t len = run.end - run.begin, width = Sigmoid ? 1 : run.block_size;
  const float* gr = g + run.g_offset;
  for (index_t j = blockIdx.y; j < width; j += gridDim.y) {
    float* out = grad_w + (run.grad_offset + j) * d;
    for (index_t p = threadIdx.x; p < d; p += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * width + j] * to_float(hs[(run.begin + i) * d + p]);
      out[p] = acc;
    }
    if (grad_b && threadIdx.x == 0) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += gr[i * width + j];
      grad_b[run.grad_offset + j] = acc;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// forward / backward
// ------------------------------------------------------------------------------------------------

template <class Head, class H>
float hs_run(const Head& head, const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
             loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
             sparse_gradient<cuda, float>* grad_weights, vector_view<const float> grad_output) {
  using T = typename Head::storage_type;
  using Tree = typename Head::tree_type;
  constexpr bool sigmoid = Head::sigmoid_form;
  const cuda_resources& res = head.resources();
  const cudaStream_t stream = res.stream();
  const auto policy = backend_traits<cuda>::policy(res);
  const index_t d = head.dim(), batch = hidden.rows;
  check_hidden(where, res, hidden, d);
  check_targets(where, res, targets, hidden.rows, head.num_classes(), options.ignore_index);
  if ((options.reduce == reduction::none && !grad_weights) || per_sample.size != 0)  // backward has no per_sample
    detail::check_output(where, "per_sample", per_sample, hidden.rows);
  if (grad_hidden) detail::check_output(where, "grad_hidden", *grad_hidden, hidden.rows, d);

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
  const device_tree<Tree> dtree(head.tree(), a, stream);
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
  index_t dense_scores = 0, max_gather_runs = 0, max_gather_values = 0;
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    index_t n_gather = 0, values = 0;
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      const level_run& run = runs[i];
      const index_t len = run.end - run.begin;
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
  const float scale = want_grad ? gradient_scale(res, upstream, rows) : 1.f;
  for (std::size_t lv = 0; lv + 1 < level_first.size(); ++lv) {
    if (level_first[lv] == level_first[lv + 1]) continue;
    const int level = runs[level_first[lv]].level;
    level_steps_kernel<<<grid_for(rows), block_threads, 0, stream>>>(tv, target, rows, level, key, block_size,
                                                                     child);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    std::vector<gather_run> gathered;
    index_t values = 0, max_width = 1;
    for (std::size_t i = level_first[lv]; i < level_first[lv + 1]; ++i) {
      const level_run& run = runs[i];
      const index_t len = run.end - run.begin;
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
  return reduce_losses(res, loss, rows, options.reduce);  // waits for the stream
}

// ------------------------------------------------------------------------------------------------
// top-k: best-first search per sample
// ------------------------------------------------------------------------------------------------

/// (log_prob, row) order of the search: higher log-probability first, ties by the smaller row
/// (the host's heap order). Rows in an open list are unique, so this order is total and the search
/// does not depend on how the list is laid out.
__device__ inline bool open_better(float lp_a, index_t row_a, float lp_b, index_t row_b) {
  return lp_a > lp_b || (lp_a == lp_b && row_a < row_b);
}

/// Position of the best (Best = true) or worst entry of an open list of `size` >= 1 entries; every
/// lane gets the same answer (the order is total, so the butterfly's pairs agree).
template <bool Best>
__device__ index_t open_select(const float* lp, const index_t* row, index_t size, int lane) {
  float bl = 0.f;  // (bl, br) is meaningful only once bp >= 0
  index_t br = 0, bp = -1;
  for (index_t p = lane; p < size; p += warp_size) {
    const bool take = bp < 0 || (Best ? open_better(lp[p], row[p], bl, br) : open_better(bl, br, lp[p], row[p]));
    if (take) {
      bl = lp[p];
      br = row[p];
      bp = p;
    }
  }
  for (int o = warp_size / 2; o > 0; o >>= 1) {
    const float ol = __shfl_xor_sync(full_mask, bl, o);
    const index_t orow = __shfl_xor_sync(full_mask, br, o);
    const index_t op = __shfl_xor_sync(full_mask, bp, o);
    bool take;
    if (op < 0) take = false;
    else if (bp < 0) take = true;
    else take = Best ? open_better(ol, orow, bl, br) : open_better(bl, br, ol, orow);
    if (take) {
      bl = ol;
      br = orow;
      bp = op;
    }
  }
  return bp;
}

/// Expands the node whose block is [block_begin, block_begin + block_size) below an open entry of
/// log-probability `base`: appends its children (log-probability base + log p(child | node)) to the
/// open list at [size, size + block_size). Returns the new size.
template <bool Sigmoid, class T>
__device__ index_t open_expand(const T* h, index_t d, matrix_view<const T> w, const T* bias, index_t block_begin,
                               index_t block_size, float base, float* lp, index_t* row, index_t size, int lane) {
  if constexpr (Sigmoid) {
    const index_t node = block_begin / 2;
    const float s = warp_dot(h, w.row(node), d, lane) + (bias ? to_float(bias[node]) : 0.f);
    if (lane == 0) {
      lp[size] = base - softplus_f(-s);
      row[size] = block_begin;
      lp[size + 1] = base - softplus_f(s);
      row[size + 1] = block_begin + 1;
    }
    __syncwarp();
    return size + 2;
  } else {
    float m = -INFINITY;
    for (index_t j = 0; j < block_size; ++j) {
      const index_t r = block_begin + j;
      const float s = warp_dot(h, w.row(r), d, lane) + (bias ? to_float(bias[r]) : 0.f);
      if (lane == 0) lp[size + j] = s;  // the raw score for now
      m = s > m ? s : m;
    }
    __syncwarp();
    float part = 0.f;
    for (index_t j = lane; j < block_size; j += warp_size) part += expf(lp[size + j] - m);
    const float lse = m + logf(warp_sum(part));
    // Each lane rewrites only the entries it read above: no lane reads what another writes.
    for (index_t j = lane; j < block_size; j += warp_size) {
      lp[size + j] = base + (lp[size + j] - lse);
      row[size + j] = block_begin + j;
    }
    __syncwarp();
    return size + block_size;
  }
}

/// Removes entry `pos` of an open list of `size` entries (the last one takes its place).
__device__ inline void open_remove(float* lp, index_t* row, index_t pos, index_t size, int lane) {
  __syncwarp();  // every lane is done reading the list
  if (lane == 0) {
    lp[pos] = lp[size - 1];
    row[pos] = row[size - 1];
  }
  __syncwarp();
}

/// One warp per row of the tile [row0, row0 + rows): the best-first search of detail/
/// hierarchical_softmax.inl (topk_host). Each row's open list has `capacity` entries in global
/// memory. When an exact search would exceed it, the row's search stops and *overflow is set; the
/// caller retries with a larger capacity.
template <bool Sigmoid, class T, class View>
__global__ void hs_topk_kernel(View tv, index_t row0, index_t rows, const T* hs, index_t d, matrix_view<const T> w,
                               const T* bias, index_t k, index_t beam, index_t capacity, float* open_lp,
                               index_t* open_row, matrix_view<index_t> classes, matrix_view<float> log_probs,
                               int* overflow) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size;
  for (index_t t = global_thread() / warp_size; t < rows; t += warps) {
    const index_t r = row0 + t;
    const T* h = hs + r * d;
    float* lp = open_lp + t * capacity;
    index_t* row = open_row + t * capacity;
    index_t size = 0, found = 0;
    bool failed = false;
    // The host's expand(): push a node's children, then cut the list back to the beam.
    const auto expand = [&](index_t block_begin, index_t block_size, float base) {
      size = open_expand<Sigmoid>(h, d, w, bias, block_begin, block_size, base, lp, row, size, lane);
      while (beam > 0 && size > beam) {  // drop the worst entries: the host keeps the same set
        const index_t worst = open_select<false>(lp, row, size, lane);
        open_remove(lp, row, worst, size, lane);
        --size;
      }
    };
    const index_t root = tv.root_block_size();
    if (root > capacity) failed = true;
    else expand(0, root, 0.f);
    while (!failed && found < k && size > 0) {
      const index_t pos = open_select<true>(lp, row, size, lane);
      const float best_lp = lp[pos];
      const index_t best_row = row[pos];
      open_remove(lp, row, pos, size, lane);
      --size;
      const child_ref c = tv.child(best_row);
      if (c.is_leaf) {
        if (lane == 0) {
          classes(r, found) = c.leaf_class;
          log_probs(r, found) = best_lp;
        }
        ++found;
        continue;
      }
      if (size + c.block_size > capacity) {  // only an exact search gets here (see hs_topk)
        failed = true;
        break;
      }
      expand(c.block_begin, c.block_size, best_lp);
    }
    if (failed && lane == 0) atomicExch(overflow, 1);  // a flag, not an accumulation
    if (lane == 0)
      for (; found < k; ++found) {  // only a narrow beam (or an overflow, retried) runs dry
        classes(r, found) = -1;
        log_probs(r, found) = -INFINITY;
      }
  }
}

/// Memory for the open lists of one hs_topk call; rows are searched in tiles that fit.
inline constexpr std::size_t hs_topk_budget_bytes = std::size_t(1) << 30;

template <class Head, class H>
void hs_topk(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
             matrix_view<float> log_probs, search_options options) {
  using T = typename Head::storage_type;
  using Tree = typename Head::tree_type;
  constexpr bool sigmoid = Head::sigmoid_form;
  const char* where = "hierarchical_softmax::topk";
  const cuda_resources& res = head.resources();
  const cudaStream_t stream = res.stream();
  const index_t d = head.dim();
  check_hidden(where, res, hidden, d);
  expects(k >= 1 && k <= head.num_classes(), where, ": k = ", k, " must be in [1, num_classes = ",
          head.num_classes(), "]");
  expects(options.beam_width >= 0, where, ": beam_width = ", options.beam_width, " must be >= 0");
  detail::check_output(where, "classes", classes, hidden.rows, k);
  detail::check_output(where, "log_probs", log_probs, hidden.rows, k);

  const index_t rows = hidden.rows, beam = options.beam_width;
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  int* overflow = a.take<int>(1);
  const device_tree<Tree> dtree(head.tree(), a, stream);
  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, hs);

  // Open-list capacity per row. A beam never holds more than beam + one block (it is cut back to
  // the beam after every expansion). An exact search holds at most 1 + (expanded nodes) x
  // (block - 1) entries, which has no small bound in general (a flat distribution expands many
  // nodes); start from k x height x max_block, enough for a search that expands about k paths,
  // and double on overflow, within the memory budget. Rows are searched in tiles that fit it.
  const index_t max_block = dtree.max_block_size();
  constexpr std::size_t entry_bytes = sizeof(float) + sizeof(index_t);
  const index_t budget_entries = static_cast<index_t>(hs_topk_budget_bytes / entry_bytes);
  index_t capacity = 0;
  if (beam > 0) {
    capacity = beam + max_block;
    expects(capacity <= budget_entries, where, ": beam_width = ", beam, " needs an open list of ", capacity,
            " nodes per row (", capacity * static_cast<index_t>(entry_bytes), " bytes), more than the budget of ",
            hs_topk_budget_bytes, " bytes; pass a smaller search_options::beam_width");
  } else {
    const double estimate = static_cast<double>(k) * dtree.height() * static_cast<double>(max_block);
    capacity = estimate >= static_cast<double>(budget_entries) ? budget_entries : static_cast<index_t>(estimate);
    capacity = std::min(budget_entries, std::max(capacity, max_block + 1));
  }
  for (;;) {
    const index_t tile = std::max<index_t>(1, std::min<index_t>(rows, budget_entries / capacity));
    thrust::device_vector<float> open_lp(static_cast<std::size_t>(tile * capacity));  // large and rare: not cached
    thrust::device_vector<index_t> open_row(static_cast<std::size_t>(tile * capacity));
    XSOFTMAX_CUDA_TRY(cudaMemsetAsync(overflow, 0, sizeof(int), stream));
    for (index_t row0 = 0; row0 < rows; row0 += tile) {
      const index_t n = std::min(tile, rows - row0);
      hs_topk_kernel<sigmoid, T><<<grid_for(n, block_threads / warp_size), block_threads, 0, stream>>>(
          dtree.view(), row0, n, hs, d, matrix_view<const T>(head.weights()), head.bias(), k, beam, capacity,
          thrust::raw_pointer_cast(open_lp.data()), thrust::raw_pointer_cast(open_row.data()), classes, log_probs,
          overflow);
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    }
    if (read_one(overflow, stream) == 0) return;  // read_one waits for the stream
    // Only an exact search overflows: redo every row with a larger open list.
    expects(capacity < budget_entries, where, ": the exact search (beam_width = 0) needs an open list of more than ",
            capacity, " nodes per row, more than the budget of ", hs_topk_budget_bytes,
            " bytes; pass search_options::beam_width > 0 for an approximate search");
    capacity = std::min(budget_entries, 2 * capacity);
  }
}

// ------------------------------------------------------------------------------------------------
// log_distribution
// ------------------------------------------------------------------------------------------------

/// One warp per (row, class): the sum over the class's path of log p(child | node).
template <bool Sigmoid, class T, class View>
__global__ void hs_log_distribution_kernel(View tv, index_t rows, const T* hs, index_t d, matrix_view<const T> w,
                                           const T* bias, index_t class_begin, index_t range,
                                           matrix_view<float> out) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size, n = rows * range;
  for (index_t e = global_thread() / warp_size; e < n; e += warps) {
    const index_t r = e / range, c = class_begin + (e - r * range);
    const T* h = hs + r * d;
    float total = 0.f;
    for (int l = 0; l < tv.depth(c); ++l) {
      const path_step s = tv.step(c, l);
      if constexpr (Sigmoid) {
        const index_t node = s.block_begin / 2;
        const float x = warp_dot(h, w.row(node), d, lane) + (bias ? to_float(bias[node]) : 0.f);
        total += s.child == 0 ? -softplus_f(-x) : -softplus_f(x);
      } else {
        // Online log-sum-exp over the node's children (identical on every lane).
        float m = -INFINITY, sum = 0.f, x_child = 0.f;
        for (index_t j = 0; j < s.block_size; ++j) {
          const index_t row = s.block_begin + j;
          const float x = warp_dot(h, w.row(row), d, lane) + (bias ? to_float(bias[row]) : 0.f);
          if (j == s.child) x_child = x;
          const float nm = x > m ? x : m;
          sum = sum * expf(m - nm) + expf(x - nm);
          m = nm;
        }
        total += x_child - (m + logf(sum));
      }
    }
    if (lane == 0) out(r, c - class_begin) = total;
  }
}

template <class Head, class H>
void hs_log_distribution(const Head& head, matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                         matrix_view<float> out) {
  using T = typename Head::storage_type;
  using Tree = typename Head::tree_type;
  const char* where = "hierarchical_softmax::log_distribution";
  const cuda_resources& res = head.resources();
  const cudaStream_t stream = res.stream();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden(where, res, hidden, d);
  expects<out_of_range>(class_begin >= 0 && class_begin < class_end && class_end <= n_cls, where, ": class range [",
                        class_begin, ", ", class_end, ") is empty or outside [0, ", n_cls, ")");
  detail::check_output(where, "out", out, hidden.rows, class_end - class_begin);

  const index_t rows = hidden.rows, range = class_end - class_begin;
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  const device_tree<Tree> dtree(head.tree(), a, stream);
  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, hs);
  hs_log_distribution_kernel<Head::sigmoid_form, T>
      <<<grid_for(rows * range, block_threads / warp_size), block_threads, 0, stream>>>(
          dtree.view(), rows, hs, d, matrix_view<const T>(head.weights()), head.bias(), class_begin, range, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

}  // namespace xsoftmax::detail::gpu
