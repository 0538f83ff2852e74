// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA form of the running top-k per row (detail/primitives/row_topk.hpp,
/// `row_topk_tuning`): one block per row instead of one thread. The block narrows the chunk's
/// columns to the few that can enter the row's k best, in parallel and coalesced; thread 0 then
/// offers those to the row's heap (the generic `topk_heap`). Which columns can enter: those not
/// worse (in `topk_better`'s order) than a cutoff, the better of
///  * the heap's worst kept entry, once it holds k (a column must beat it), and
///  * when k <= Threads, the k-th best of the threads' best columns: k distinct columns of the
///    chunk are at least that good, so a column below it is not among the chunk's k best.
/// The second costs a pass over the row and a count over the threads' bests (Threads^2 compares a
/// row), so it is taken only where the first is missing (the row's first chunk) or lets more
/// candidates through than the block's buffer holds (then the narrowing runs again). A row whose
/// heap is full is thus read once a chunk (it was read twice, with the count every time). The kept
/// set does not depend on the order of the offers (ties are broken by id), so the result is the
/// generic one's; the generic form is the oracle in the GPU tests. Should more candidates pass
/// than the buffer holds even then (many equal scores), thread 0 offers every column, as there.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/primitives/row_topk.hpp>

namespace xsoftmax::detail {
namespace gpu {

/// Candidate slots per block (score and id each).
inline constexpr int topk_candidate_slots = 2048;

/// The block's shared narrowing state for one row: its cutoff and its candidates.
template <int Threads>
struct topk_narrowing {
  float cand_s[topk_candidate_slots];
  index_t cand_i[topk_candidate_slots];
  float best_s[Threads];  // each thread's best column (score, id); -inf / -1 for none
  index_t best_i[Threads];
  float cut_s;
  index_t cut_i;
  int has_cut, n_cand;
};

/// Raises the cutoff to the k-th best of the threads' best columns of `row` when that is better
/// (k <= Threads), and empties the candidate list. Every thread of the block calls it (barriers).
template <int Threads, class IdOf>
__device__ void raise_cut_to_thread_bests(topk_narrowing<Threads>& sh, const float* row, index_t cols, IdOf id_of,
                                          index_t k) {
  float my_s = -INFINITY;
  index_t my_i = -1;
  for (index_t j = threadIdx.x; j < cols; j += Threads) {
    const float v = row[j];
    const index_t id = id_of(j);
    if (my_i < 0 || topk_better(v, id, my_s, my_i)) my_s = v, my_i = id;
  }
  sh.best_s[threadIdx.x] = my_s;
  sh.best_i[threadIdx.x] = my_i;
  __syncthreads();  // every thread is past its caller's reads of n_cand and has_cut
  if (threadIdx.x == 0) sh.n_cand = 0;
  // The k-th best of the threads' best columns: the one with exactly k - 1 better ones.
  if (my_i >= 0) {
    index_t better = 0;
    for (int u = 0; u < Threads; ++u)
      better += sh.best_i[u] >= 0 && topk_better(sh.best_s[u], sh.best_i[u], my_s, my_i) ? 1 : 0;
    if (better == k - 1) {  // one thread at most: the order is total
      // A cutoff already better stays; else this one (thread 0 wrote none since the barrier).
      if (!sh.has_cut || topk_better(my_s, my_i, sh.cut_s, sh.cut_i))
        sh.cut_s = my_s, sh.cut_i = my_i, sh.has_cut = 1;
    }
  }
  __syncthreads();
}

/// Lists the columns of `row` not worse than the cutoff (all of them without one); the count
/// goes on past the buffer's slots, so an overflow shows. Ends with a barrier.
template <int Threads, class IdOf>
__device__ void collect_candidates(topk_narrowing<Threads>& sh, const float* row, index_t cols, IdOf id_of) {
  const bool cut = sh.has_cut != 0;
  const float cs = sh.cut_s;
  const index_t ci = sh.cut_i;
  for (index_t j = threadIdx.x; j < cols; j += Threads) {
    const float v = row[j];
    const index_t id = id_of(j);
    if (cut && topk_better(cs, ci, v, id)) continue;  // worse than the cutoff: cannot enter
    const int slot = atomicAdd(&sh.n_cand, 1);
    if (slot < topk_candidate_slots) sh.cand_s[slot] = v, sh.cand_i[slot] = id;
  }
  __syncthreads();
}

/// Offers columns [0, cols) of rows [0, rows) of `s` (leading dimension lds) to each row's heap of
/// at most k entries (score sc, id ix, size sz, k entries apart); one block of Threads per row.
template <int Threads, class IdOf>
__global__ void __launch_bounds__(Threads)
    row_topk_kernel(const float* s, index_t rows, index_t cols, index_t lds, IdOf id_of, float* sc, index_t* ix,
                    index_t* sz, index_t k) {
  __shared__ topk_narrowing<Threads> sh;
  const bool thread_bests_apply = k <= Threads;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = s + r * lds;
    float* hs = sc + r * k;
    index_t* hi = ix + r * k;
    if (threadIdx.x == 0) {
      sh.n_cand = 0;
      sh.has_cut = sz[r] == k ? 1 : 0;  // the heap's root is its worst entry
      if (sh.has_cut) sh.cut_s = hs[0], sh.cut_i = hi[0];
    }
    __syncthreads();
    // Every branch below reads shared values after a barrier: the same way for the whole block.
    bool raised = false;
    if (!sh.has_cut && thread_bests_apply) {  // no heap cutoff yet (the row's first chunk)
      raise_cut_to_thread_bests(sh, row, cols, id_of, k);
      raised = true;
    }
    collect_candidates(sh, row, cols, id_of);
    if (sh.n_cand > topk_candidate_slots && !raised && thread_bests_apply) {  // the heap's cutoff is too low
      raise_cut_to_thread_bests(sh, row, cols, id_of, k);
      collect_candidates(sh, row, cols, id_of);
    }
    if (threadIdx.x == 0) {
      topk_heap heap{hs, hi, sz[r]};
      if (sh.n_cand <= topk_candidate_slots)
        for (int c = 0; c < sh.n_cand; ++c) heap.offer(sh.cand_s[c], sh.cand_i[c], k);
      else
        for (index_t j = 0; j < cols; ++j) heap.offer(row[j], id_of(j), k);
      sz[r] = heap.n;
    }
    __syncthreads();  // the shared state is rewritten for the next row only after thread 0 is done
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
