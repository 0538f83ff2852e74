// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Learning-rate schedules: small value types, `float operator()(step)` for step = 0, 1, 2, ...,
/// that any optimizer step takes as its learning rate (`opt.step(head, grad, schedule(t))`). The
/// large-batch recipe of the 100M-class system: a linear warm-up from 0, then a decay (cosine,
/// polynomial or step) to a floor. Constructors throw `invalid_argument` naming the value.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace xsoftmax {

/// The same rate at every step.
struct constant_lr {
  float lr = 0.1f;
  [[nodiscard]] float operator()(std::int64_t) const { return lr; }
};

namespace detail {

/// Linear warm-up: base * (step + 1) / warmup for step < warmup, then 1 (returned as a factor).
inline double warmup_factor(std::int64_t step, std::int64_t warmup) {
  return step < warmup ? static_cast<double>(step + 1) / static_cast<double>(warmup) : 1.0;
}

inline void check_schedule(const char* where, float base, float floor, std::int64_t warmup, std::int64_t total) {
  expects(std::isfinite(base) && base > 0, where, ": base_lr = ", base, " must be finite and > 0");
  expects(std::isfinite(floor) && floor >= 0 && floor <= base, where, ": min_lr = ", floor,
          " must be finite and in [0, base_lr = ", base, "]");
  expects(warmup >= 0, where, ": warmup_steps = ", warmup, " must be >= 0");
  expects(total > warmup, where, ": total_steps = ", total, " must be > warmup_steps = ", warmup);
}

}  // namespace detail

/// Linear warm-up over `warmup_steps`, then a cosine decay from `base_lr` to `min_lr` at
/// `total_steps` (and `min_lr` after it).
struct warmup_cosine {
  float base_lr;
  std::int64_t warmup_steps;
  std::int64_t total_steps;
  float min_lr;

  warmup_cosine(float base, std::int64_t warmup, std::int64_t total, float floor = 0.f)
      : base_lr(base), warmup_steps(warmup), total_steps(total), min_lr(floor) {
    detail::check_schedule("warmup_cosine", base, floor, warmup, total);
  }
  [[nodiscard]] float operator()(std::int64_t step) const {
    if (step < warmup_steps) return static_cast<float>(base_lr * detail::warmup_factor(step, warmup_steps));
    const double t = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                       static_cast<double>(total_steps - warmup_steps));
    const double pi = 3.14159265358979323846;
    return static_cast<float>(min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(pi * t)));
  }
};

/// Linear warm-up, then (base - min) * (1 - t)^power + min with t the fraction of the decay done
/// (power 1: linear decay; LARS's paper uses 2).
struct warmup_polynomial {
  float base_lr;
  std::int64_t warmup_steps;
  std::int64_t total_steps;
  float min_lr;
  double power;

  warmup_polynomial(float base, std::int64_t warmup, std::int64_t total, double power_ = 2.0, float floor = 0.f)
      : base_lr(base), warmup_steps(warmup), total_steps(total), min_lr(floor), power(power_) {
    detail::check_schedule("warmup_polynomial", base, floor, warmup, total);
    detail::expects(std::isfinite(power_) && power_ > 0, "warmup_polynomial: power = ", power_,
                    " must be finite and > 0");
  }
  [[nodiscard]] float operator()(std::int64_t step) const {
    if (step < warmup_steps) return static_cast<float>(base_lr * detail::warmup_factor(step, warmup_steps));
    const double t = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                       static_cast<double>(total_steps - warmup_steps));
    return static_cast<float>(min_lr + (base_lr - min_lr) * std::pow(1.0 - t, power));
  }
};

/// Linear warm-up, then base * gamma^k after k whole periods of `step_size` steps past the warm-up.
struct warmup_step {
  float base_lr;
  std::int64_t warmup_steps;
  std::int64_t step_size;
  double gamma;

  warmup_step(float base, std::int64_t warmup, std::int64_t step_size_, double gamma_ = 0.1)
      : base_lr(base), warmup_steps(warmup), step_size(step_size_), gamma(gamma_) {
    detail::check_schedule("warmup_step", base, 0.f, warmup, warmup + 1);
    detail::expects(step_size_ >= 1, "warmup_step: step_size = ", step_size_, " must be >= 1");
    detail::expects(std::isfinite(gamma_) && gamma_ > 0 && gamma_ <= 1, "warmup_step: gamma = ", gamma_,
                    " must be in (0, 1]");
  }
  [[nodiscard]] float operator()(std::int64_t step) const {
    if (step < warmup_steps) return static_cast<float>(base_lr * detail::warmup_factor(step, warmup_steps));
    return static_cast<float>(base_lr * std::pow(gamma, static_cast<double>((step - warmup_steps) / step_size)));
  }
};

}  // namespace xsoftmax
