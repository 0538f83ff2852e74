// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA runner of the hierarchical softmax's top-k search over softmax nodes
/// (detail/hierarchical/tree_search.hpp, `tree_search_tuning`): one block per row instead of one
/// thread. The search itself is the generic one, run by the block's thread 0 (`next_node`,
/// `push_children`, the open heap in global memory); what the block shares is the expansion, the
/// costly part: each thread scores children j = tid, tid + Threads, ... of the expanded node with
/// the generic `weight_row_score` (each child's dot product is its own, so the values are
/// bitwise the generic kernel's), thread 0 takes their log-sum-exp with the generic
/// `children_logsumexp` (its order),
/// and the threads subtract it. Bitwise the generic device search; the generic one is its oracle
/// in the GPU tests.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

namespace xsoftmax::detail {
namespace gpu {

/// The searches of rows [0, step.n) of a tile, one block of Threads threads per row.
template <int Threads, class T, class View>
__global__ void __launch_bounds__(Threads) search_rows_kernel(topk_search_step<false, T, View, 1> step) {
  __shared__ int more;                   // thread 0's verdict: the row's search goes on
  __shared__ index_t expand_begin, expand_size;  // the node to expand next (its block of rows)
  __shared__ float lse;
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
      for (index_t j = threadIdx.x; j < ns; j += Threads)  // softmax_child_scores' values, child by child
        lp[j] = weight_row_score(h, step.w, step.bias, nb + j);
      __syncthreads();
      if (threadIdx.x == 0) lse = children_logsumexp(lp, ns);
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
