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

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/selection/row_lists.hpp>
#include <xsoftmax/detail/selection/sampling.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <thrust/copy.h>

namespace xsoftmax {

namespace detail {

/// The logit offsets of a sampled active set's class j: as the target, -log Q(c); as a negative,
/// log k - log Q(c) when drawn k times, -inf (masked) when not drawn.
struct sampled_offsets {
  expected_count_of q;
  const index_t* classes;
  const index_t* drawn;  ///< ascending
  const index_t* multiplicity;
  index_t num_drawn;
  float* negative_offset;
  float* target_offset;
  XSOFTMAX_HD void operator()(index_t j) const {
    const index_t c = classes[j];
    const double lq = q.log_q(c);
    target_offset[j] = static_cast<float>(-lq);
    index_t lo = 0, hi = num_drawn;  // lower bound of c in the draw
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (drawn[mid] < c) lo = mid + 1;
      else hi = mid;
    }
    negative_offset[j] = lo < num_drawn && drawn[lo] == c
                             ? static_cast<float>(::log(static_cast<double>(multiplicity[lo])) - lq)
                             : -INFINITY;
  }
};

}  // namespace detail

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
  /// `select` fills any active-set type with `basic_active_set`'s fields (a training step's set is
  /// working memory of the call: detail/selection/scratch_active_set.hpp).
  static constexpr bool fills_scratch_sets = true;
  /// Its sets meet the active-set contract by construction (a step finds the targets in them without
  /// checking them: detail/selection/scratch_active_set.hpp).
  static constexpr bool sets_valid_by_construction = true;
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

  /// Builds the shared active set of `req` on `ex`'s backend: targets U this step's negatives, with
  /// offsets. The draw is made on the host (m classes); the union and the offsets where the batch
  /// lives. Throws `shape_error` when the sampler was built for another number of classes than the
  /// head's.
  template <class Ex, class T, class Set>
  void select(const Ex& ex_in, const selection_request<T>& req, Set& out) const {
    detail::expects<shape_error>(req.num_classes == sampler_.n, req.where, ": sampled_negatives was built for num_classes = ",
                                 sampler_.n, " but the head has num_classes = ", req.num_classes);
    const auto& ex = detail::as_execution(ex_in);
    const detail::class_draw d = draw();
    const index_t drawn = static_cast<index_t>(d.classes.size()), rows = req.rows();
    // The draw and its multiplicities in one copy to the execution's memory (scratch of the call).
    std::vector<index_t> draw_lists(d.classes);
    draw_lists.insert(draw_lists.end(), d.multiplicity.begin(), d.multiplicity.end());
    const auto lists = detail::to_scratch(ex, draw_lists);
    const index_t* negatives = lists.data();
    const index_t* multiplicity = lists.data() + drawn;
    out.reset(active_layout::shared);
    out.classes.resize(static_cast<std::size_t>(drawn + rows));
    thrust::copy(ex.policy(), negatives, negatives + drawn, out.classes.begin());
    if (rows > 0) thrust::copy(ex.policy(), req.targets.data, req.targets.data + rows, out.classes.begin() + drawn);
    detail::sort_unique(ex, out.classes);
    const index_t n = static_cast<index_t>(out.classes.size());
    out.negative_offset.resize(static_cast<std::size_t>(n));
    out.target_offset.resize(static_cast<std::size_t>(n));
    detail::parallel_for(ex, n,
                         detail::sampled_offsets{q_of(d, sampler_.probability_on(ex)), detail::raw(out.classes),
                                                 negatives, multiplicity, drawn,
                                                 detail::raw(out.negative_offset), detail::raw(out.target_offset)});
  }

 private:
  sampled_negatives(detail::sampler_kind kind, index_t n, std::vector<double> cdf, sampling_options options,
                    const char* where)
      : options_(options) {
    detail::expects(n >= 1, where, ": num_classes = ", n, " must be >= 1");
    sampler_.kind = kind;
    sampler_.n = n;
    sampler_.cdf.assign(std::move(cdf));
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
  [[nodiscard]] detail::expected_count_of q_of(const detail::class_draw& d, detail::class_probability p) const {
    return {p, options_.num_sampled, d.tries, options_.unique, d.exhaustive, options_.subtract_log_q};
  }
  [[nodiscard]] double log_q(const detail::class_draw& d, index_t c) const {
    return q_of(d, sampler_.probability_on_host()).log_q(c);
  }

  detail::class_sampler sampler_;
  sampling_options options_;
  unsigned long long step_ = 0;
};

}  // namespace xsoftmax
