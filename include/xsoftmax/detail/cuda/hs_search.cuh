// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Hierarchical softmax inference on the `cuda` backend: `hs_topk` (best-first or beam search, one
/// warp per sample, open list in global memory) and `hs_log_distribution` (one warp per (sample,
/// class), summing the path's log-probabilities). Same checks, messages and results as the host.

#include <xsoftmax/detail/cuda/packed_batch.cuh>
#include <xsoftmax/detail/cuda/hs_levels.cuh>
#include <xsoftmax/detail/cuda/tree.cuh>
#include <xsoftmax/hierarchical_softmax.hpp>

#include <algorithm>
#include <cstddef>

namespace xsoftmax::detail::gpu {

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
  // hidden, k and the outputs were checked by head_verbs; the search options are this head's own.
  expects(options.beam_width >= 0, where, ": beam_width = ", options.beam_width, " must be >= 0");

  const index_t rows = hidden.rows, beam = options.beam_width;
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  int* overflow = a.take<int>(1);
  const device_tree<Tree> dtree(head.tree(), head.backend_cache(), stream);
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
                         matrix_view<float> out, bool wait = true) {
  using T = typename Head::storage_type;
  using Tree = typename Head::tree_type;
  const cuda_resources& res = head.resources();
  const cudaStream_t stream = res.stream();
  const index_t n_cls = head.num_classes(), d = head.dim();
  // Inputs were checked by head_verbs.

  const index_t rows = hidden.rows, range = class_end - class_begin;
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  const device_tree<Tree> dtree(head.tree(), head.backend_cache(), stream);
  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, hs);
  hs_log_distribution_kernel<Head::sigmoid_form, T>
      <<<grid_for(rows * range, block_threads / warp_size), block_threads, 0, stream>>>(
          dtree.view(), rows, hs, d, matrix_view<const T>(head.weights()), head.bias(), class_begin, range, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  if (wait) XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

}  // namespace xsoftmax::detail::gpu
