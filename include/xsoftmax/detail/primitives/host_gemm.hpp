// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A GEMM that uses the policy's threads: with a CBLAS, one call per row tile of C over the
/// policy's threads (`gemm_row_tiles`), or one call that the BLAS threads itself; without one,
/// the blocked loop split into row tiles over `parallel_for`.

#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>

#include <algorithm>

namespace xsoftmax::detail {

/// Rows [r0, r1) of `g`'s C as a GEMM of their own (the same operands, offset).
[[nodiscard]] inline host::gemm_args gemm_rows(const host::gemm_args& g, index_t r0, index_t r1) {
  host::gemm_args t = g;
  t.m = r1 - r0;
  t.a = g.op_a == host::op::none ? g.a + r0 * g.lda : g.a + r0;  // op(A)'s rows: A's rows or columns
  t.c = g.c + r0 * g.ldc;
  return t;
}

/// Rows of C each tile of `gemm_parallel` takes at least: below this a tile's call costs more
/// than it saves.
inline constexpr index_t gemm_min_tile_rows = 64;
/// m n k below which OpenBLAS runs a GEMM on one thread whatever its thread count
/// (SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD): such a GEMM's results never depend on the
/// thread count, and `gemm_parallel` keeps it one call so that they stay so.
inline constexpr double gemm_blas_single_thread_mnk = 65536.0 * 4.0;

/// Row tiles `gemm_parallel` splits `g` into for `threads` threads: one per thread (each with at
/// least `gemm_min_tile_rows` rows) for a GEMM with a long k and a small C (k >= 4 max(m, n): the
/// shape a threaded OpenBLAS runs worst) that OpenBLAS would thread anyway; 1 (one BLAS call)
/// otherwise.
[[nodiscard]] inline index_t gemm_row_tiles(const host::gemm_args& g, index_t threads) {
  const double mnk = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (threads <= 1 || mnk < gemm_blas_single_thread_mnk || g.k < 4 * std::max(g.m, g.n)) return 1;
  return std::max<index_t>(1, std::min(threads, g.m / gemm_min_tile_rows));
}

/// With a CBLAS and `threads` > 1: a GEMM with a long k and a small C split into `gemm_row_tiles`
/// row tiles over the policy, each tile one CBLAS call on its thread; every other GEMM one call
/// that the BLAS threads itself. Why: OpenBLAS threads a GEMM over tiles of C, and the full
/// softmax's hidden gradient (B x d += G (B x c) W (c x d): k = c long, C small) ran at 7-49
/// GFLOP/s on 2 threads against 100-127 split by rows (AVX2 EPYC, bench/tools/gemm_rates.py and
/// bench/RESULTS.md, "Full softmax on the CPU: blocks that keep every score"). A BLAS called inside
/// a parallel region must run on the calling thread alone (OpenMP builds of OpenBLAS do; a pthreads
/// build needs OPENBLAS_NUM_THREADS=1). Results: a split GEMM's sums depend on the thread count,
/// as a GEMM that OpenBLAS threads does (it splits C by its thread count; both only above
/// `gemm_blas_single_thread_mnk`); below it serial and omp give the same bits at every thread
/// count (tests/heads/equivalence_test.cpp). `threads` = 1: one call, threaded by the BLAS.
template <class Policy>
void gemm_parallel(const Policy& policy, const host::gemm_args& g, index_t threads = 1) {
  if (g.m == 0 || g.n == 0) return;
  if constexpr (host::has_cblas()) {
    const index_t tiles = gemm_row_tiles(g, threads);
    if (tiles <= 1) {
      host::gemm(g);
      return;
    }
    parallel_for(policy, tiles, [g, tiles](index_t t) {
      host::gemm(gemm_rows(g, g.m * t / tiles, g.m * (t + 1) / tiles));
    });
  } else {
    constexpr index_t tile = 16;
    const index_t tiles = (g.m + tile - 1) / tile;
    parallel_for(policy, tiles, [g](index_t t) {
      host::gemm_blocked_rows(g, t * tile, t * tile + tile < g.m ? t * tile + tile : g.m);
    });
  }
}

}  // namespace xsoftmax::detail
