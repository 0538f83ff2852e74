// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `hs_replanner`: when to re-plan a sharded hierarchical softmax, and the new plan. It feeds a
/// `class_frequency_tracker` with every batch's targets and, every `check_every` batches, asks how
/// unbalanced the current plan is under the recent targets (`plan_imbalance`); above
/// `replan_above` it makes a plan from them and proposes it when that plan is `gain` times better.
/// The caller then moves the rows (`reshard_hs_rows`: weights, biases, optimizer state) and builds
/// the head over the new plan. Measured policy (bench/RESULTS.md, "re-planning under drift"): with
/// the defaults below, a drifting Zipf popularity over 1M classes costs a mean imbalance of
/// 1.08-1.23 at 2-8 ranks instead of 1.35-3.67 with the first plan kept.
///
/// ```cpp
/// xs::hs_replanner<> replanner(tree, shard_options);
/// for (each step) {
///   replanner.observe(my_targets);                       // local
///   if (auto next = replanner.propose(head.plan(), comm)) {   // collective on check steps
///     xs::reshard_hs_rows(head.plan(), *next, comm, top, local, new_top, new_local);
///     // ... the same for biases and optimizer state; then a head over *next and the new rows
///   }
/// }
/// ```

#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_frequency_tracker.hpp>
#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/types.hpp>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace xsoftmax {

/// The knobs of `hs_replanner` (defaults: the faster of the two policies measured in RESULTS.md).
struct hs_replan_options {
  /// The tracker's decay per batch (see `class_frequency_tracker`): smaller reacts faster.
  double decay = 0.7;
  /// Batches between two looks at the plan (each look is one all-reduce of N doubles and O(N) work).
  index_t check_every = 2;
  /// Look for a new plan when the current one's imbalance under the recent targets exceeds this.
  double replan_above = 1.2;
  /// Propose the new plan only when its imbalance is this many times smaller (moving rows costs).
  double gain = 1.1;
  /// Share of the mass spread uniformly over every class before planning, so that classes not
  /// seen lately keep a little weight (the plan does not overfit the last batches).
  double prior = 0.01;
  /// Hint the new plan with the current owners (`hs_shard_options::class_owner_hint`, within the
  /// plan options' `keep_owner_slack`), so that fewer rows move.
  bool keep_owners = true;
};

/// Decides when a sharded hierarchical softmax's plan should change (see the file comment).
template <int MaxDepth = 64, class NodeForm = softmax_nodes>
class hs_replanner {
 public:
  using plan_type = hs_shard_plan<MaxDepth, NodeForm>;
  using tree_type = typename plan_type::tree_type;

  /// `plan_options` are used for every new plan (their `class_frequency` is replaced by the recent
  /// targets'; set `split_above` to let hot subtrees be split). Throws `invalid_argument` for a
  /// decay outside (0, 1], check_every < 1, a non-finite or negative replan_above, gain < 1, or a
  /// prior outside [0, 1).
  hs_replanner(tree_type tree, hs_shard_options plan_options, hs_replan_options options = {})
      : tree_(std::move(tree)),
        plan_options_(std::move(plan_options)),
        options_(options),
        tracker_(tree_.num_classes(), options.decay) {
    detail::expects(options.check_every >= 1, "hs_replanner: check_every = ", options.check_every, " must be >= 1");
    detail::expects(std::isfinite(options.replan_above) && options.replan_above >= 0, "hs_replanner: replan_above = ",
                    options.replan_above, " must be finite and >= 0");
    detail::expects(options.gain >= 1, "hs_replanner: gain = ", options.gain, " must be >= 1");
    detail::expects(options.prior >= 0 && options.prior < 1, "hs_replanner: prior = ", options.prior,
                    " must be in [0, 1)");
  }

  /// Counts this rank's batch of targets. Local.
  void observe(vector_view<const index_t> targets) { tracker_.observe(targets); }

  /// The running counts (this rank's).
  [[nodiscard]] const class_frequency_tracker& tracker() const { return tracker_; }

  /// On every `check_every`-th observed batch (collective then: every rank calls it after the same
  /// number of `observe` calls), a better plan than `current` for the recent targets, if there is
  /// one worth moving to; otherwise (and between checks, without communicating) nothing.
  /// `last_imbalance()` then holds `current`'s imbalance under the recent targets.
  template <class Communicator>
  [[nodiscard]] std::optional<plan_type> propose(const plan_type& current, Communicator& comm) {
    if (tracker_.batches() == 0 || tracker_.batches() % options_.check_every != 0) return std::nullopt;
    std::vector<double> seen = tracker_.global_frequency(comm);
    last_imbalance_ = plan_imbalance(current, seen);
    if (last_imbalance_ <= options_.replan_above) return std::nullopt;
    double total = 0;
    for (double x : seen) total += x;
    const double floor = options_.prior / (1 - options_.prior) * total / static_cast<double>(seen.size());
    hs_shard_options o = plan_options_;
    o.class_frequency = seen;
    for (double& x : o.class_frequency) x += floor;
    if (options_.keep_owners) o.class_owner_hint = current.class_owners();
    plan_type next(tree_, current.ranks(), o);
    // Both plans judged on the same (recent) targets.
    if (plan_imbalance(next, seen) * options_.gain > last_imbalance_) return std::nullopt;
    return next;
  }

  /// The current plan's imbalance under the recent targets at the last check (1 before any).
  [[nodiscard]] double last_imbalance() const { return last_imbalance_; }

 private:
  tree_type tree_;
  hs_shard_options plan_options_;
  hs_replan_options options_;
  class_frequency_tracker tracker_;
  double last_imbalance_ = 1.0;
};

}  // namespace xsoftmax
