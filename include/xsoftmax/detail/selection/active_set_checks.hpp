// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Validates the active set a selector returned and locates every row's target in it.

#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <vector>

namespace xsoftmax::detail {

/// Checks `set` against the packed batch and N; returns, per packed row, the position of its target:
/// an index into `set.classes` (shared) or into `set.ids` (per sample).
template <class Batch>
std::vector<index_t> locate_targets(const char* where, const active_set& set, const Batch& batch,
                                    index_t num_classes) {
  const index_t rows = batch.rows;
  std::vector<index_t> pos(static_cast<std::size_t>(rows));
  if (set.layout == active_layout::shared) {
    const auto& u = set.classes;
    const index_t n = static_cast<index_t>(u.size());
    expects<shape_error>(set.negative_offset.empty() || static_cast<index_t>(set.negative_offset.size()) == n,
                         where, ": active set has ", set.negative_offset.size(), " negative offsets for ", n,
                         " classes");
    expects<shape_error>(set.target_offset.empty() || static_cast<index_t>(set.target_offset.size()) == n, where,
                         ": active set has ", set.target_offset.size(), " target offsets for ", n, " classes");
    for (index_t j = 0; j < n; ++j) {
      expects<out_of_range>(u[j] >= 0 && u[j] < num_classes, where, ": active set class[", j, "] = ", u[j],
                            " is out of range [0, ", num_classes, ")");
      expects(j == 0 || u[j - 1] < u[j], where, ": active set classes are not strictly ascending at [", j,
              "] (", u[j - 1], " then ", u[j], ")");
    }
    for (index_t r = 0; r < rows; ++r) {
      const auto it = std::lower_bound(u.begin(), u.end(), batch.target[r]);
      expects(it != u.end() && *it == batch.target[r], where, ": the active set lacks the target ",
              batch.target[r], " of sample ", batch.sample[r]);
      pos[r] = static_cast<index_t>(it - u.begin());
    }
  } else {
    const auto& off = set.offsets;
    const index_t nnz = static_cast<index_t>(set.ids.size());
    expects<shape_error>(static_cast<index_t>(off.size()) == rows + 1, where, ": per-sample active set has ",
                         off.size(), " offsets for ", rows, " rows (expected rows + 1)");
    expects<shape_error>(set.id_offset.empty() || static_cast<index_t>(set.id_offset.size()) == nnz, where,
                         ": active set has ", set.id_offset.size(), " logit offsets for ", nnz, " entries");
    expects(off[0] == 0 && off[rows] == nnz, where, ": per-sample offsets run from ", off[0], " to ", off[rows],
            ", expected 0 to ", nnz);
    for (index_t r = 0; r < rows; ++r) {
      expects(off[r] <= off[r + 1], where, ": per-sample offsets decrease at row ", r);
      pos[r] = -1;
      for (index_t e = off[r]; e < off[r + 1]; ++e) {
        const index_t c = set.ids[e];
        expects<out_of_range>(c >= 0 && c < num_classes, where, ": active set entry ", e, " (row ", r, ") = ", c,
                              " is out of range [0, ", num_classes, ")");
        if (pos[r] < 0 && c == batch.target[r]) pos[r] = e;
      }
      expects(pos[r] >= 0, where, ": the active set lacks the target ", batch.target[r], " of sample ",
              batch.sample[r]);
    }
  }
  return pos;
}

}  // namespace xsoftmax::detail
