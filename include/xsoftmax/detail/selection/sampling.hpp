// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Draws of candidate classes for sampled softmax, as TensorFlow's candidate samplers do them:
/// uniform, log-uniform (Zipf) and from class counts; with replacement, or "unique" (draw until
/// `m` distinct classes were seen, counting the tries). Each draw also yields every class's
/// expected count Q(c), whose log the sampled softmax subtracts from the logits.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/mirrored_vector.hpp>
#include <xsoftmax/detail/primitives/mix_seed.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_set>
#include <vector>

namespace xsoftmax::detail {

/// Which distribution a sampler draws from.
enum class sampler_kind { uniform, log_uniform, counts };

/// The probability of one draw, on the host or a device: `cdf` (counts only) is in the memory of
/// the code that calls it.
struct class_probability {
  sampler_kind kind = sampler_kind::uniform;
  index_t n = 0;
  const double* cdf = nullptr;  ///< counts: cumulative weights (n entries, last = total)

  XSOFTMAX_HD double operator()(index_t c) const {
    switch (kind) {
      case sampler_kind::uniform: return 1.0 / static_cast<double>(n);
      case sampler_kind::log_uniform: return ::log((c + 2.0) / (c + 1.0)) / ::log(static_cast<double>(n) + 1.0);
      default: return (cdf[c] - (c > 0 ? cdf[c - 1] : 0.0)) / cdf[n - 1];
    }
  }
};

/// A distribution over [0, n) and one draw of `m` classes from it.
struct class_sampler {
  sampler_kind kind = sampler_kind::uniform;
  index_t n = 0;
  mirrored_vector<double> cdf;  ///< counts: cumulative weights (n entries, last = total)
  index_t support = 0;          ///< classes with non-zero probability

  /// The probability in `ex`'s memory (the cumulative weights are copied to a device once).
  template <class Ex>
  [[nodiscard]] class_probability probability_on(const Ex& ex) const {
    return {kind, n, cdf.empty() ? nullptr : cdf.data(ex)};
  }
  [[nodiscard]] class_probability probability_on_host() const {
    return {kind, n, cdf.empty() ? nullptr : cdf.host().data()};
  }
  [[nodiscard]] double probability(index_t c) const { return probability_on_host()(c); }

  template <class Rng>
  index_t one(Rng& rng) const {
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    switch (kind) {
      case sampler_kind::uniform: return std::uniform_int_distribution<index_t>(0, n - 1)(rng);
      case sampler_kind::log_uniform: {  // TF's LogUniformSampler: floor(exp(u log(n + 1))) - 1
        const double v = std::floor(std::exp(u01(rng) * std::log(static_cast<double>(n) + 1.0))) - 1.0;
        return std::clamp<index_t>(static_cast<index_t>(v), 0, n - 1);
      }
      default: {
        const std::vector<double>& c = cdf.host();
        const double x = u01(rng) * c.back();
        const auto it = std::upper_bound(c.begin(), c.end(), x);
        return std::min<index_t>(static_cast<index_t>(it - c.begin()), n - 1);
      }
    }
  }
};

/// One draw: distinct classes ascending, how often each was drawn, and the number of tries.
struct class_draw {
  std::vector<index_t> classes;
  std::vector<index_t> multiplicity;
  index_t tries = 0;
  bool exhaustive = false;  ///< unique draw of the whole support: every Q(c) is exactly 1
};

/// Draws `m` classes (unique: m distinct ones) with a generator seeded from (seed, step).
inline class_draw draw_classes(const class_sampler& s, index_t m, bool unique, unsigned long long seed,
                               unsigned long long step) {
  std::mt19937_64 rng(mix_seed(mix_seed(seed) ^ step));
  class_draw d;
  if (unique && m == s.support) {  // every class that can be drawn is drawn, with certainty
    d.exhaustive = true;
    for (index_t c = 0; c < s.n; ++c)
      if (s.probability(c) > 0) d.classes.push_back(c);
    d.multiplicity.assign(d.classes.size(), 1);
    d.tries = m;
    return d;
  }
  if (unique && s.kind == sampler_kind::uniform) {  // Floyd: a uniform m-subset in m steps
    std::unordered_set<index_t> chosen;
    chosen.reserve(static_cast<std::size_t>(2 * m));
    for (index_t j = s.n - m; j < s.n; ++j) {
      const index_t t = std::uniform_int_distribution<index_t>(0, j)(rng);
      chosen.insert(chosen.count(t) ? j : t);
    }
    d.classes.assign(chosen.begin(), chosen.end());
    std::sort(d.classes.begin(), d.classes.end());
    d.multiplicity.assign(d.classes.size(), 1);
    d.tries = m;
    return d;
  }
  std::vector<index_t> raw;
  if (unique) {
    std::unordered_set<index_t> seen;
    seen.reserve(static_cast<std::size_t>(2 * m));
    while (static_cast<index_t>(seen.size()) < m) {
      const index_t c = s.one(rng);
      ++d.tries;
      if (seen.insert(c).second) raw.push_back(c);
    }
  } else {
    raw.resize(static_cast<std::size_t>(m));
    for (auto& c : raw) c = s.one(rng);
    d.tries = m;
  }
  std::sort(raw.begin(), raw.end());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (i == 0 || raw[i] != raw[i - 1]) {
      d.classes.push_back(raw[i]);
      d.multiplicity.push_back(0);
    }
    ++d.multiplicity.back();
  }
  return d;
}

/// Q(c): the expected number of times class c appears among the draw's candidates (TF's
/// `expected_count`): m p(c) with replacement; for unique draws 1 - (1 - p)^tries, except that a
/// uniform unique draw includes each class with probability exactly m / n and an exhaustive draw
/// with probability 1. `log_q(c)` is log max(Q(c), 1e-30), or 0 without the correction.
struct expected_count_of {
  class_probability p;
  index_t m = 0;
  index_t tries = 0;
  bool unique = true;
  bool exhaustive = false;
  bool subtract_log_q = true;

  XSOFTMAX_HD double operator()(index_t c) const {
    if (exhaustive) return 1.0;
    const double pc = p(c);
    if (!unique) return static_cast<double>(m) * pc;
    if (p.kind == sampler_kind::uniform) return static_cast<double>(m) / static_cast<double>(p.n);
    return -::expm1(static_cast<double>(tries) * ::log1p(-(pc < 1.0 ? pc : 1.0)));
  }
  XSOFTMAX_HD double log_q(index_t c) const {
    if (!subtract_log_q) return 0.0;
    const double q = (*this)(c);
    return ::log(q > 1e-30 ? q : 1e-30);
  }
};

}  // namespace xsoftmax::detail
