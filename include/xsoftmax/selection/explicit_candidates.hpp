// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `explicit_candidates`: a selector whose active set the caller gives, either one class list
/// shared by the batch or one list per sample (CSR). The targets are always added.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/mirrored_vector.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/selection/row_lists.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <vector>

#include <thrust/copy.h>
#include <thrust/scan.h>
#include <thrust/transform.h>

namespace xsoftmax {

namespace detail {

/// Entries of a packed row: its sample's candidates plus its target (0 for the last slot).
struct candidate_row_length {
  const index_t* offsets;
  XSOFTMAX_HD index_t operator()(index_t sample) const { return offsets[sample + 1] - offsets[sample] + 1; }
};

/// Writes packed row r's entries (candidates, then target) and their row index.
struct gather_candidate_row {
  const index_t* offsets;
  const index_t* ids;
  const index_t* sample;
  const index_t* target;
  const index_t* first_entry;
  index_t* row_of;
  index_t* out;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t s = sample[r], begin = offsets[s], len = offsets[s + 1] - begin;
    index_t* o = out + first_entry[r];
    index_t* ro = row_of + first_entry[r];
    for (index_t j = 0; j < len; ++j) o[j] = ids[begin + j], ro[j] = r;
    o[len] = target[r];
    ro[len] = r;
  }
};

}  // namespace detail

/// Caller-given candidates. Shared: the active set is (candidates U batch targets), sorted, unique.
/// Per sample: sample i scores (its candidates U {its target}), sorted, unique. Set the candidates
/// before each step; they stay until replaced. Validation happens at `select` time, when N and the
/// batch size are known: a class outside [0, N) throws `out_of_range`; per-sample offsets that do
/// not have B + 1 entries throw `shape_error`; decreasing offsets throw `invalid_argument`.
class explicit_candidates {
 public:
  /// `select` fills any active-set type with `basic_active_set`'s fields (a training step's set is
  /// working memory of the call: detail/selection/scratch_active_set.hpp).
  static constexpr bool fills_scratch_sets = true;
  /// Its sets meet the active-set contract by construction (a step finds the targets in them without
  /// checking them: detail/selection/scratch_active_set.hpp).
  static constexpr bool sets_valid_by_construction = true;
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
    ids_.assign(std::move(classes));
    offsets_.assign({});
  }

  /// One list per sample of the caller's batch: sample i's candidates are
  /// `ids[offsets[i] .. offsets[i + 1])` (any order, duplicates allowed); B + 1 offsets.
  void set_per_sample(std::vector<index_t> offsets, std::vector<index_t> ids) {
    per_sample_ = true;
    offsets_.assign(std::move(offsets));
    ids_.assign(std::move(ids));
  }

  [[nodiscard]] bool per_sample() const { return per_sample_; }
  [[nodiscard]] const std::vector<index_t>& ids() const { return ids_.host(); }
  [[nodiscard]] const std::vector<index_t>& offsets() const { return offsets_.host(); }

  /// Builds the active set of `req` on `ex`'s backend (the lists are copied to its memory once
  /// after each change); see the class comment for what it throws.
  template <class Ex, class T, class Set>
  void select(const Ex& ex_in, const selection_request<T>& req, Set& out) const {
    const auto& ex = detail::as_execution(ex_in);
    using execution_type = std::decay_t<decltype(ex)>;
    using index_vector = detail::scratch_buffer<typename execution_type::backend, index_t>;  // each written, then read
    const index_t n = req.num_classes, rows = req.rows();
    const std::vector<index_t>& ids = ids_.host();
    const std::vector<index_t>& offsets = offsets_.host();
    const index_t m = static_cast<index_t>(ids.size());
    for (index_t i = 0; i < m; ++i)
      detail::expects<out_of_range>(ids[i] >= 0 && ids[i] < n, req.where, ": explicit candidate [", i, "] = ", ids[i],
                                    " is out of range [0, ", n, ")");
    if (!per_sample_) {  // (candidates U targets), sorted, unique
      out.reset(active_layout::shared);
      out.classes.resize(static_cast<std::size_t>(m + rows));
      if (m > 0) thrust::copy(ex.policy(), ids_.data(ex), ids_.data(ex) + m, out.classes.begin());
      if (rows > 0) thrust::copy(ex.policy(), req.targets.data, req.targets.data + rows, out.classes.begin() + m);
      detail::sort_unique(ex, out.classes);
      return;
    }
    const index_t b = req.batch_rows;
    detail::expects<shape_error>(static_cast<index_t>(offsets.size()) == b + 1, req.where,
                                 ": per-sample candidates have ", offsets.size(), " offsets but the batch has ", b,
                                 " rows (expected ", b + 1, ")");
    detail::expects(offsets[0] == 0 && offsets[b] == m, req.where, ": per-sample candidate offsets run from ",
                    offsets[0], " to ", offsets[b], ", expected 0 to ", m);
    for (index_t i = 0; i < b; ++i)
      detail::expects(offsets[i] <= offsets[i + 1], req.where, ": per-sample candidate offsets decrease at [", i,
                      "]: ", offsets[i], " then ", offsets[i + 1]);
    // Each packed row's entries: its sample's candidates, then its target.
    index_vector first_entry(static_cast<std::size_t>(rows + 1), ex);
    const index_t* src_off = offsets_.data(ex);
    const index_t* sample = req.samples.data;
    thrust::transform(ex.policy(), sample, sample + rows, first_entry.begin(), detail::candidate_row_length{src_off});
    thrust::exclusive_scan(ex.policy(), first_entry.begin(), first_entry.end(), first_entry.begin());
    const index_t entries = detail::backend_ops<typename execution_type::backend>::read(
        ex.res, thrust::raw_pointer_cast(first_entry.data()) + rows);
    index_vector row_of(static_cast<std::size_t>(entries), ex), list(static_cast<std::size_t>(entries), ex);
    detail::parallel_for(ex, rows,
                         detail::gather_candidate_row{src_off, m > 0 ? ids_.data(ex) : nullptr, sample,
                                                      req.targets.data, thrust::raw_pointer_cast(first_entry.data()),
                                                      detail::raw(row_of), detail::raw(list)});
    out.reset(active_layout::per_sample);
    detail::sorted_rows(ex, rows, row_of, list, out);
  }

 private:
  bool per_sample_ = false;
  detail::mirrored_vector<index_t> ids_;
  detail::mirrored_vector<index_t> offsets_;
};

}  // namespace xsoftmax
