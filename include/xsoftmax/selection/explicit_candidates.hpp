// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `explicit_candidates`: a selector whose active set the caller gives, either one class list
/// shared by the batch or one list per sample (CSR). The targets are always added.

#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <vector>

namespace xsoftmax {

/// Caller-given candidates. Shared: the active set is (candidates U batch targets), sorted, unique.
/// Per sample: sample i scores (its candidates U {its target}), sorted, unique. Set the candidates
/// before each step; they stay until replaced. Validation happens at `select` time, when N and the
/// batch size are known: a class outside [0, N) throws `out_of_range`; per-sample offsets that do
/// not have B + 1 entries throw `shape_error`; decreasing offsets throw `invalid_argument`.
class explicit_candidates {
 public:
  /// No candidates: the shared active set holds the batch's targets only.
  explicit_candidates() = default;

  /// Every class of an N-class head, shared (the selective softmax then equals the full softmax).
  [[nodiscard]] static explicit_candidates all_classes(index_t num_classes) {
    detail::expects(num_classes >= 1, "explicit_candidates::all_classes: num_classes = ", num_classes,
                    " must be >= 1");
    std::vector<index_t> c(static_cast<std::size_t>(num_classes));
    for (index_t i = 0; i < num_classes; ++i) c[i] = i;
    explicit_candidates s;
    s.set_shared(std::move(c));
    return s;
  }

  /// One list for the whole batch (any order, duplicates allowed).
  void set_shared(std::vector<index_t> classes) {
    std::sort(classes.begin(), classes.end());
    classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
    per_sample_ = false;
    ids_ = std::move(classes);
    offsets_.clear();
  }

  /// One list per sample of the caller's batch: sample i's candidates are
  /// `ids[offsets[i] .. offsets[i + 1])` (any order, duplicates allowed); B + 1 offsets.
  void set_per_sample(std::vector<index_t> offsets, std::vector<index_t> ids) {
    per_sample_ = true;
    offsets_ = std::move(offsets);
    ids_ = std::move(ids);
  }

  [[nodiscard]] bool per_sample() const { return per_sample_; }
  [[nodiscard]] const std::vector<index_t>& ids() const { return ids_; }
  [[nodiscard]] const std::vector<index_t>& offsets() const { return offsets_; }

  /// Builds the active set of `req`; see the class comment for what it throws.
  template <class Policy, class T>
  void select(const Policy& policy, const selection_request<T>& req, active_set& out) const {
    const index_t n = req.num_classes, rows = req.rows();
    auto check_class = [&](index_t i, index_t c) {
      detail::expects<out_of_range>(c >= 0 && c < n, req.where, ": explicit candidate [", i, "] = ", c,
                                    " is out of range [0, ", n, ")");
    };
    if (!per_sample_) {
      out.reset(active_layout::shared);
      for (index_t i = 0; i < static_cast<index_t>(ids_.size()); ++i) check_class(i, ids_[i]);
      out.classes.reserve(ids_.size() + static_cast<std::size_t>(rows));
      out.classes.assign(ids_.begin(), ids_.end());
      for (index_t r = 0; r < rows; ++r) out.classes.push_back(req.targets[r]);
      std::sort(out.classes.begin(), out.classes.end());
      out.classes.erase(std::unique(out.classes.begin(), out.classes.end()), out.classes.end());
      return;
    }
    const index_t b = req.batch_rows;
    detail::expects<shape_error>(static_cast<index_t>(offsets_.size()) == b + 1, req.where,
                                 ": per-sample candidates have ", offsets_.size(),
                                 " offsets but the batch has ", b, " rows (expected ", b + 1, ")");
    detail::expects(offsets_[0] == 0 && offsets_[b] == static_cast<index_t>(ids_.size()), req.where,
                    ": per-sample candidate offsets run from ", offsets_[0], " to ", offsets_[b], ", expected 0 to ",
                    ids_.size());
    for (index_t i = 0; i < b; ++i)
      detail::expects(offsets_[i] <= offsets_[i + 1], req.where, ": per-sample candidate offsets decrease at [",
                      i, "]: ", offsets_[i], " then ", offsets_[i + 1]);
    for (index_t i = 0; i < static_cast<index_t>(ids_.size()); ++i) check_class(i, ids_[i]);
    out.reset(active_layout::per_sample);
    out.offsets.assign(static_cast<std::size_t>(rows + 1), 0);
    for (index_t r = 0; r < rows; ++r) {  // upper bound per row: its candidates + its target
      const index_t s = req.samples[r];
      out.offsets[r + 1] = out.offsets[r] + offsets_[s + 1] - offsets_[s] + 1;
    }
    out.ids.resize(static_cast<std::size_t>(out.offsets[rows]));
    std::vector<index_t> len(static_cast<std::size_t>(rows));
    index_t* ids = out.ids.data();
    index_t* ln = len.data();
    const index_t* off = out.offsets.data();
    const index_t* src_off = offsets_.data();
    const index_t* src = ids_.data();
    detail::parallel_for(policy, rows, [=](index_t r) {
      const index_t s = req.samples[r];
      index_t* row = ids + off[r];
      const index_t m = src_off[s + 1] - src_off[s];
      std::copy(src + src_off[s], src + src_off[s + 1], row);
      row[m] = req.targets[r];
      std::sort(row, row + m + 1);
      ln[r] = std::unique(row, row + m + 1) - row;
    });
    index_t w = 0;  // compact the rows (they only shrank)
    for (index_t r = 0; r < rows; ++r) {
      const index_t begin = out.offsets[r];
      std::copy(ids + begin, ids + begin + len[r], ids + w);
      out.offsets[r] = w;
      w += len[r];
    }
    out.offsets[rows] = w;
    out.ids.resize(static_cast<std::size_t>(w));
  }

 private:
  bool per_sample_ = false;
  std::vector<index_t> ids_;
  std::vector<index_t> offsets_;
};

}  // namespace xsoftmax
