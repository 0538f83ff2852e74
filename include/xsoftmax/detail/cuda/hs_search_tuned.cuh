// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA runner of the hierarchical softmax's top-k search over softmax nodes
/// (detail/hierarchical/tree_search.hpp, `tree_search_tuning`): one block per row instead of one
/// thread. The search itself is the generic one, run by the block's thread 0 (`next_node`,
/// `push_children`, the open heap in global memory); what the block shares is the expansion:
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
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

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
  for (int o = warp_size / 2; o > 0; o >>= 1) {
    const float x = __shfl_xor_sync(full_mask, m, o);
    m = x > m ? x : m;
  }
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

/// The searches of rows [0, step.n) of a tile, one block of Threads threads per row.
template <int Threads, class T, class View>
__global__ void __launch_bounds__(Threads) search_rows_kernel(topk_search_step<false, T, View, 1> step) {
  __shared__ int more;                   // thread 0's verdict: the row's search goes on
  __shared__ index_t expand_begin, expand_size;  // the node to expand next (its block of rows)
  __shared__ float lse;
  static_assert(Threads % warp_size == 0);
  constexpr index_t groups = Threads / 8;  // children scored at once
  const index_t group = threadIdx.x / 8;
  const int lane8 = static_cast<int>(threadIdx.x % 8);
  const index_t d = step.d;
  for (index_t t = blockIdx.x; t < step.n; t += gridDim.x) {
    const index_t r = step.row0 + t;
    // The search's state, thread 0's alone (as one thread's in the generic kernel).
    open_heap heap{step.open_key + t * step.capacity, 0, step.capacity};
    index_t found = 0, leaves = 0, node = 0, size = 0, expanded = 0;
    float base = 0.f;
    if (threadIdx.x == 0) {
      node = step.start_begin ? step.start_begin[r] : 0;
      size = step.start_begin ? step.start_size[r] : step.tv.root_block_size();
      step.overflow[t] = 0;
      expand_begin = node;
      expand_size = size;
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
      if (threadIdx.x == 0) {
        ++expanded;
        if (!step.push_children(heap, lp, nb, ns, base, step.leaf_lp + t * step.k, leaves)) {
          step.overflow[t] = 1;
          more = 0;
        } else {
          more = step.next_node(heap, r, found, node, size, base) ? 1 : 0;
          expand_begin = node;
          expand_size = size;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) step.finish_row(r, found, expanded);
    __syncthreads();  // `more` and the node are rewritten for the next row only after all have read them
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
