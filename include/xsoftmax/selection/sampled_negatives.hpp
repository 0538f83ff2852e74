// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `sampled_negatives`: the selector of sampled softmax (Jean et al. 2015; TensorFlow's
/// `sampled_softmax_loss`). One set of negatives is drawn per step and shared by the batch; each
/// sample scores its own target plus those negatives, with logits corrected by -log Q(c) (Q: the
/// class's expected count in the draw), and a negative that equals the sample's target (an
/// accidental hit) removed. The estimator is consistent, not unbiased: it approaches the full
/// softmax as the number of negatives grows, and equals it when every class is drawn without
/// replacement.

#include <xsoftmax/detail/selection/sampling.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace xsoftmax {

/// Options of `sampled_negatives`.
struct sampling_options {
  index_t num_sampled = 64;     ///< negatives drawn per step (m)
  bool unique = true;           ///< draw until m distinct classes (TF `unique=True`); false: m draws with replacement
  bool subtract_log_q = true;   ///< subtract log Q(c) from every logit (TF `subtract_log_q`)
  unsigned long long seed = 0;  ///< with the step counter, determines every draw
};

/// Selector drawing shared negatives from a uniform, log-uniform (Zipf: P(c) = log((c + 2) /
/// (c + 1)) / log(N + 1), for classes sorted by decreasing frequency) or class-count distribution.
///
/// Row i's active set is {t_i} U (negatives \ {t_i}); the other rows' targets are masked (offset
/// -inf) unless drawn. Logit offsets: target -log Q(t_i); negative c, drawn k times with
/// replacement, log k - log Q(c) (k copies of one logit, as TF keeps duplicates). A class of zero
/// probability (zero count) is never drawn; as a target its Q is clamped to 1e-30.
///
/// The draw is a pure function of (seed, step): `forward` and `backward` of one step see the same
/// negatives. `selective_softmax::next_step()` advances the step.
class sampled_negatives {
 public:
  /// Uniform over N classes. Throws `invalid_argument` unless N >= 1 and 1 <= num_sampled <= N.
  [[nodiscard]] static sampled_negatives uniform(index_t num_classes, sampling_options options = {}) {
    return sampled_negatives(detail::sampler_kind::uniform, num_classes, {}, options, "sampled_negatives::uniform");
  }

  /// Log-uniform (Zipf) over N classes; see the class comment. Same checks as `uniform`.
  [[nodiscard]] static sampled_negatives log_uniform(index_t num_classes, sampling_options options = {}) {
    return sampled_negatives(detail::sampler_kind::log_uniform, num_classes, {}, options,
                             "sampled_negatives::log_uniform");
  }

  /// P(c) proportional to counts[c]^power (word2vec uses power 0.75). Throws `invalid_argument`
  /// naming the entry for a negative or non-finite count, when all counts are zero, or when
  /// `unique` asks for more negatives than classes with a non-zero count.
  template <class Count>
  [[nodiscard]] static sampled_negatives from_counts(const std::vector<Count>& counts, sampling_options options = {},
                                                     double power = 1.0) {
    const char* where = "sampled_negatives::from_counts";
    detail::expects(std::isfinite(power) && power > 0, where, ": power = ", power, " must be finite and > 0");
    std::vector<double> cdf(counts.size());
    double total = 0;
    for (std::size_t c = 0; c < counts.size(); ++c) {
      const double v = static_cast<double>(counts[c]);
      detail::expects(std::isfinite(v) && v >= 0, where, ": counts[", c, "] = ", v, " must be finite and >= 0");
      total += v > 0 ? std::pow(v, power) : 0.0;
      cdf[c] = total;
    }
    detail::expects(counts.empty() || total > 0, where, ": every count is zero");
    return sampled_negatives(detail::sampler_kind::counts, static_cast<index_t>(counts.size()), std::move(cdf),
                             options, where);
  }

  [[nodiscard]] index_t num_classes() const { return sampler_.n; }
  [[nodiscard]] const sampling_options& options() const { return options_; }
  /// Probability of class c in one draw.
  [[nodiscard]] double probability(index_t c) const { return sampler_.probability(c); }

  /// The step the next draw belongs to.
  [[nodiscard]] unsigned long long step() const { return step_; }
  void set_step(unsigned long long step) { step_ = step; }
  /// Moves on to the next step's draw (called by `selective_softmax::next_step()`).
  void next_step() { ++step_; }

  /// This step's negatives: distinct classes ascending, and the logit offset each gets as a
  /// negative (log k - log Q(c), or log k without the correction).
  void negatives(std::vector<index_t>& classes, std::vector<float>& offset) const {
    const detail::class_draw d = draw();
    classes = d.classes;
    offset.resize(classes.size());
    for (std::size_t j = 0; j < classes.size(); ++j)
      offset[j] = static_cast<float>(std::log(static_cast<double>(d.multiplicity[j])) - log_q(d, classes[j]));
  }

  /// Builds the shared active set of `req`: targets U this step's negatives, with offsets. Throws
  /// `shape_error` when the sampler was built for another number of classes than the head's.
  template <class Policy, class T>
  void select(const Policy&, const selection_request<T>& req, active_set& out) const {
    detail::expects<shape_error>(req.num_classes == sampler_.n, req.where, ": sampled_negatives was built for num_classes = ",
                                 sampler_.n, " but the head has num_classes = ", req.num_classes);
    const detail::class_draw d = draw();
    out.reset(active_layout::shared);
    out.classes.assign(d.classes.begin(), d.classes.end());
    for (index_t r = 0; r < req.rows(); ++r) out.classes.push_back(req.targets[r]);
    std::sort(out.classes.begin(), out.classes.end());
    out.classes.erase(std::unique(out.classes.begin(), out.classes.end()), out.classes.end());
    const std::size_t n = out.classes.size();
    out.negative_offset.assign(n, -std::numeric_limits<float>::infinity());
    out.target_offset.resize(n);
    std::size_t k = 0;  // walk the (sorted) draw alongside the (sorted) active set
    for (std::size_t j = 0; j < n; ++j) {
      const index_t c = out.classes[j];
      const double lq = log_q(d, c);
      out.target_offset[j] = static_cast<float>(-lq);
      if (k < d.classes.size() && d.classes[k] == c) {
        out.negative_offset[j] = static_cast<float>(std::log(static_cast<double>(d.multiplicity[k])) - lq);
        ++k;
      }
    }
  }

 private:
  sampled_negatives(detail::sampler_kind kind, index_t n, std::vector<double> cdf, sampling_options options,
                    const char* where)
      : options_(options) {
    detail::expects(n >= 1, where, ": num_classes = ", n, " must be >= 1");
    sampler_.kind = kind;
    sampler_.n = n;
    sampler_.cdf = std::move(cdf);
    sampler_.support = n;
    if (kind == detail::sampler_kind::counts) {
      sampler_.support = 0;
      for (index_t c = 0; c < n; ++c) sampler_.support += sampler_.probability(c) > 0 ? 1 : 0;
    }
    detail::expects(options.num_sampled >= 1 && options.num_sampled <= n, where,
                    ": num_sampled = ", options.num_sampled, " must be in [1, num_classes = ", n, "]");
    detail::expects(!options.unique || options.num_sampled <= sampler_.support, where, ": num_sampled = ",
                    options.num_sampled, " distinct negatives asked for, but only ", sampler_.support,
                    " classes have a non-zero count");
  }

  [[nodiscard]] detail::class_draw draw() const {
    return detail::draw_classes(sampler_, options_.num_sampled, options_.unique, options_.seed, step_);
  }
  [[nodiscard]] double log_q(const detail::class_draw& d, index_t c) const {
    if (!options_.subtract_log_q) return 0.0;
    const double q = detail::expected_count(sampler_, d, options_.num_sampled, options_.unique, c);
    return std::log(std::max(q, 1e-30));
  }

  detail::class_sampler sampler_;
  sampling_options options_;
  unsigned long long step_ = 0;
};

}  // namespace xsoftmax
