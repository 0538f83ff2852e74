// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Online log-sum-exp over column chunks of a score matrix that is never materialised whole: each
/// chunk updates a running (max, sum of exp) per row and captures the target's logit when the target
/// falls inside the chunk. The epilogue of the dense-scores primitive, on every backend.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/exp_rows.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <thrust/memory.h>

#include <cmath>
#include <limits>
#include <type_traits>

namespace xsoftmax::detail {

/// log(sum(exp)) of a row given its running max and sum of exp(x - max).
XSOFTMAX_HD inline float finish_logsumexp(float max, float sum) { return max + ::logf(sum); }

/// Running log-sum-exp state of `rows` rows, in `Backend`'s memory (max = -inf, sum = 0,
/// target_logit = 0 to start with).
template <class Backend>
struct basic_online_lse_state {
  scratch_vector<Backend, float> max;
  scratch_vector<Backend, float> sum;
  scratch_vector<Backend, float> target_logit;

  /// On any backend: the state in `ex`'s memory, set on its stream.
  basic_online_lse_state(index_t rows, const execution<Backend>& ex)
      : max(static_cast<std::size_t>(rows), ex, -std::numeric_limits<float>::infinity()),
        sum(static_cast<std::size_t>(rows), ex, 0.f),
        target_logit(static_cast<std::size_t>(rows), ex, 0.f) {}
  /// Host backends only (and host algorithms handed a Thrust host policy).
  explicit basic_online_lse_state(index_t rows)
      : max(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity()),
        sum(static_cast<std::size_t>(rows), 0.f),
        target_logit(static_cast<std::size_t>(rows), 0.f) {}

  /// Row r's log-sum-exp (host backends only: reads the state on the host).
  [[nodiscard]] float lse(index_t r) const { return finish_logsumexp(max[r], sum[r]); }
};

/// The state of the host backends (and of host algorithms handed a Thrust host policy).
using online_lse_state = basic_online_lse_state<serial>;

/// A backend's tuned `online_lse_update`, when it has one: specialised with `available = true` and
/// `update(ex, s, rows, cols, lds, col_offset, targets, state)` (same arguments and results, up to
/// rounding). `online_lse_update_generic` stays its oracle.
template <class Backend>
struct online_lse_tuning {
  static constexpr bool available = false;
};

/// Folds scores `s` (rows x cols, leading dimension `lds`) for classes [col_offset, col_offset + cols)
/// into `state`. `targets` may be null (no target capture). Scores may be -inf (a masked class
/// contributes nothing), as long as every row sees one finite score before `lse` is read. The generic
/// version: one row per iteration of a parallel loop.
template <class Ex, class State>
void online_lse_update_generic(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds,
                               index_t col_offset, const index_t* targets, State& state) {
  float* mx = thrust::raw_pointer_cast(state.max.data());
  float* sm = thrust::raw_pointer_cast(state.sum.data());
  float* tl = thrust::raw_pointer_cast(state.target_logit.data());
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float* row = s + r * lds;
    float m = mx[r];
    XSOFTMAX_SIMD_REDUCTION(max, m)
    for (index_t j = 0; j < cols; ++j) m = row[j] > m ? row[j] : m;
    // Masked scores are -inf (selective softmax). While a row has seen nothing finite, its state
    // stays (max -inf, sum 0): -inf - -inf would be NaN. Finite inputs never take this branch.
    if (m != -INFINITY) {
      const float acc = sum_exp_shifted(row, cols, m);
      sm[r] = sm[r] * fast_exp(mx[r] - m) + acc;  // what came before, rescaled to the new max
      mx[r] = m;
    }
    if (targets) {
      const index_t t = targets[r] - col_offset;
      if (t >= 0 && t < cols) tl[r] = row[t];
    }
  });
}

/// `online_lse_update_generic`'s update (the same state, bitwise) that also leaves each score's
/// exponential in place: s[r, j] <- e^(s[r, j] - shift[r]), with shift[r] the row's running max
/// after this chunk, which the sum was taken against (a row that has seen no finite score yet: -inf,
/// and zeros in s). The dense softmax's backward then takes a kept chunk's p_j u as
/// s[r, j] u e^(shift[r] - lse) inside its GEMMs, with no second exponential (dense_softmax.hpp).
/// Generic only: the tuned dense kernels keep the scores themselves.
template <class Ex, class State>
void online_lse_update_keeping_exp(const Ex& ex, float* s, index_t rows, index_t cols, index_t lds,
                                   index_t col_offset, const index_t* targets, State& state, float* shift) {
  float* mx = thrust::raw_pointer_cast(state.max.data());
  float* sm = thrust::raw_pointer_cast(state.sum.data());
  float* tl = thrust::raw_pointer_cast(state.target_logit.data());
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    float* row = s + r * lds;
    if (targets) {  // before the score is replaced
      const index_t t = targets[r] - col_offset;
      if (t >= 0 && t < cols) tl[r] = row[t];
    }
    float m = mx[r];
    XSOFTMAX_SIMD_REDUCTION(max, m)
    for (index_t j = 0; j < cols; ++j) m = row[j] > m ? row[j] : m;
    if (m != -INFINITY) {
      const float acc = exp_shifted_sum(row, cols, m);
      sm[r] = sm[r] * fast_exp(mx[r] - m) + acc;
      mx[r] = m;
    } else {
      for (index_t j = 0; j < cols; ++j) row[j] = 0.f;
    }
    shift[r] = m;
  });
}

/// `online_lse_update_generic`'s problem, solved by the backend's tuned version when it has one.
template <class Ex, class State>
void online_lse_update(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds, index_t col_offset,
                       const index_t* targets, State& state) {
  using tuning = online_lse_tuning<typename std::decay_t<decltype(as_execution(ex))>::backend>;
  if constexpr (tuning::available) tuning::update(as_execution(ex), s, rows, cols, lds, col_offset, targets, state);
  else online_lse_update_generic(ex, s, rows, cols, lds, col_offset, targets, state);
}

/// out[r] = the log-sum-exp of row r of `state` (rows entries in the execution's memory).
template <class Ex, class State>
void online_lse_finish(const Ex& ex, const State& state, index_t rows, float* out) {
  const float* mx = thrust::raw_pointer_cast(state.max.data());
  const float* sm = thrust::raw_pointer_cast(state.sum.data());
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, { out[r] = finish_logsumexp(mx[r], sm[r]); });
}

/// log-sum-exp of one row of `n` scores.
XSOFTMAX_HD inline float row_logsumexp(const float* s, index_t n) {
  float m = -INFINITY;
  for (index_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  float acc = 0.f;
  for (index_t j = 0; j < n; ++j) acc += ::expf(s[j] - m);
  return m + ::logf(acc);
}

}  // namespace xsoftmax::detail
