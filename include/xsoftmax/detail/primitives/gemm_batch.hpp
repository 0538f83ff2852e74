// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Batches of many small independent fp32 GEMMs (disjoint outputs, e.g. the list-pair score
/// blocks of an IVF search) on an execution, optionally each group of them followed by a pass over
/// rows that reads their outputs. Host backends run one whole group per thread, its GEMMs
/// single-threaded and then its rows, while the group's scores are still in cache: a threaded BLAS
/// call per small GEMM costs a parallel region each and gains little, and a batch-wide pass after
/// all GEMMs reads every score back from memory. A device backend queues every GEMM on its stream
/// and then runs one parallel pass over all rows. Both give the same results: the same GEMM calls,
/// the same per-row work.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>

namespace xsoftmax::detail {

/// The arguments of one score block of a batch: C (m x n, leading dimension ldc) = A B^T, A being
/// m rows and B n rows of width k (leading dimensions lda, ldb).
inline host::gemm_args score_block_gemm(const float* a, index_t lda, index_t m, const float* b, index_t ldb, index_t n,
                                        index_t k, float* c, index_t ldc) {
  host::gemm_args g;
  g.op_b = host::op::transpose;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  return g;
}

/// The GEMMs g[0 .. count) (`g` on the host; their operands in the execution's memory).
template <class Ex>
void gemm_batch(const Ex& ex_in, const host::gemm_args* g, index_t count) {
  const auto& ex = as_execution(ex_in);
  using backend = typename std::decay_t<decltype(ex)>::backend;
  if constexpr (is_host_backend<backend>) {
    parallel_for(ex, count, [=](index_t i) { gemm(serial_execution(), g[i]); });
  } else {
    for (index_t i = 0; i < count; ++i) gemm(ex, g[i]);
  }
}

/// `f(first + i)`: a row pass started at row `first`.
template <class RowFn>
struct rows_from {
  RowFn f;
  index_t first;
  XSOFTMAX_HD void operator()(index_t i) const { f(first + i); }
};

/// Group i (of `groups`) is the GEMMs g[gemm_at[i] .. gemm_at[i + 1]) and then row_fn(r) for r in
/// [row_at[i], row_at[i + 1]), which may read those GEMMs' outputs (and no other group's). `g`,
/// `gemm_at` and `row_at` are on the host; `row_fn` is an `XSOFTMAX_HD` function object.
template <class Ex, class RowFn>
void gemm_groups_then_rows(const Ex& ex_in, const host::gemm_args* g, const index_t* gemm_at, const index_t* row_at,
                           index_t groups, RowFn row_fn) {
  if (groups <= 0) return;
  const auto& ex = as_execution(ex_in);
  using backend = typename std::decay_t<decltype(ex)>::backend;
  if constexpr (is_host_backend<backend>) {
    parallel_for(ex, groups, [=](index_t i) {
      for (index_t j = gemm_at[i]; j < gemm_at[i + 1]; ++j) gemm(serial_execution(), g[j]);
      for (index_t r = row_at[i]; r < row_at[i + 1]; ++r) row_fn(r);
    });
  } else {
    for (index_t j = gemm_at[0]; j < gemm_at[groups]; ++j) gemm(ex, g[j]);
    parallel_for(ex, row_at[groups] - row_at[0], rows_from<RowFn>{row_fn, row_at[0]});
  }
}

}  // namespace xsoftmax::detail
