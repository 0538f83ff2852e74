// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What the two ways of scoring a level's node runs share: the step's buffers as the loops see
/// them (`node_run_data`), the node forms' scalar functions, and how a host backend runs many
/// small independent tasks side by side while a device backend issues them one after another.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/run_plan.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>

#include <cmath>

namespace xsoftmax::detail {

/// The buffers of one hierarchical-softmax step, in the execution's memory, as the per-level
/// primitives read and write them. Rows are the sorted packed rows; `child` holds each row's
/// child at the level being processed.
template <class T>
struct node_run_data {
  const float* h = nullptr;          ///< rows x dim, fp32
  index_t dim = 0;
  matrix_view<const T> w;            ///< the head's weights, storage type T, read in place
  const T* bias = nullptr;           ///< may be null
  const index_t* child = nullptr;    ///< rows: the child each row's target takes at this level
  const float* upstream = nullptr;   ///< rows: dLoss/dloss_r. Null: forward only
  float* loss = nullptr;             ///< rows; receives += -log p(child | node)
  float* grad_h = nullptr;           ///< rows x dim; receives += dLoss/dh (null: forward only)
  float* grad_w = nullptr;           ///< gradient rows x dim, written at each run's grad_offset
  float* grad_b = nullptr;           ///< gradient rows (may be null)
  float* scratch = nullptr;          ///< the level's gather-path values (node_run::scratch_offset)
  [[nodiscard]] XSOFTMAX_HD bool backward() const { return grad_w != nullptr; }
};

// The node forms' scalar functions, each from one e = exp(-|x|) (`fast_exp`, within 2 ulp of
// expf) and log(1 + e) (`fast_log1p_unit`, within 2.4 ulp): no library call per (sample, node)
// pair, where libm's expf + log1pf were ~110 instructions, a fifth of a search's expansion.
// softplus within ~3 ulp of float64, sigmoid within ~3 ulp; every path (training, search,
// log_distribution, the cuda tuned kernel) uses these, so they agree with each other bitwise.

/// log(1 + exp(x)) without overflow: -log sigmoid(-x) = max(x, 0) + log1p(exp(-|x|)).
XSOFTMAX_HD inline float softplus(float x) {
  const float t = fast_log1p_unit(fast_exp(x > 0.f ? -x : x));
  return x > 0.f ? x + t : t;
}
/// 1 / (1 + exp(-x)), as 1 / (1 + e) for x > 0 and e / (1 + e) otherwise (e = exp(-|x|): no
/// overflow for x < -88).
XSOFTMAX_HD inline float sigmoid(float x) {
  const float e = fast_exp(x > 0.f ? -x : x);
  return x > 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

/// minus = softplus(-x), plus = softplus(x), bitwise as `softplus` gives them, from one exp and one
/// log1p: both are max(+-x, 0) + log1p(exp(-|x|)).
XSOFTMAX_HD inline void softplus_pair(float x, float& minus, float& plus) {
  const float t = fast_log1p_unit(fast_exp(x > 0.f ? -x : x));
  minus = x > 0.f ? t : -x + t;
  plus = x > 0.f ? x + t : t;
}

/// A sigmoid node's term for a sample whose path takes the `first` child, from its score s: returns
/// the loss softplus(first ? -s : s) and, when `dscore` is not null, sets it to dLoss/ds =
/// sigmoid(s) - [first]; bitwise `softplus` and `sigmoid`'s values, from one exp and one log1p.
XSOFTMAX_HD inline float sigmoid_node_loss(float s, bool first, float* dscore) {
  const float e = fast_exp(s > 0.f ? -s : s);
  const float t = fast_log1p_unit(e);
  const float x = first ? -s : s;
  if (dscore) *dscore = (s > 0.f ? 1.f / (1.f + e) : e / (1.f + e)) - (first ? 1.f : 0.f);
  return x > 0.f ? x + t : t;
}

/// Lanes of the group forms below.
inline constexpr index_t node_lanes = 8;

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
namespace avx2 {
/// `sigmoid_node_loss` on 8 lanes, every lane bitwise the scalar value (blends for the selects).
__attribute__((target("avx2"), noinline)) inline void sigmoid_node_loss8(const float* s_in, const float* first_in,
                                                                        float* loss, float* dscore) {
  const __m256 s = _mm256_loadu_ps(s_in), zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f);
  const __m256 first = _mm256_cmp_ps(_mm256_loadu_ps(first_in), zero, _CMP_NEQ_UQ);
  const __m256 neg_s = _mm256_xor_ps(s, _mm256_set1_ps(-0.f));
  const __m256 pos = _mm256_cmp_ps(s, zero, _CMP_GT_OQ);
  const __m256 e = fast_exp(_mm256_blendv_ps(s, neg_s, pos));
  const __m256 t = fast_log1p_unit(e);
  const __m256 x = _mm256_blendv_ps(s, neg_s, first);
  const __m256 d = _mm256_add_ps(one, e);
  const __m256 sg = _mm256_blendv_ps(_mm256_div_ps(e, d), _mm256_div_ps(one, d), pos);
  _mm256_storeu_ps(dscore, _mm256_sub_ps(sg, _mm256_and_ps(first, one)));
  _mm256_storeu_ps(loss, _mm256_blendv_ps(t, _mm256_add_ps(x, t), _mm256_cmp_ps(x, zero, _CMP_GT_OQ)));
}

/// `softplus_pair` on 8 lanes, bitwise.
__attribute__((target("avx2"), noinline)) inline void softplus_pair8(const float* x_in, float* minus, float* plus) {
  const __m256 x = _mm256_loadu_ps(x_in), zero = _mm256_setzero_ps();
  const __m256 neg_x = _mm256_xor_ps(x, _mm256_set1_ps(-0.f));
  const __m256 pos = _mm256_cmp_ps(x, zero, _CMP_GT_OQ);
  const __m256 t = fast_log1p_unit(fast_exp(_mm256_blendv_ps(x, neg_x, pos)));
  _mm256_storeu_ps(minus, _mm256_blendv_ps(_mm256_add_ps(neg_x, t), t, pos));
  _mm256_storeu_ps(plus, _mm256_blendv_ps(t, _mm256_add_ps(x, t), pos));
}
}  // namespace avx2
#endif

/// loss[j] = sigmoid_node_loss(s[j], first[j] != 0, &dscore[j]) for j < node_lanes: 8 AVX2 lanes
/// when the host CPU has them, bitwise the same values.
XSOFTMAX_HD inline void sigmoid_node_loss8(const float* s, const float* first, float* loss, float* dscore) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx2) return avx2::sigmoid_node_loss8(s, first, loss, dscore);
#endif
  for (index_t j = 0; j < node_lanes; ++j) loss[j] = sigmoid_node_loss(s[j], first[j] != 0.f, dscore + j);
}

/// softplus_pair(x[j], minus[j], plus[j]) for j < node_lanes (AVX2 lanes when the CPU has them).
XSOFTMAX_HD inline void softplus_pair8(const float* x, float* minus, float* plus) {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  if (row_simd::has_avx2) return avx2::softplus_pair8(x, minus, plus);
#endif
  for (index_t j = 0; j < node_lanes; ++j) softplus_pair(x[j], minus[j], plus[j]);
}

/// Runs shorter than this are run side by side on a host backend, one thread each; longer ones
/// use every thread inside one task (a GEMM, or the two passes of a long sigmoid run).
inline constexpr index_t run_parallel_inside = 256;

/// f(inner, i) for i in [0, n): on a host backend side by side on the backend's threads, each task
/// on its calling thread alone (`inner` = thrust::cpp::par); on a device backend one after another,
/// each task issuing its own device work (`inner` = `ex`).
template <class B, class F>
void for_each_task(const execution<B>& ex, index_t n, F f) {
  if constexpr (is_host_backend<B>) {
    parallel_for(ex.policy(), n, [&](index_t i) { f(thrust::cpp::par, i); });
  } else {
    for (index_t i = 0; i < n; ++i) f(ex, i);
  }
}

}  // namespace xsoftmax::detail
