// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `for_each_score_row(ex, x, c, on_row)`: on_row(r, s) for every row r of x, with s the row's
/// scores x_r . c_j against every row j of c -- a GEMM followed by a pass over each row of its
/// result (the k-means assignment's top-1, the IVF probes' top-nprobe), without keeping the
/// whole score matrix.
///
/// Generic form (every backend): tiles of rows whose scores fit 4M floats, one GEMM per tile
/// (`dense_scores`) then one parallel pass over the tile's rows. The omp backend with a CBLAS
/// runs it in one parallel region instead: each thread takes tiles of rows whose scores fit its
/// own cache-sized buffer, computes them with a one-thread CBLAS call and passes over them at
/// once. Why: with 4M-float tiles the scores go to memory and back three times (OpenBLAS's beta = 0
/// pass zeroes C, the kernel writes it, the pass reads it): in an `ivf_class_probes` KNN-graph
/// build at N = 1e5 (k-means of 64,000 rows into 1,000 lists, 10 rounds) the zeroing alone took
/// 10.7 % and the top-1 5 % (perf; bench/RESULTS.md, "KNN graph builds"), while smaller tiles as
/// separate calls cost more in parallel regions than they saved (3.4 s -> 6.0 s a build with
/// 256K-float tiles). Results: a tile's scores are the same sums as the whole GEMM's wherever the
/// BLAS's kernel does not depend on a row's position (integer-valued inputs give the same bits on
/// every backend: tests/selective/knn_build_backends_test.cpp).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// Scores per tile of the generic form.
inline constexpr index_t score_pass_tile_floats = index_t(4) << 20;
/// Scores per thread's tile of the omp form: 1 MB, within a core's L2 and its share of L3 (the
/// class-probe build above: 64K to 1M floats within the machine's noise of each other, 16K slower:
/// below ~64 rows a call packs the centroids for too few rows).
inline constexpr index_t score_pass_cache_floats = index_t(256) << 10;

/// on_row(r0 + r, s + r * k) for each row r of a tile (an `XSOFTMAX_HD` call where the execution runs).
template <class OnRow>
struct score_row_call {
  const float* s;
  index_t k, r0;
  OnRow on_row;
  XSOFTMAX_HD void operator()(index_t r) const { on_row(r0 + r, s + r * k); }
};

/// See the file comment. `x` (n x d) and `c` (k x d, dense rows) in the execution's memory;
/// `on_row(index_t r, const float* scores)` is copied to where the execution runs.
template <class Ex, class OnRow>
void for_each_score_row(const Ex& ex_in, matrix_view<const float> x, matrix_view<const float> c, OnRow on_row) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t n = x.rows, k = c.rows, d = c.cols;
  if (n == 0 || k == 0) return;
  if constexpr (std::is_same_v<typename execution_type::backend, omp> && host::has_cblas()) {
    const index_t rows = std::max<index_t>(1, score_pass_cache_floats / k);
    const index_t tiles = (n + rows - 1) / rows;
    parallel_for(ex, tiles, [=](index_t t) {
      thread_local std::vector<float> s;  // the thread's tile of scores, kept for its next tiles
      if (s.size() < static_cast<std::size_t>(rows * k)) s.resize(static_cast<std::size_t>(rows * k));
      const index_t r0 = t * rows, rn = std::min(rows, n - r0);
      host::gemm_args g;
      g.op_b = host::op::transpose;
      g.m = rn;
      g.n = k;
      g.k = d;
      g.a = x.row(r0);
      g.lda = x.stride;
      g.b = c.data;
      g.ldb = c.stride;
      g.c = s.data();
      g.ldc = k;
      host::gemm(g);  // inside the parallel region: one thread
      for (index_t r = 0; r < rn; ++r) on_row(r0 + r, s.data() + r * k);
    });
  } else {
    const index_t tile = std::max<index_t>(1, std::min<index_t>(n, score_pass_tile_floats / k));
    typename execution_type::template vector<float> s(static_cast<std::size_t>(tile * k)), scratch;
    for (index_t r0 = 0; r0 < n; r0 += tile) {
      const index_t rn = std::min(tile, n - r0);
      dense_scores(ex, matrix_view<const float>(x.row(r0), rn, d, x.stride), c, static_cast<const float*>(nullptr), 0,
                   k, raw(s), k, scratch);
      parallel_for(ex, rn, score_row_call<OnRow>{raw(s), k, r0, on_row});
    }
  }
}

}  // namespace xsoftmax::detail
