// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `class_frequency_tracker`: a running, exponentially decayed histogram of the targets a
/// sharded hierarchical softmax sees, summed over the ranks, to decide when its `hs_shard_plan`
/// no longer balances the work (`plan_imbalance`) and to make the next plan from it (its
/// `class_frequency`). The weights then move with `reshard_hs_rows`.
///
/// The plan's balance is decided by the frequencies it was made from; when the targets drift (a
/// topic, a season, a new hot subtree), every routed row of the hot part goes to one rank. The
/// static plan cannot fix that within a step; re-planning from recent targets can, and this is
/// the "recent targets" part. Decay: a batch seen `a` batches ago counts `decay^a`; the tracker
/// keeps one scale factor instead of multiplying N counts per batch (renormalised when it grows
/// past 1e100), so `observe` costs O(batch), not O(N).

#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace xsoftmax {

/// A decayed count of each class's targets on this rank (see the file comment).
class class_frequency_tracker {
 public:
  /// `decay` in (0, 1]: the weight of a batch relative to the next one (1: plain counts). Throws
  /// `invalid_argument` for num_classes < 1 or a decay outside (0, 1].
  explicit class_frequency_tracker(index_t num_classes, double decay = 0.99)
      : counts_(static_cast<std::size_t>(num_classes > 0 ? num_classes : 0), 0.0), decay_(decay) {
    detail::expects(num_classes >= 1, "class_frequency_tracker: num_classes = ", num_classes, " must be >= 1");
    detail::expects(decay > 0.0 && decay <= 1.0, "class_frequency_tracker: decay = ", decay, " must be in (0, 1]");
  }

  /// Classes tracked.
  [[nodiscard]] index_t num_classes() const { return static_cast<index_t>(counts_.size()); }
  /// Batches observed.
  [[nodiscard]] index_t batches() const { return batches_; }

  /// Counts one batch of this rank's targets (the newest, so it weighs most); targets outside
  /// [0, num_classes) (ignored samples) are skipped. Local: no collective.
  void observe(vector_view<const index_t> targets) {
    if (batches_ > 0) weight_ /= decay_;
    if (weight_ > 1e100) {  // renormalise: keeps every count finite whatever the run length
      for (double& c : counts_) c /= weight_;
      weight_ = 1.0;
    }
    for (index_t i = 0; i < targets.size; ++i) {
      const index_t t = targets[i];
      if (t >= 0 && t < num_classes()) counts_[static_cast<std::size_t>(t)] += weight_;
    }
    ++batches_;
  }

  /// This rank's decayed counts (the newest batch weighs 1, the one before `decay`, ...).
  [[nodiscard]] std::vector<double> local_frequency() const {
    std::vector<double> f(counts_);
    for (double& c : f) c /= weight_;
    return f;
  }

  /// The decayed counts summed over every rank of `comm` (the same on every rank: an all-reduce
  /// in rank order). Collective; the communicator must reduce `double` (as `mpi_communicator`).
  template <class Communicator>
  [[nodiscard]] std::vector<double> global_frequency(Communicator& comm) const {
    std::vector<double> f = local_frequency();
    comm.all_reduce(f.data(), num_classes(), reduce_op::sum);
    return f;
  }

 private:
  std::vector<double> counts_;
  double decay_;
  double weight_ = 1.0;  ///< the newest batch's weight in counts_ (older ones: weight_ x decay^age)
  index_t batches_ = 0;
};

/// Slowest rank / mean rank of the routed work that `plan` would give under `class_frequency`
/// (N non-negative entries, any scale): the expected imbalance of keeping the plan while targets
/// follow those frequencies. 1 = balanced; 1 when nothing is routed. Throws `shape_error` for a
/// frequency vector of the wrong size.
template <int MaxDepth, class NodeForm>
[[nodiscard]] double plan_imbalance(const hs_shard_plan<MaxDepth, NodeForm>& plan,
                                    const std::vector<double>& class_frequency) {
  detail::expects<shape_error>(static_cast<index_t>(class_frequency.size()) == plan.num_classes(),
                               "plan_imbalance: class_frequency has ", class_frequency.size(), " entries, the plan ",
                               plan.num_classes(), " classes");
  std::vector<double> work(static_cast<std::size_t>(plan.ranks()), 0.0);
  for (index_t c = 0; c < plan.num_classes(); ++c) {
    const index_t s = plan.subtree_of(c);
    if (s >= 0) work[static_cast<std::size_t>(plan.owner(s))] += class_frequency[static_cast<std::size_t>(c)] *
                                                                 static_cast<double>(plan.routed_cost(c));
  }
  const double total = std::accumulate(work.begin(), work.end(), 0.0);
  if (!(total > 0)) return 1.0;
  return *std::max_element(work.begin(), work.end()) / (total / static_cast<double>(work.size()));
}

}  // namespace xsoftmax
