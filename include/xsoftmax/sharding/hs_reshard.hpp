// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `reshard_hs_rows`: moves the row arrays of a sharded hierarchical softmax (weights, biases,
/// optimizer state: anything with one row per full-tree weight row) from the layout of one
/// `hs_shard_plan` to that of another over the same tree, e.g. after re-planning from a running
/// class histogram (`class_frequency_tracker`) so that a hot subtree is split or moved.
///
/// Layout of a plan on rank q (see hs_shard_plan.hpp): the replicated top rows (`top_rows()`, in
/// that order) and q's local rows (`local_rows(q)`). A row of the new layout comes from
///  * the old top rows, which every rank holds: copied locally;
///  * rank p's old local rows: for a new *top* row every rank needs it, so each rank contributes
///    the new top rows it owned (one `all_gather`); for a new *local* row of rank q, p sends it to
///    q (one `all_to_all`; p == q stays in the process through the same path).
/// Values cross the transport as float (fp32, bf16 and fp16 convert to float and back exactly),
/// so the result is bitwise the old values. The inputs are left as they are; the outputs are
/// separate buffers, so a failure leaves the old layout intact.
///
/// Bytes sent by rank p: (old local rows of p that are new top rows) x (ranks - 1) through the
/// gather, plus its old local rows that change owner, each `width` x 4 bytes.

#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/sharding/hs_shard_plan.hpp>
#include <xsoftmax/types.hpp>

#include <cstddef>
#include <vector>

namespace xsoftmax {

namespace detail {
/// Where each full-tree weight row lives in a plan: `owner` -1 for a top row (index into
/// `top_rows()`), else the rank, and the index into that rank's `local_rows`.
struct hs_row_place {
  std::vector<int> owner;
  std::vector<index_t> index;
};

template <int MaxDepth, class NodeForm>
hs_row_place place_rows(const hs_shard_plan<MaxDepth, NodeForm>& plan, index_t full_rows, const char* which) {
  hs_row_place p;
  p.owner.assign(static_cast<std::size_t>(full_rows), -2);
  p.index.assign(static_cast<std::size_t>(full_rows), -1);
  const auto put = [&](const std::vector<index_t>& rows, int owner) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const index_t r = rows[i];
      expects(r >= 0 && r < full_rows && p.owner[static_cast<std::size_t>(r)] == -2, "reshard_hs_rows: ", which,
              " plan places full-tree row ", r, " twice or outside the ", full_rows, " rows of the tree");
      p.owner[static_cast<std::size_t>(r)] = owner;
      p.index[static_cast<std::size_t>(r)] = static_cast<index_t>(i);
    }
  };
  put(plan.top_rows(), -1);
  for (int q = 0; q < plan.ranks(); ++q) put(plan.local_rows(q), q);
  return p;
}

template <int MaxDepth, class NodeForm>
index_t full_row_count(const hs_shard_plan<MaxDepth, NodeForm>& plan) {
  std::size_t n = plan.top_rows().size();
  for (int q = 0; q < plan.ranks(); ++q) n += plan.local_rows(q).size();
  return static_cast<index_t>(n);
}
}  // namespace detail

/// Rows each rank sends when `reshard_hs_rows` moves from `from`'s layout to `to`'s (multiply by
/// the row width and 4 bytes): an old local row that becomes a top row counts ranks - 1 times (the
/// gather hands it to every other rank), one that changes owner once. Local: no collective.
template <int MaxDepth, class NodeForm>
[[nodiscard]] std::vector<index_t> reshard_rows_sent(const hs_shard_plan<MaxDepth, NodeForm>& from,
                                                     const hs_shard_plan<MaxDepth, NodeForm>& to) {
  detail::expects(from.ranks() == to.ranks(), "reshard_rows_sent: the plans are for ", from.ranks(), " and ",
                  to.ranks(), " ranks");
  const index_t full_rows = detail::full_row_count(from);
  detail::expects(detail::full_row_count(to) == full_rows, "reshard_rows_sent: the plans cover ", full_rows, " and ",
                  detail::full_row_count(to), " weight rows: not the same tree");
  const detail::hs_row_place old = detail::place_rows(from, full_rows, "the old");
  std::vector<index_t> sent(static_cast<std::size_t>(from.ranks()), 0);
  for (index_t r : to.top_rows()) {
    const int p = old.owner[static_cast<std::size_t>(r)];
    if (p >= 0) sent[static_cast<std::size_t>(p)] += from.ranks() - 1;
  }
  for (int q = 0; q < to.ranks(); ++q)
    for (index_t r : to.local_rows(q)) {
      const int p = old.owner[static_cast<std::size_t>(r)];
      if (p >= 0 && p != q) ++sent[static_cast<std::size_t>(p)];
    }
  return sent;
}

/// Moves the rows of `from`'s layout (`from_top`: from.top_rows().size() x width, the same on
/// every rank; `from_local`: from.local_rows(rank) x width) into `to`'s layout (`to_top`,
/// `to_local`, overwritten). Collective over `comm` (every rank calls it with the same plans).
///
/// \tparam T float, or a storage type of `precision.hpp` (bf16, fp16); moved bitwise.
///
/// Throws, before any collective: `invalid_argument` when a plan was made for another number of
/// ranks than `comm.size()`, or the two plans do not cover the same tree (different class or
/// weight-row counts); `shape_error` when a view's row count is not its plan's or the widths differ.
template <class Communicator, int MaxDepth, class NodeForm, class T>
void reshard_hs_rows(const hs_shard_plan<MaxDepth, NodeForm>& from, const hs_shard_plan<MaxDepth, NodeForm>& to,
                     Communicator& comm, matrix_view<const T> from_top, matrix_view<const T> from_local,
                     matrix_view<T> to_top, matrix_view<T> to_local) {
  const int size = comm.size(), rank = comm.rank();
  detail::expects(from.ranks() == size && to.ranks() == size, "reshard_hs_rows: the plans are for ", from.ranks(),
                  " and ", to.ranks(), " ranks, the communicator has ", size);
  detail::expects(from.num_classes() == to.num_classes(), "reshard_hs_rows: the plans cover ", from.num_classes(),
                  " and ", to.num_classes(), " classes: not the same tree");
  const index_t full_rows = detail::full_row_count(from);
  detail::expects(detail::full_row_count(to) == full_rows, "reshard_hs_rows: the plans cover ", full_rows, " and ",
                  detail::full_row_count(to), " weight rows: not the same tree");
  const index_t width = from_top.cols;
  const auto shape = [&](index_t rows, index_t cols, std::size_t want, const char* name) {
    detail::expects<shape_error>(rows == static_cast<index_t>(want) && cols == width, "reshard_hs_rows: ", name, " is ",
                          rows, " x ", cols, ", expected ", want, " x ", width);
  };
  shape(from_top.rows, from_top.cols, from.top_rows().size(), "from_top");
  shape(from_local.rows, from_local.cols, from.local_rows(rank).size(), "from_local");
  shape(to_top.rows, to_top.cols, to.top_rows().size(), "to_top");
  shape(to_local.rows, to_local.cols, to.local_rows(rank).size(), "to_local");

  const detail::hs_row_place old = detail::place_rows(from, full_rows, "the old");
  detail::place_rows(to, full_rows, "the new");  // validates the new plan's rows
  const auto row_of = [&](index_t full_row) -> const T* {
    const std::size_t r = static_cast<std::size_t>(full_row);
    return old.owner[r] == -1 ? &from_top(old.index[r], 0) : &from_local(old.index[r], 0);
  };
  const auto append = [&](std::vector<float>& buf, index_t full_row) {
    const T* src = row_of(full_row);
    for (index_t j = 0; j < width; ++j) buf.push_back(to_float(src[j]));
  };
  // Fills `dst` (one row per entry of `rows`, full-tree ids): an old top row from here, any other
  // from `recv`, whose blocks come from the old owners in rank order (`counts` elements each) and
  // list their rows in the order of `rows`.
  const auto unpack = [&](const std::vector<index_t>& rows, matrix_view<T> dst, const std::vector<float>& recv,
                          const std::vector<index_t>& counts) {
    std::vector<index_t> cursor(static_cast<std::size_t>(size), 0);
    for (int q = 1; q < size; ++q)
      cursor[static_cast<std::size_t>(q)] = cursor[static_cast<std::size_t>(q - 1)] + counts[static_cast<std::size_t>(q - 1)];
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int q = old.owner[static_cast<std::size_t>(rows[i])];
      T* out = &dst(static_cast<index_t>(i), 0);
      if (q < 0) {
        const T* src = row_of(rows[i]);
        for (index_t j = 0; j < width; ++j) out[j] = src[j];
        continue;
      }
      const float* src = recv.data() + cursor[static_cast<std::size_t>(q)];
      for (index_t j = 0; j < width; ++j) out[j] = from_float<T>(src[j]);
      cursor[static_cast<std::size_t>(q)] += width;
    }
  };

  // New top rows: the old top ones are here; the others are gathered from their old owners, each
  // rank sending its share in new-top order (so the received blocks, in rank order, can be read back
  // in that order too).
  const std::vector<index_t>& new_top = to.top_rows();
  std::vector<index_t> counts(static_cast<std::size_t>(size), 0);
  std::vector<float> send, recv;
  for (index_t r : new_top) {
    const int q = old.owner[static_cast<std::size_t>(r)];
    if (q >= 0) counts[static_cast<std::size_t>(q)] += width;
    if (q == rank) append(send, r);
  }
  index_t gathered = 0;
  for (index_t c : counts) gathered += c;
  if (gathered > 0) {
    recv.resize(static_cast<std::size_t>(gathered));
    comm.all_gather(send.data(), counts[static_cast<std::size_t>(rank)], recv.data(), counts.data());
  }
  unpack(new_top, to_top, recv, counts);

  // New local rows: rank q's come from the old top rows (copied by q) or from their old owner p
  // (sent by p, in the order of q's new local rows).
  std::vector<index_t> send_counts(static_cast<std::size_t>(size), 0), recv_counts(static_cast<std::size_t>(size), 0);
  send.clear();
  for (int q = 0; q < size; ++q)
    for (index_t r : to.local_rows(q)) {
      const int p = old.owner[static_cast<std::size_t>(r)];
      if (p == rank) append(send, r), send_counts[static_cast<std::size_t>(q)] += width;
      if (q == rank && p >= 0) recv_counts[static_cast<std::size_t>(p)] += width;
    }
  index_t incoming = 0;
  for (index_t c : recv_counts) incoming += c;
  recv.assign(static_cast<std::size_t>(incoming), 0.f);
  comm.all_to_all(send.data(), send_counts.data(), recv.data(), recv_counts.data());
  unpack(to.local_rows(rank), to_local, recv, recv_counts);
}

}  // namespace xsoftmax
