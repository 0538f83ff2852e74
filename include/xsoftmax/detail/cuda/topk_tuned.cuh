// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA form of the running top-k per row (detail/primitives/row_topk.hpp,
/// `row_topk_tuning`): one block per row instead of one thread. The block first narrows the
/// chunk's columns to the few that can enter the row's k best, in parallel and coalesced; thread 0
/// then offers those to the row's heap (the generic `topk_heap`). Which columns can enter: those
/// not worse (in `topk_better`'s order) than a cutoff, the better of
///  * the heap's worst kept entry, once it holds k (a column must beat it), and
///  * when k <= Threads, the k-th best of the threads' best columns: k distinct columns of the
///    chunk are at least that good, so a column below it is not among the chunk's k best.
/// The kept set does not depend on the order of the offers (ties are broken by id), so the result
/// is the generic one's; the generic form is the oracle in the GPU tests. Should more candidates
/// pass than the block's buffer holds (many equal scores), thread 0 offers every column, as there.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/primitives/row_topk.hpp>

namespace xsoftmax::detail {
namespace gpu {

/// Candidate slots per block (score and id each).
inline constexpr int topk_candidate_slots = 2048;

/// Offers columns [0, cols) of rows [0, rows) of `s` (leading dimension lds) to each row's heap of
/// at most k entries (score sc, id ix, size sz, k entries apart); one block of Threads per row.
template <int Threads, class IdOf>
__global__ void __launch_bounds__(Threads)
    row_topk_kernel(const float* s, index_t rows, index_t cols, index_t lds, IdOf id_of, float* sc, index_t* ix,
                    index_t* sz, index_t k) {
  __shared__ float cand_s[topk_candidate_slots];
  __shared__ index_t cand_i[topk_candidate_slots];
  __shared__ float best_s[Threads];  // each thread's best column (score, id); -inf / -1 for none
  __shared__ index_t best_i[Threads];
  __shared__ float cut_s;
  __shared__ index_t cut_i;
  __shared__ int has_cut, n_cand;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = s + r * lds;
    float* hs = sc + r * k;
    index_t* hi = ix + r * k;
    float my_s = -INFINITY;
    index_t my_i = -1;
    for (index_t j = threadIdx.x; j < cols; j += Threads) {
      const float v = row[j];
      const index_t id = id_of(j);
      if (my_i < 0 || topk_better(v, id, my_s, my_i)) my_s = v, my_i = id;
    }
    best_s[threadIdx.x] = my_s;
    best_i[threadIdx.x] = my_i;
    if (threadIdx.x == 0) {
      n_cand = 0;
      has_cut = sz[r] == k ? 1 : 0;  // the heap's root is its worst entry
      if (has_cut) cut_s = hs[0], cut_i = hi[0];
    }
    __syncthreads();
    // The k-th best of the threads' best columns: the one with exactly k - 1 better ones.
    if (k <= Threads && my_i >= 0) {
      index_t better = 0;
      for (int u = 0; u < Threads; ++u)
        better += best_i[u] >= 0 && topk_better(best_s[u], best_i[u], my_s, my_i) ? 1 : 0;
      if (better == k - 1) {  // one thread at most: the order is total
        // A heap cutoff already better stays; else this one (no race: thread 0 wrote before the barrier).
        if (!has_cut || topk_better(my_s, my_i, cut_s, cut_i)) cut_s = my_s, cut_i = my_i, has_cut = 1;
      }
    }
    __syncthreads();
    const bool cut = has_cut != 0;
    const float cs = cut_s;
    const index_t ci = cut_i;
    for (index_t j = threadIdx.x; j < cols; j += Threads) {
      const float v = row[j];
      const index_t id = id_of(j);
      if (cut && topk_better(cs, ci, v, id)) continue;  // worse than the cutoff: cannot enter
      const int slot = atomicAdd(&n_cand, 1);
      if (slot < topk_candidate_slots) cand_s[slot] = v, cand_i[slot] = id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      topk_heap heap{hs, hi, sz[r]};
      if (n_cand <= topk_candidate_slots)
        for (int c = 0; c < n_cand; ++c) heap.offer(cand_s[c], cand_i[c], k);
      else
        for (index_t j = 0; j < cols; ++j) heap.offer(row[j], id_of(j), k);
      sz[r] = heap.n;
    }
    __syncthreads();  // the shared buffers are rewritten for the next row only after thread 0 is done
  }
}

}  // namespace gpu

template <>
struct row_topk_tuning<execution<::xsoftmax::cuda>> {
  static constexpr bool available = true;

  template <class IdOf, class State>
  static void update(const execution<::xsoftmax::cuda>& ex, const float* s, index_t rows, index_t cols, index_t lds,
                     IdOf id_of, State& st) {
    if (rows <= 0 || cols <= 0) return;
    gpu::row_topk_kernel<gpu::block_threads, IdOf><<<gpu::grid_rows(rows), gpu::block_threads, 0, ex.res.stream()>>>(
        s, rows, cols, lds, id_of, thrust::raw_pointer_cast(st.score.data()), thrust::raw_pointer_cast(st.index.data()),
        thrust::raw_pointer_cast(st.size.data()), st.k);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace xsoftmax::detail
