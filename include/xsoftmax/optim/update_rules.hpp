// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The per-element update rules of the sparse optimizers (see sparse_optimizer.hpp): momentum SGD
/// (heavy ball or Nesterov), Adagrad and Adam/AdamW in the lazy form. Each rule is a plain value
/// with `__host__ __device__` members, so one rule runs on every backend:
///
///     static constexpr int slots;                       // state values per weight element
///     row_factors row(std::int64_t t, float lr) const;   // per touched row, t = its update count
///     void apply(float& w, float g, float* state, const row_factors&) const;   // state[0..slots)
///     float initial_state(int slot) const;               // the state's value before any update
///
/// `t` counts the updates of *that row* (1 on its first): "lazy" as `torch.optim.SparseAdam` —
/// a row's state decays and its bias correction advances only on the steps that touch it.
/// Constructors throw `invalid_argument` naming a value out of range.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <cmath>
#include <cstdint>

namespace xsoftmax {

/// SGD with momentum: v = mu v + (g + wd w); w -= lr (Nesterov: g + wd w + mu v; else v). With
/// mu = 0 it is plain SGD with L2 weight decay. State: v (1 value per element).
struct momentum_rule {
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.f;

  static constexpr int slots = 1;
  static constexpr const char* name = "momentum";
  struct row_factors {
    float lr;
  };

  momentum_rule() = default;
  explicit momentum_rule(float mu, bool nesterov_ = false, float wd = 0.f)
      : momentum(mu), nesterov(nesterov_), weight_decay(wd) {
    detail::expects(std::isfinite(mu) && mu >= 0 && mu < 1, "momentum_rule: momentum = ", mu, " must be in [0, 1)");
    detail::expects(std::isfinite(wd) && wd >= 0, "momentum_rule: weight_decay = ", wd, " must be finite and >= 0");
  }
  [[nodiscard]] float initial_state(int) const { return 0.f; }
  XSOFTMAX_HD row_factors row(std::int64_t, float lr) const { return {lr}; }
  XSOFTMAX_HD void apply(float& w, float g, float* s, const row_factors& f) const {
    const float d = g + weight_decay * w;
    s[0] = momentum * s[0] + d;
    w -= f.lr * (nesterov ? d + momentum * s[0] : s[0]);
  }
};

/// Adagrad: a += (g + wd w)^2; w -= lr (g + wd w) / (sqrt(a) + eps). State: a (1 value per
/// element), starting at `initial_accumulator`.
struct adagrad_rule {
  float eps = 1e-10f;
  float weight_decay = 0.f;
  float initial_accumulator = 0.f;

  static constexpr int slots = 1;
  static constexpr const char* name = "adagrad";
  struct row_factors {
    float lr;
  };

  adagrad_rule() = default;
  explicit adagrad_rule(float eps_, float wd = 0.f, float initial = 0.f)
      : eps(eps_), weight_decay(wd), initial_accumulator(initial) {
    detail::expects(std::isfinite(eps_) && eps_ > 0, "adagrad_rule: eps = ", eps_, " must be finite and > 0");
    detail::expects(std::isfinite(wd) && wd >= 0, "adagrad_rule: weight_decay = ", wd, " must be finite and >= 0");
    detail::expects(std::isfinite(initial) && initial >= 0, "adagrad_rule: initial_accumulator = ", initial,
                    " must be finite and >= 0");
  }
  [[nodiscard]] float initial_state(int) const { return initial_accumulator; }
  XSOFTMAX_HD row_factors row(std::int64_t, float lr) const { return {lr}; }
  XSOFTMAX_HD void apply(float& w, float g, float* s, const row_factors& f) const {
    const float d = g + weight_decay * w;
    s[0] += d * d;
    w -= f.lr * d / (::sqrtf(s[0]) + eps);
  }
};

/// Adam (`decoupled = false`: the decay is added to the gradient) or AdamW (`decoupled = true`:
/// w -= lr wd w before the Adam step), lazy: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
/// w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), t the row's update count. State: m, v.
struct adam_rule {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool decoupled = true;

  static constexpr int slots = 2;
  static constexpr const char* name = "adam";
  struct row_factors {
    float lr;
    float inv_bias1;  ///< 1 / (1 - b1^t)
    float inv_sqrt_bias2;  ///< 1 / sqrt(1 - b2^t)
  };

  adam_rule() = default;
  adam_rule(float b1, float b2, float eps_ = 1e-8f, float wd = 0.f, bool decoupled_ = true)
      : beta1(b1), beta2(b2), eps(eps_), weight_decay(wd), decoupled(decoupled_) {
    detail::expects(std::isfinite(b1) && b1 >= 0 && b1 < 1, "adam_rule: beta1 = ", b1, " must be in [0, 1)");
    detail::expects(std::isfinite(b2) && b2 >= 0 && b2 < 1, "adam_rule: beta2 = ", b2, " must be in [0, 1)");
    detail::expects(std::isfinite(eps_) && eps_ > 0, "adam_rule: eps = ", eps_, " must be finite and > 0");
    detail::expects(std::isfinite(wd) && wd >= 0, "adam_rule: weight_decay = ", wd, " must be finite and >= 0");
  }
  [[nodiscard]] float initial_state(int) const { return 0.f; }
  XSOFTMAX_HD row_factors row(std::int64_t t, float lr) const {
    const double td = static_cast<double>(t);
    return {lr, static_cast<float>(1.0 / (1.0 - ::pow(static_cast<double>(beta1), td))),
            static_cast<float>(1.0 / ::sqrt(1.0 - ::pow(static_cast<double>(beta2), td)))};
  }
  XSOFTMAX_HD void apply(float& w, float g, float* s, const row_factors& f) const {
    if (decoupled) w -= f.lr * weight_decay * w;
    else g += weight_decay * w;
    s[0] = beta1 * s[0] + (1.f - beta1) * g;
    s[1] = beta2 * s[1] + (1.f - beta2) * g * g;
    w -= f.lr * (s[0] * f.inv_bias1) / (::sqrtf(s[1]) * f.inv_sqrt_bias2 + eps);
  }
};

}  // namespace xsoftmax
