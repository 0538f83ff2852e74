// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Validates the active set a selector returned and locates every row's target in it, on any
/// backend: the scans run where the set lives; only the first offending value comes back to the
/// host, for the message.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <thrust/binary_search.h>
#include <thrust/find.h>
#include <thrust/host_vector.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>

namespace xsoftmax::detail {

/// Shared layout: class j out of range, or not above class j - 1.
struct misplaced_class {
  const index_t* u;
  index_t num_classes;
  XSOFTMAX_HD bool operator()(index_t j) const {
    return u[j] < 0 || u[j] >= num_classes || (j > 0 && u[j - 1] >= u[j]);
  }
};

/// Shared layout: row r's target is not at the position lower_bound found.
struct target_not_found {
  const index_t* u;
  index_t n;
  const index_t* pos;
  const index_t* target;
  XSOFTMAX_HD bool operator()(index_t r) const { return pos[r] >= n || u[pos[r]] != target[r]; }
};

/// Per-sample layout: offsets decrease at row r.
struct decreasing_offset {
  const index_t* off;
  XSOFTMAX_HD bool operator()(index_t r) const { return off[r] > off[r + 1]; }
};

/// Per-sample layout: entry e is not a class.
struct entry_out_of_range {
  const index_t* ids;
  index_t num_classes;
  XSOFTMAX_HD bool operator()(index_t e) const { return ids[e] < 0 || ids[e] >= num_classes; }
};

/// Per-sample layout: the first entry of row r holding its target (-1 when none does).
struct first_target_entry {
  const index_t* off;
  const index_t* ids;
  const index_t* target;
  index_t* pos;
  XSOFTMAX_HD void operator()(index_t r) const {
    index_t p = -1;
    for (index_t e = off[r]; e < off[r + 1] && p < 0; ++e)
      if (ids[e] == target[r]) p = e;
    pos[r] = p;
  }
};

struct negative_position {
  const index_t* pos;
  XSOFTMAX_HD bool operator()(index_t r) const { return pos[r] < 0; }
};

/// Checks `set` against the packed batch and N; returns, per packed row, the position of its target
/// in the execution's memory: an index into `set.classes` (shared) or into `set.ids` (per sample).
/// `check` false: a set valid by construction (`selector_sets_valid`), whose positions are found
/// without the checks' read-backs (two a step, five per sample); the vector sizes are still checked.
template <class Backend, class Set>
scratch_vector<Backend, index_t> locate_targets(const execution<Backend>& ex, const char* where, const Set& set,
                                                const batch_rows<Backend>& batch, index_t num_classes,
                                                bool check = true) {
  using ops = backend_ops<Backend>;
  const index_t rows = batch.rows;
  const thrust::counting_iterator<index_t> first(0);
  scratch_vector<Backend, index_t> pos(static_cast<std::size_t>(rows), ex);  // every row's written below
  index_t* p = raw(pos);
  const index_t* target = batch.target_data();
  auto report_missing = [&](index_t r) {
    const index_t t = ops::read(ex.res, target + r), s = ops::read(ex.res, batch.sample_data() + r);
    expects(false, where, ": the active set lacks the target ", t, " of sample ", s);
  };
  if (set.layout == active_layout::shared) {
    const index_t n = static_cast<index_t>(set.classes.size());
    expects<shape_error>(set.negative_offset.empty() || static_cast<index_t>(set.negative_offset.size()) == n,
                         where, ": active set has ", set.negative_offset.size(), " negative offsets for ", n,
                         " classes");
    expects<shape_error>(set.target_offset.empty() || static_cast<index_t>(set.target_offset.size()) == n, where,
                         ": active set has ", set.target_offset.size(), " target offsets for ", n, " classes");
    const index_t* u = thrust::raw_pointer_cast(set.classes.data());
    if (!check) {
      if (rows > 0) thrust::lower_bound(ex.policy(), u, u + n, target, target + rows, p);
      return pos;
    }
    count_host_read();
    const index_t j = *thrust::find_if(ex.policy(), first, first + n, misplaced_class{u, num_classes});
    if (j < n) {
      const index_t c = ops::read(ex.res, u + j);
      expects<out_of_range>(c >= 0 && c < num_classes, where, ": active set class[", j, "] = ", c,
                            " is out of range [0, ", num_classes, ")");
      expects(false, where, ": active set classes are not strictly ascending at [", j, "] (",
              ops::read(ex.res, u + j - 1), " then ", c, ")");
    }
    if (rows > 0) thrust::lower_bound(ex.policy(), u, u + n, target, target + rows, p);
    count_host_read();
    const index_t r = *thrust::find_if(ex.policy(), first, first + rows, target_not_found{u, n, p, target});
    if (r < rows) report_missing(r);
    return pos;
  }
  const index_t nnz = static_cast<index_t>(set.ids.size());
  expects<shape_error>(static_cast<index_t>(set.offsets.size()) == rows + 1, where, ": per-sample active set has ",
                       set.offsets.size(), " offsets for ", rows, " rows (expected rows + 1)");
  expects<shape_error>(set.id_offset.empty() || static_cast<index_t>(set.id_offset.size()) == nnz, where,
                       ": active set has ", set.id_offset.size(), " logit offsets for ", nnz, " entries");
  const index_t* off = thrust::raw_pointer_cast(set.offsets.data());
  const index_t* ids = thrust::raw_pointer_cast(set.ids.data());
  if (!check) {
    parallel_for(ex, rows, first_target_entry{off, ids, target, p});
    return pos;
  }
  const index_t off_first = ops::read(ex.res, off), off_last = ops::read(ex.res, off + rows);
  expects(off_first == 0 && off_last == nnz, where, ": per-sample offsets run from ", off_first, " to ", off_last,
          ", expected 0 to ", nnz);
  count_host_read();
  const index_t bad_row = *thrust::find_if(ex.policy(), first, first + rows, decreasing_offset{off});
  expects(bad_row == rows, where, ": per-sample offsets decrease at row ", bad_row);
  count_host_read();
  const index_t e = *thrust::find_if(ex.policy(), first, first + nnz, entry_out_of_range{ids, num_classes});
  if (e < nnz) {
    const thrust::host_vector<index_t> host_off(set.offsets.begin(), set.offsets.end());
    const index_t row = static_cast<index_t>(std::upper_bound(host_off.begin(), host_off.end(), e) - host_off.begin()) - 1;
    expects<out_of_range>(false, where, ": active set entry ", e, " (row ", row, ") = ", ops::read(ex.res, ids + e),
                          " is out of range [0, ", num_classes, ")");
  }
  parallel_for(ex, rows, first_target_entry{off, ids, target, p});
  count_host_read();
  const index_t r = *thrust::find_if(ex.policy(), first, first + rows, negative_position{p});
  if (r < rows) report_missing(r);
  return pos;
}

}  // namespace xsoftmax::detail
