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
