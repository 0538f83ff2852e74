// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The update rules of the large-batch optimizers (large_batch.hpp): LARS (You, Gitman, Ginsburg
/// 2017) and LAMB (You et al. 2019). They are update rules in the sense of update_rules.hpp — so the
/// sparse optimizer runs them unchanged on a head's touched rows — plus two members that give the
/// layer-wise trust ratio:
///
///     float trust_term(float w, float g, const float* state, const row_factors&) const;
///         // the per-element value whose norm over the layer is the ratio's denominator
///     float trust_ratio(double weight_norm, double term_norm) const;   // host, once per layer
///
/// The optimizer computes both norms over the layer *before* writing anything, then runs `apply`
/// with the learning rate times the ratio. These rules are also their own options: small value
/// types whose constructors throw `invalid_argument` naming a value out of range.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <cmath>
#include <cstdint>

namespace xsoftmax {

/// LARS: momentum SGD whose per-layer learning rate is scaled by the trust ratio
///   trust = eta ||w|| / (||g|| + wd ||w||)    (1 when ||w|| or ||g|| is 0),
/// as in the paper (the scaled rate enters the momentum): v = mu v + lr trust (g + wd w); w -= v.
/// Defaults: momentum 0.9, weight_decay 0, trust_coefficient (eta) 0.001. State: v (1 value per
/// element, starting at 0).
struct lars_rule {
  float momentum = 0.9f;
  float weight_decay = 0.f;
  float trust_coefficient = 0.001f;

  static constexpr int slots = 1;
  static constexpr const char* name = "lars";
  struct row_factors {
    float lr;  ///< learning rate times the layer's trust ratio
  };

  lars_rule() = default;
  explicit lars_rule(float mu, float wd = 0.f, float eta = 0.001f)
      : momentum(mu), weight_decay(wd), trust_coefficient(eta) {
    detail::expects(std::isfinite(mu) && mu >= 0 && mu < 1, "lars_rule: momentum = ", mu, " must be in [0, 1)");
    detail::expects(std::isfinite(wd) && wd >= 0, "lars_rule: weight_decay = ", wd, " must be finite and >= 0");
    detail::expects(std::isfinite(eta) && eta > 0, "lars_rule: trust_coefficient = ", eta,
                    " must be finite and > 0");
  }
  [[nodiscard]] float initial_state(int) const { return 0.f; }
  XSOFTMAX_HD row_factors row(std::int64_t, float lr) const { return {lr}; }
  XSOFTMAX_HD void apply(float& w, float g, float* s, const row_factors& f) const {
    s[0] = momentum * s[0] + f.lr * (g + weight_decay * w);
    w -= s[0];
  }
  XSOFTMAX_HD float trust_term(float, float g, const float*, const row_factors&) const { return g; }
  [[nodiscard]] float trust_ratio(double weight_norm, double gradient_norm) const {
    if (!(weight_norm > 0) || !(gradient_norm > 0)) return 1.f;
    return static_cast<float>(trust_coefficient * weight_norm / (gradient_norm + weight_decay * weight_norm));
  }
};

/// LAMB: Adam's moments with bias correction, the update u = m^ / (sqrt(v^) + eps) + wd w, and the
/// layer's trust ratio ||w|| / ||u|| (1 when either is 0): w -= lr trust u, where
/// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, m^ = m / (1 - b1^t), v^ = v / (1 - b2^t)
/// (no correction when `bias_correction` is false). Defaults: beta1 0.9, beta2 0.999, eps 1e-6,
/// weight_decay 0.01, bias correction on. State: m, v (2 values per element, starting at 0).
struct lamb_rule {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.01f;
  bool bias_correction = true;

  static constexpr int slots = 2;
  static constexpr const char* name = "lamb";
  struct row_factors {
    float lr;  ///< learning rate times the layer's trust ratio
    float inv_bias1;  ///< 1 / (1 - b1^t)
    float inv_sqrt_bias2;  ///< 1 / sqrt(1 - b2^t)
  };

  lamb_rule() = default;
  lamb_rule(float b1, float b2, float eps_ = 1e-6f, float wd = 0.01f, bool correct = true)
      : beta1(b1), beta2(b2), eps(eps_), weight_decay(wd), bias_correction(correct) {
    detail::expects(std::isfinite(b1) && b1 >= 0 && b1 < 1, "lamb_rule: beta1 = ", b1, " must be in [0, 1)");
    detail::expects(std::isfinite(b2) && b2 >= 0 && b2 < 1, "lamb_rule: beta2 = ", b2, " must be in [0, 1)");
    detail::expects(std::isfinite(eps_) && eps_ > 0, "lamb_rule: eps = ", eps_, " must be finite and > 0");
    detail::expects(std::isfinite(wd) && wd >= 0, "lamb_rule: weight_decay = ", wd, " must be finite and >= 0");
  }
  [[nodiscard]] float initial_state(int) const { return 0.f; }
  XSOFTMAX_HD row_factors row(std::int64_t t, float lr) const {
    if (!bias_correction) return {lr, 1.f, 1.f};
    const double td = static_cast<double>(t);
    return {lr, static_cast<float>(1.0 / (1.0 - ::pow(static_cast<double>(beta1), td))),
            static_cast<float>(1.0 / ::sqrt(1.0 - ::pow(static_cast<double>(beta2), td)))};
  }
  /// The update direction u from the new moments m, v (shared by `apply` and `trust_term`, so the
  /// norm is taken of exactly the values the step applies).
  XSOFTMAX_HD float direction(float w, float m, float v, const row_factors& f) const {
    return (m * f.inv_bias1) / (::sqrtf(v) * f.inv_sqrt_bias2 + eps) + weight_decay * w;
  }
  XSOFTMAX_HD void apply(float& w, float g, float* s, const row_factors& f) const {
    s[0] = beta1 * s[0] + (1.f - beta1) * g;
    s[1] = beta2 * s[1] + (1.f - beta2) * g * g;
    w -= f.lr * direction(w, s[0], s[1], f);
  }
  XSOFTMAX_HD float trust_term(float w, float g, const float* s, const row_factors& f) const {
    return direction(w, beta1 * s[0] + (1.f - beta1) * g, beta2 * s[1] + (1.f - beta2) * g * g, f);
  }
  [[nodiscard]] float trust_ratio(double weight_norm, double update_norm) const {
    if (!(weight_norm > 0) || !(update_norm > 0)) return 1.f;
    return static_cast<float>(weight_norm / update_norm);
  }
};

}  // namespace xsoftmax
