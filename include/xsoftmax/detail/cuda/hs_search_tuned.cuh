// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA runner of the hierarchical softmax's top-k search over softmax nodes
/// (detail/hierarchical/tree_search.hpp, `tree_search_tuning`): one block per row instead of one
/// thread, the generic search's outcome. A beam search's pushes and pops are the generic ones, run
/// by the block's thread 0 over the open heap in global memory; an exact search's are the block's
/// (`exact_push_and_pop`: an unordered open list, pops by a block-wide max, each child's push
/// decided by its own thread, detail/hierarchical/exact_push.hpp). The block shares the expansion:
///  * the children's scores: each group of 8 lanes scores one child, lane l summing the elements
///    p = l mod 8 -- `dot_row8`'s own 8 partial sums, in its order (its 8-steps, its 4-wide tail
///    into lanes 0-3, the last 1-3 elements into lanes 4-6), combined by shuffles in its order
///    (`group8_dot_row8`): the same multiply-adds and additions, so the same bits. A step reads 8
///    consecutive elements of a row per group. (Until stop 46 a thread scored a child alone: a
///    warp's load then touched 32 rows, 32 sectors for 64 useful bytes of bf16, and the GPU quick
///    bench's 2-level top-10 took 179 ms for 1,024 rows -- ~0.7 ms an expansion round.)
///  * their log-sum-exp: warp 0 takes the max, then its lanes 0-7 the 8 lanes of
///    `sum_exp_shifted` (lane l the children j = l mod 8, in order), added in `add_exp_lanes`'
///    order by shuffles (`children_logsumexp`'s value, bit for bit; it was thread 0's alone);
///  * the subtraction, a thread per child.
/// Bitwise the generic device search; the generic one is its oracle in the GPU tests.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/hierarchical/exact_push.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>

#include <cstdint>

namespace xsoftmax::detail {
namespace gpu {

/// Lane l (0-7) of an 8-lane group's share of `dot_row8(h, w, d)`: the partial sum of the
/// elements p = l mod 8 in `dot_row8_portable`'s order, then the group's lanes combined in its
/// order (a_l + a_(l+4), then (a0 + a2) + (a1 + a3)); the group's lane 0 returns dot_row8's value,
/// bit for bit (the same multiply-adds, which nvcc contracts alike, and the same additions). Every
/// lane of the warp must call it (the shuffles); a lane with nothing to add passes d = 0.
template <class T>
__device__ float group8_dot_row8(const float* h, const T* w, index_t d, int l) {
  float a = 0.f;
  index_t p = 0;
  for (; p + 8 <= d; p += 8) a += h[p + l] * to_float(w[p + l]);
  if (p + 4 <= d) {  // the 4-wide tail, lanes 0-3
    if (l < 4) a += h[p + l] * to_float(w[p + l]);
    p += 4;
  }
  if (l >= 4 && p + (l - 4) < d) a += h[p + l - 4] * to_float(w[p + l - 4]);  // the last 1-3, lanes 4-6
  a += __shfl_down_sync(full_mask, a, 4, 8);  // lanes 0-3: a_l + a_(l+4)
  a += __shfl_down_sync(full_mask, a, 2, 8);  // lanes 0, 1: a0 + a2, a1 + a3
  return a + __shfl_down_sync(full_mask, a, 1, 8);
}

/// `children_logsumexp(s, n)` by one warp (lane = the thread's lane), in lane 0: the max over the
/// warp (the order of a max does not matter; a NaN is skipped as there), then lanes 0-7 the 8 lanes
/// of `sum_exp_shifted_portable`, added in `add_exp_lanes`' order. Every lane must call it.
__device__ inline float warp_children_logsumexp(const float* s, index_t n, int lane) {
  float m = -INFINITY;
  for (index_t j = lane; j < n; j += warp_size) m = s[j] > m ? s[j] : m;
  m = warp_max(m);
  float sum = 0.f;
  if (lane < static_cast<int>(exp_sum_lanes)) {
    index_t j = 0;
    for (; j + exp_sum_lanes <= n; j += exp_sum_lanes) sum += fast_exp(s[j + lane] - m);
    if (j + lane < n) sum += fast_exp(s[j + lane] - m);
  }
  sum += __shfl_down_sync(full_mask, sum, 4, 8);  // l_i + l_(i+4)
  sum += __shfl_down_sync(full_mask, sum, 2, 8);  // (l0 + l4) + (l2 + l6), (l1 + l5) + (l3 + l7)
  sum += __shfl_down_sync(full_mask, sum, 1, 8);
  return finish_logsumexp(m, sum);
}

/// An exact search's push of the expanded node's children and its pops up to the next node to
/// expand, by the whole block, with the generic search's outcome (`push_children`, `next_node`):
///  * the open list is an unordered array (a pop takes its best key: a block-wide max, then the
///    last entry fills its place); pops come out in key order, a total order, as from the heap;
///  * the children are pushed a chunk of Threads at a time, each thread deciding its child from the
///    row's best leaves before the chunk (`exact_child_pushed`: the children push_children pushes),
///    their places by a block-wide prefix sum; thread 0 then enters the chunk's pushed leaves into
///    the best leaves in order (`keep_best_leaf`). The list overflows exactly when push_children's
///    heap would (the same children, the same capacity).
/// Thread 0 wrote the heap alone before (stop 32's quick bench: a push or pop a few dependent
/// global-memory accesses, hundreds a 256-child expansion). Ends with a barrier.
template <int Threads, class Step>
__device__ void exact_push_and_pop(const Step& step, index_t r, index_t t, std::uint64_t* open, float* best,
                                   const float* lp, index_t nb, index_t ns, int* pushed,
                                   typename cub::BlockScan<int, Threads>::TempStorage& scan,
                                   typename cub::BlockReduce<std::uint64_t, Threads>::TempStorage& reduce, int& more,
                                   index_t& expand_begin, index_t& expand_size, index_t& open_size, index_t& found,
                                   index_t& leaves, index_t& expanded, float& base, std::uint64_t& top_key,
                                   index_t& top_at, int& top_is_leaf) {
  const index_t k = step.k;
  const float from = base;
  if (threadIdx.x == 0) ++expanded;
  for (index_t c0 = 0; c0 < ns; c0 += Threads) {
    const index_t j = c0 + threadIdx.x;
    const bool push = j < ns && exact_child_pushed(step.tv, lp, from, nb, c0, j, best, leaves, k);
    int offset = 0, total = 0;
    cub::BlockScan<int, Threads>(scan).ExclusiveSum(push ? 1 : 0, offset, total);
    if (open_size + total > step.capacity) {  // the same in every thread
      if (threadIdx.x == 0) {
        step.overflow[t] = 1;
        more = 0;
      }
      __syncthreads();
      return;
    }
    if (push) open[open_size + offset] = open_heap::pack(from + lp[j], nb + j);
    pushed[threadIdx.x] = push ? 1 : 0;
    __syncthreads();  // every thread has read open_size and the best leaves; the flags are out
    if (threadIdx.x == 0) {
      open_size += total;
      for (index_t i = c0; i < ns && i < c0 + Threads; ++i)
        if (pushed[i - c0] && step.tv.child(nb + i).is_leaf) keep_best_leaf(best, leaves, k, from + lp[i]);
    }
    __syncthreads();  // the best leaves and the list's size for the next chunk; `scan` free again
  }
  for (;;) {  // pop: leaves to the output until an internal node (to expand next) or the end
    if (found >= k || open_size == 0) {  // the same in every thread
      if (threadIdx.x == 0) more = 0;
      __syncthreads();
      return;
    }
    std::uint64_t m = 0;  // below every key (see open_heap::pop_to_back)
    for (index_t i = threadIdx.x; i < open_size; i += Threads) m = open[i] > m ? open[i] : m;
    m = cub::BlockReduce<std::uint64_t, Threads>(reduce).Reduce(m, ::cuda::maximum<std::uint64_t>{});
    if (threadIdx.x == 0) top_key = m;
    __syncthreads();
    for (index_t i = threadIdx.x; i < open_size; i += Threads)
      if (open[i] == top_key) top_at = i;  // keys are distinct: one thread
    __syncthreads();
    if (threadIdx.x == 0) {
      open[top_at] = open[open_size - 1];
      --open_size;
      const float l = open_heap::lp_of(top_key);
      const child_ref c = step.tv.child(open_heap::row_of(top_key));
      top_is_leaf = c.is_leaf ? 1 : 0;
      if (c.is_leaf) {
        step.classes(r, found) = c.leaf_class;
        step.log_probs(r, found) = l;
        ++found;
      } else {
        expand_begin = c.block_begin;
        expand_size = c.block_size;
        base = l;
      }
    }
    __syncthreads();  // the pop is done; `reduce` free again
    if (!top_is_leaf) return;
  }
}

/// The searches of rows [0, step.n) of a tile, one block of Threads threads per row.
template <int Threads, class T, class View>
__global__ void __launch_bounds__(Threads) search_rows_kernel(topk_search_step<false, T, View, 1> step) {
  // The row's search state, shared: written by thread 0 (or, where named, by all) between barriers.
  __shared__ int more;                           // the row's search goes on
  __shared__ index_t expand_begin, expand_size;  // the node to expand next (its block of rows)
  __shared__ index_t open_size, found, leaves, expanded;
  __shared__ float base, lse;
  __shared__ std::uint64_t top_key;  // an exact search's pop: the best open key, and where it is
  __shared__ index_t top_at;
  __shared__ int top_is_leaf;
  __shared__ int pushed[Threads];  // an exact search's push decisions of a chunk of children
  __shared__ union {
    typename cub::BlockScan<int, Threads>::TempStorage scan;
    typename cub::BlockReduce<std::uint64_t, Threads>::TempStorage reduce;
  } temp;
  static_assert(Threads % warp_size == 0);
  constexpr index_t groups = Threads / 8;  // children scored at once
  const index_t group = threadIdx.x / 8;
  const int lane8 = static_cast<int>(threadIdx.x % 8);
  const index_t d = step.d, k = step.k;
  for (index_t t = blockIdx.x; t < step.n; t += gridDim.x) {
    const index_t r = step.row0 + t;
    std::uint64_t* open = step.open_key + t * step.capacity;
    float* best = step.leaf_lp + t * k;
    if (threadIdx.x == 0) {
      expand_begin = step.start_begin ? step.start_begin[r] : 0;
      expand_size = step.start_begin ? step.start_size[r] : step.tv.root_block_size();
      open_size = found = leaves = expanded = 0;
      base = 0.f;
      step.overflow[t] = 0;
      more = 1;
    }
    __syncthreads();
    float* lp = step.child_lp + t * step.max_block;
    const float* h = step.h + r * d;
    while (more) {
      const index_t nb = expand_begin, ns = expand_size;
      // softmax_child_scores' values, a group of 8 lanes a child (the same loop count in every
      // thread: the shuffles need the whole warp)
      for (index_t j0 = 0; j0 < ns; j0 += groups) {
        const index_t j = j0 + group;
        const bool mine = j < ns;
        const float dot = group8_dot_row8(h, step.w.row(mine ? nb + j : nb), mine ? d : 0, lane8);
        if (mine && lane8 == 0) lp[j] = score_of_dot(dot, step.bias, nb + j);
      }
      __syncthreads();
      if (threadIdx.x < warp_size) {
        const float l = warp_children_logsumexp(lp, ns, static_cast<int>(threadIdx.x));
        if (threadIdx.x == 0) lse = l;
      }
      __syncthreads();
      for (index_t j = threadIdx.x; j < ns; j += Threads) lp[j] -= lse;
      __syncthreads();
      if (step.beam > 0) {  // the generic push and pops, thread 0's, over a heap
        if (threadIdx.x == 0) {
          ++expanded;
          open_heap heap{open, open_size, step.capacity};
          index_t held = leaves, out = found, node = 0, size = 0;
          float lp_node = base;
          if (!step.push_children(heap, lp, nb, ns, lp_node, best, held)) {
            step.overflow[t] = 1;
            more = 0;
          } else {
            more = step.next_node(heap, r, out, node, size, lp_node) ? 1 : 0;
            expand_begin = node;
            expand_size = size;
          }
          open_size = heap.size;
          leaves = held;
          found = out;
          base = lp_node;
        }
        __syncthreads();
      } else {
        exact_push_and_pop<Threads>(step, r, t, open, best, lp, nb, ns, pushed, temp.scan, temp.reduce, more,
                                    expand_begin, expand_size, open_size, found, leaves, expanded, base, top_key,
                                    top_at, top_is_leaf);
      }
    }
    if (threadIdx.x == 0) step.finish_row(r, found, expanded);
    __syncthreads();  // the shared state is rewritten for the next row only after all have read it
  }
}

}  // namespace gpu

template <>
struct tree_search_tuning<::xsoftmax::cuda> {
  static constexpr bool available = true;

  template <class T, class View>
  static void run(const execution<::xsoftmax::cuda>& ex, const topk_search_step<false, T, View, 1>& step) {
    if (step.n == 0) return;
    gpu::search_rows_kernel<gpu::block_threads, T, View>
        <<<gpu::grid_rows(step.n), gpu::block_threads, 0, ex.res.stream()>>>(step);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace xsoftmax::detail
