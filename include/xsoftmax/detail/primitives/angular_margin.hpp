// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The pieces of an additive angular (ArcFace) or cosine (CosFace) margin that the dense softmax
/// and the per-sample pass share: the target's margin logit and its slope, clamped inverse norms,
/// normalising packed rows once per batch, and taking a gradient with respect to a normalised row
/// back through the normalisation. See `margin_options` for the definitions.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <cmath>

namespace xsoftmax::detail {

/// Norms below this are taken as this (as `torch.nn.functional.normalize`'s eps): a zero row's
/// normalised form is zero instead of NaN.
constexpr float margin_norm_floor = 1e-12f;

/// sin theta from cos theta is clamped to this in the ArcFace slope, which is sin(theta + m) /
/// sin theta and unbounded as theta -> 0.
constexpr float margin_min_sine = 1e-6f;

/// A margin's constants, trivially copyable for device functors: the logits are s cos theta_j,
/// the target's is `target_logit(cos theta_t)`.
struct margin_logits {
  margin_kind kind = margin_kind::none;
  float scale = 1.f, m = 0.f;
  float cos_m = 1.f, sin_m = 0.f;
  float threshold = -1.f;  ///< ArcFace: cos(pi - m); at or below it phi falls back to cos - sin(pi - m) m
  float fallback = 0.f;    ///< sin(pi - m) m

  /// s phi(c) (InsightFace, easy_margin = false) for ArcFace, s (c - m) for CosFace, s c for none.
  [[nodiscard]] XSOFTMAX_HD float target_logit(float c) const {
    if (kind == margin_kind::cosface) return scale * (c - m);
    if (kind != margin_kind::arcface) return scale * c;
    if (c <= threshold) return scale * (c - fallback);
    const float sine = ::sqrtf(::fmaxf(0.f, 1.f - c * c));
    return scale * (c * cos_m - sine * sin_m);
  }

  /// d target_logit / dc: s (cos m + sin m c / sin theta) on ArcFace's main branch (sin theta
  /// clamped below by `margin_min_sine`), s elsewhere.
  [[nodiscard]] XSOFTMAX_HD float target_slope(float c) const {
    if (kind != margin_kind::arcface || c <= threshold) return scale;
    const float sine = ::fmaxf(::sqrtf(::fmaxf(0.f, 1.f - c * c)), margin_min_sine);
    return scale * (cos_m + sin_m * c / sine);
  }
};

/// The constants of `o` (checked by `check_margin`).
[[nodiscard]] inline margin_logits make_margin_logits(const margin_options& o) {
  margin_logits l;
  l.kind = o.kind;
  l.scale = o.scale;
  l.m = o.m;
  if (o.kind == margin_kind::arcface) {
    const double pi = 3.14159265358979323846, m = o.m;
    l.cos_m = static_cast<float>(std::cos(m));
    l.sin_m = static_cast<float>(std::sin(m));
    l.threshold = static_cast<float>(std::cos(pi - m));
    l.fallback = static_cast<float>(std::sin(pi - m) * m);
  }
  return l;
}

/// 1 / max(sqrt(squared), margin_norm_floor).
XSOFTMAX_HD inline float clamped_inverse_norm(float squared) {
  return 1.f / ::fmaxf(::sqrtf(squared), margin_norm_floor);
}

/// Whether an inverse norm from `clamped_inverse_norm` was clamped: there x -> x / floor is linear,
/// so its gradient is not projected.
XSOFTMAX_HD inline bool norm_was_clamped(float inverse_norm) { return inverse_norm >= 1.f / margin_norm_floor; }

/// sum of x[p]^2 over d elements of any storage type, in fp32.
template <class T>
XSOFTMAX_HD inline float squared_norm(const T* x, index_t d) {
  float acc = 0.f;
  for (index_t p = 0; p < d; ++p) {
    const float v = to_float(x[p]);
    acc += v * v;
  }
  return acc;
}

/// out row r = h row r / |h_r| (out: rows x d, stride d) and inverse_norm[r] = 1 / |h_r|, clamped.
template <class Ex>
void normalize_rows(const Ex& ex, matrix_view<const float> h, float* out, float* inverse_norm) {
  const index_t d = h.cols;
  XSOFTMAX_PARALLEL_FOR(ex, h.rows, r, {
    const float* hr = h.row(r);
    const float inv = clamped_inverse_norm(squared_norm(hr, d));
    inverse_norm[r] = inv;
    for (index_t p = 0; p < d; ++p) out[r * d + p] = hr[p] * inv;
  });
}

/// inverse_norm[j] = 1 / |w_j| (clamped) for the n fp32 rows of `w`.
template <class Ex>
void row_inverse_norms(const Ex& ex, matrix_view<const float> w, float* inverse_norm) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, w.rows, j, {
    inverse_norm[j] = clamped_inverse_norm(squared_norm(w.row(j), d));
  });
}

/// grad[r] += inv_r (q_r - x^_r <x^_r, q_r>) for each of `rows` rows: the gradient with respect to
/// x_r of a loss whose gradient with respect to x^_r = x_r inv_r is q_r (`normalized`: the x^_r;
/// rows of d, stride d; the projection is skipped where the norm was clamped).
template <class Ex>
void unnormalize_gradient(const Ex& ex, index_t rows, index_t d, const float* normalized, const float* inverse_norm,
                          const float* q, float* grad) {
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float* xr = normalized + r * d;
    const float* qr = q + r * d;
    const float inv = inverse_norm[r];
    float along = 0.f;
    if (!norm_was_clamped(inv))
      for (index_t p = 0; p < d; ++p) along += xr[p] * qr[p];
    for (index_t p = 0; p < d; ++p) grad[r * d + p] += inv * (qr[p] - along * xr[p]);
  });
}

/// In place, for the n fp32 rows of `w`: g_j -= w_j inv_j^2 <w_j, g_j>, where g_j holds inv_j times
/// the gradient with respect to w^_j: afterwards g_j is the gradient with respect to w_j (rows of d,
/// stride d; unchanged where the norm was clamped).
template <class Ex>
void project_weight_gradient(const Ex& ex, matrix_view<const float> w, const float* inverse_norm, float* g) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, w.rows, j, {
    const float inv = inverse_norm[j];
    if (norm_was_clamped(inv)) return;
    const float* wr = w.row(j);
    float* gr = g + j * d;
    float along = 0.f;
    for (index_t p = 0; p < d; ++p) along += wr[p] * gr[p];
    along *= inv * inv;
    for (index_t p = 0; p < d; ++p) gr[p] -= along * wr[p];
  });
}

}  // namespace xsoftmax::detail
