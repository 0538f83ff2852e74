// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Online log-sum-exp over column chunks of a score matrix that is never materialised whole: each
/// chunk updates a running (max, sum of exp) per row and captures the target's logit when the target
/// falls inside the chunk. The epilogue of the dense-scores primitive.

#include <xsoftmax/detail/primitives/parallel_for.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace xsoftmax::detail {

/// Running log-sum-exp state of `rows` rows.
struct online_lse_state {
  std::vector<float> max;
  std::vector<float> sum;
  std::vector<float> target_logit;

  explicit online_lse_state(index_t rows)
      : max(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity()),
        sum(static_cast<std::size_t>(rows), 0.f),
        target_logit(static_cast<std::size_t>(rows), 0.f) {}

  [[nodiscard]] float lse(index_t r) const { return max[r] + std::log(sum[r]); }
};

/// Folds scores `s` (rows x cols, leading dimension `lds`) for classes [col_offset, col_offset + cols)
/// into `state`. `targets` may be null (no target capture). Scores may be -inf (a masked class
/// contributes nothing), as long as every row sees one finite score before `lse` is read.
template <class Policy>
void online_lse_update(const Policy& policy, const float* s, index_t rows, index_t cols, index_t lds,
                       index_t col_offset, const index_t* targets, online_lse_state& state) {
  float* mx = state.max.data();
  float* sm = state.sum.data();
  float* tl = state.target_logit.data();
  parallel_for(policy, rows, [=](index_t r) {
    const float* row = s + r * lds;
    float m = mx[r];
    for (index_t j = 0; j < cols; ++j) m = row[j] > m ? row[j] : m;
    // Masked scores are -inf (selective softmax). While a row has seen nothing finite, its state
    // stays (max -inf, sum 0): -inf - -inf would be NaN. Finite inputs never take this branch.
    if (m != -std::numeric_limits<float>::infinity()) {
      float acc = sm[r] * std::exp(mx[r] - m);  // rescale what came before to the new max
      for (index_t j = 0; j < cols; ++j) acc += std::exp(row[j] - m);
      mx[r] = m;
      sm[r] = acc;
    }
    if (targets) {
      const index_t t = targets[r] - col_offset;
      if (t >= 0 && t < cols) tl[r] = row[t];
    }
  });
}

/// log-sum-exp of one row of `n` scores.
inline float row_logsumexp(const float* s, index_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (index_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  float acc = 0.f;
  for (index_t j = 0; j < n; ++j) acc += std::exp(s[j] - m);
  return m + std::log(acc);
}

}  // namespace xsoftmax::detail
