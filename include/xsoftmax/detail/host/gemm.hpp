// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host single-precision GEMM, row-major: C = alpha * op(A) * op(B) + beta * C.
/// Through CBLAS when the build found one (`XSOFTMAX_HAS_CBLAS`), a cache-blocked loop otherwise.
/// Both are always compiled where possible so tests can compare them.

#include <xsoftmax/config.hpp>

#include <algorithm>
#include <cstddef>

#if defined(XSOFTMAX_HAS_CBLAS)
#include <cblas.h>
#endif

namespace xsoftmax::detail::host {

/// Whether an operand is used as stored or transposed.
enum class op { none, transpose };

/// Shape and operands of one row-major GEMM: C(m x n) = alpha * op(A)(m x k) * op(B)(k x n) + beta * C.
struct gemm_args {
  op op_a = op::none;
  op op_b = op::none;
  index_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  const float* a = nullptr;
  index_t lda = 0;
  const float* b = nullptr;
  index_t ldb = 0;
  float beta = 0.f;
  float* c = nullptr;
  index_t ldc = 0;
  /// The operands carry no more precision than a 16-bit storage type (weights widened from
  /// bf16/fp16): a backend may run the product on reduced-precision units (TF32 tensor cores on
  /// cuda; fp32 accumulation always). Host backends compute in fp32 regardless.
  bool low_precision_inputs = false;
};

/// Rows [row_begin, row_end) of C by a cache-blocked loop. Each C element is summed over k in
/// ascending order, so results do not depend on how rows are split among threads.
inline void gemm_blocked_rows(const gemm_args& g, index_t row_begin, index_t row_end) {
  constexpr index_t kc = 256;  // k-panel: a panel of B stays in L2 while rows stream past it
  constexpr index_t nc = 512;
  auto a_at = [&](index_t i, index_t p) {
    return g.op_a == op::none ? g.a[i * g.lda + p] : g.a[p * g.lda + i];
  };
  for (index_t i = row_begin; i < row_end; ++i) {
    float* c_row = g.c + i * g.ldc;
    if (g.beta == 0.f) {
      std::fill(c_row, c_row + g.n, 0.f);
    } else if (g.beta != 1.f) {
      for (index_t j = 0; j < g.n; ++j) c_row[j] *= g.beta;
    }
  }
  for (index_t j0 = 0; j0 < g.n; j0 += nc) {
    const index_t j1 = std::min(g.n, j0 + nc);
    for (index_t p0 = 0; p0 < g.k; p0 += kc) {
      const index_t p1 = std::min(g.k, p0 + kc);
      for (index_t i = row_begin; i < row_end; ++i) {
        float* c_row = g.c + i * g.ldc;
        if (g.op_b == op::none) {
          // C[i, j] += A[i, p] * B[p, j]: the inner loop runs along a row of B (vectorises).
          for (index_t p = p0; p < p1; ++p) {
            const float aip = g.alpha * a_at(i, p);
            const float* b_row = g.b + p * g.ldb;
            for (index_t j = j0; j < j1; ++j) c_row[j] += aip * b_row[j];
          }
        } else {
          // C[i, j] += dot(A[i, :], B[j, :]): both operands are contiguous along p.
          for (index_t j = j0; j < j1; ++j) {
            const float* b_row = g.b + j * g.ldb;
            float acc = 0.f;
            if (g.op_a == op::none) {
              const float* a_row = g.a + i * g.lda;
              for (index_t p = p0; p < p1; ++p) acc += a_row[p] * b_row[p];
            } else {
              for (index_t p = p0; p < p1; ++p) acc += a_at(i, p) * b_row[p];
            }
            c_row[j] += g.alpha * acc;
          }
        }
      }
    }
  }
}

/// The whole GEMM by the blocked loop on the calling thread.
inline void gemm_blocked(const gemm_args& g) { gemm_blocked_rows(g, 0, g.m); }

/// True when this build calls a CBLAS for `gemm`.
[[nodiscard]] constexpr bool has_cblas() {
#if defined(XSOFTMAX_HAS_CBLAS)
  return true;
#else
  return false;
#endif
}

#if defined(XSOFTMAX_HAS_CBLAS)
/// The whole GEMM through CBLAS (which may use its own threads outside our parallel regions).
inline void gemm_cblas(const gemm_args& g) {
  cblas_sgemm(CblasRowMajor, g.op_a == op::none ? CblasNoTrans : CblasTrans,
              g.op_b == op::none ? CblasNoTrans : CblasTrans, static_cast<int>(g.m),
              static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, g.a, static_cast<int>(g.lda), g.b,
              static_cast<int>(g.ldb), g.beta, g.c, static_cast<int>(g.ldc));
}
#endif

/// One GEMM on the calling thread: CBLAS when available, the blocked loop otherwise.
inline void gemm(const gemm_args& g) {
  if (g.m == 0 || g.n == 0) return;
#if defined(XSOFTMAX_HAS_CBLAS)
  gemm_cblas(g);
#else
  gemm_blocked(g);
#endif
}

}  // namespace xsoftmax::detail::host
