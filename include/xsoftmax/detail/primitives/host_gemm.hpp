// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A GEMM that uses the policy's threads: with a CBLAS, one call per part of a long sum over k on
/// each of the policy's threads (`gemm_k_parts`), or one call that the BLAS threads itself; without
/// one, the blocked loop split into row tiles over `parallel_for`.

#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>

#include <algorithm>
#include <vector>

namespace xsoftmax::detail {

/// m n k below which OpenBLAS runs a GEMM on one thread whatever its thread count
/// (SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD): such a GEMM's results never depend on the
/// thread count, and `gemm_parallel` keeps it one call so that they stay so.
inline constexpr double gemm_blas_single_thread_mnk = 65536.0 * 4.0;

/// op(A)'s columns and op(B)'s rows [k0, k1) of `g`: the GEMM of that part of the sum over k,
/// beta and C as `g`'s.
[[nodiscard]] inline host::gemm_args gemm_k_range(const host::gemm_args& g, index_t k0, index_t k1) {
  host::gemm_args t = g;
  t.k = k1 - k0;
  t.a = g.op_a == host::op::none ? g.a + k0 : g.a + k0 * g.lda;  // op(A)'s columns: A's columns or rows
  t.b = g.op_b == host::op::none ? g.b + k0 * g.ldb : g.b + k0;
  return t;
}

/// Parts `gemm_parallel` splits `g`'s sum over k into for `threads` threads: one per thread for a
/// GEMM with a long k and a small C (k >= 4 max(m, n): the shape a threaded OpenBLAS runs worst)
/// that OpenBLAS would thread anyway; 1 (one BLAS call) otherwise.
[[nodiscard]] inline index_t gemm_k_parts(const host::gemm_args& g, index_t threads) {
  const double mnk = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (threads <= 1 || mnk < gemm_blas_single_thread_mnk || g.k < 4 * std::max(g.m, g.n)) return 1;
  return std::max<index_t>(1, std::min(threads, g.k / std::max(g.m, g.n)));
}

/// With a CBLAS and `threads` > 1: a GEMM with a long k and a small C split into `gemm_k_parts`
/// parts of its sum over k over the policy, each part one CBLAS call on its thread (the first into
/// C with `g`'s beta, the others into a buffer), the parts then added to C in order; every other
/// GEMM one call that the BLAS threads itself. Why: OpenBLAS threads a GEMM over tiles of C, and the
/// full softmax's hidden gradient (B x d += G (B x c) W (c x d): k = c long, C small) ran at 7-49
/// GFLOP/s on 2 threads against 100-127 split (AVX2 EPYC, bench/tools/gemm_rates.py and
/// bench/RESULTS.md, "Full softmax on the CPU: blocks that keep every score"); split by k rather than
/// by C's rows, each thread packs only its own part of both operands (by rows, each packed all of
/// W's chunk: bench/RESULTS.md, "Full softmax on the CPU: the backward from the kept exponentials").
/// A BLAS called inside a parallel region must run on the calling thread alone (OpenMP builds of
/// OpenBLAS do; a pthreads build needs OPENBLAS_NUM_THREADS=1). Results: a split GEMM's sums depend
/// on the thread count (fixed for a given count), as a GEMM that OpenBLAS threads does (it splits C
/// by its thread count; both only above `gemm_blas_single_thread_mnk`); below it serial and omp
/// give the same bits at every thread count (tests/heads/equivalence_test.cpp). `threads` = 1: one
/// call, threaded by the BLAS.
template <class Policy>
void gemm_parallel(const Policy& policy, const host::gemm_args& g, index_t threads = 1) {
  if (g.m == 0 || g.n == 0) return;
  if constexpr (host::has_cblas()) {
    const index_t parts = gemm_k_parts(g, threads);
    if (parts <= 1) {
      host::gemm(g);
      return;
    }
    const index_t mn = g.m * g.n;
    std::vector<float> partial(static_cast<std::size_t>((parts - 1) * mn));
    float* const buffer = partial.data();
    parallel_for(policy, parts, [g, parts, mn, buffer](index_t t) {
      host::gemm_args p = gemm_k_range(g, g.k * t / parts, g.k * (t + 1) / parts);
      if (t > 0) p.beta = 0.f, p.c = buffer + (t - 1) * mn, p.ldc = g.n;
      host::gemm(p);
    });
    parallel_for(policy, g.m, [g, parts, mn, buffer](index_t i) {
      float* c = g.c + i * g.ldc;
      for (index_t t = 1; t < parts; ++t) {
        const float* q = buffer + (t - 1) * mn + i * g.n;
        for (index_t j = 0; j < g.n; ++j) c[j] += q[j];
      }
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
