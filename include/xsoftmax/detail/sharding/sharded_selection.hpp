// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The steps a class-sharded `selective_softmax` adds to those of `sharded_rows.hpp`: the gathered
/// rows' sample ids in the concatenated batch (so that every rank hands its selector the same
/// request), this rank's slice of the global active set (its classes, as local weight rows, with
/// each row's target position in the slice), and this rank's share of a KNN graph build: through
/// the ring (a communicator with `shift`: no rank holds more than its own rows and graph rows) or,
/// otherwise, from the whole weight matrix gathered from the shards.

#include <xsoftmax/detail/selection/scratch_active_set.hpp>
#include <xsoftmax/detail/sharding/sharded_rows.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/scan.h>

#include <algorithm>
#include <vector>

namespace xsoftmax::detail {

/// Fills `rows.all.sample` with each gathered row's sample id in the concatenated batch (rank q's
/// sample i is sum_{p<q} batch_rows_p + i; replicated: the batch's own ids, already there) from this
/// rank's packed `own_sample` ids; returns the rows of the concatenated batch (ignored rows included).
template <class B, class Comm>
index_t gather_samples(const execution<B>& ex, const class_sharding<Comm>& sh, const scratch_vector<B, index_t>& own_sample,
                       index_t own_batch_rows, sharded_rows<B>& rows) {
  if (sh.layout() == hidden_layout::replicated) return own_batch_rows;
  Comm& comm = sh.communicator();
  const int size = sh.size();
  const std::vector<index_t> batch = gather_counts(ex, sh, own_batch_rows);
  index_t first = 0, total = 0;
  for (int q = 0; q < size; ++q) {
    if (q == sh.rank()) first = total;
    total += batch[static_cast<std::size_t>(q)];
  }
  // Offset this rank's ids before the gather: every rank receives global ids in rank order.
  scratch_buffer<B, index_t> mine(own_sample.size(), ex);
  const index_t* in = raw(own_sample);
  index_t* o = raw(mine);
  XSOFTMAX_PARALLEL_FOR(ex, static_cast<index_t>(mine.size()), i, { o[i] = in[i] + first; });
  rows.all.sample.resize(static_cast<std::size_t>(rows.all.rows), ex);
  all_gather_into(ex, comm, raw(mine), static_cast<index_t>(mine.size()), rows.all.sample, rows.counts.data());
  return total;
}

/// This rank's slice of a validated global active set: the classes in [begin, end) as local weight
/// rows (class - begin), with their logit offsets, and each row's target position in the slice
/// (-1 where another rank holds the target).
template <class B>
struct local_active_set {
  scratch_active_set<B> set;
  scratch_vector<B, index_t> target_pos;
};

/// Slices `set` (global classes; `pos`: each of `rows` rows' target position, from `locate_targets`)
/// to the classes [begin, end), on the backend where it lives.
template <class B, class Set>
local_active_set<B> slice_active_set(const execution<B>& ex, const Set& set, const scratch_vector<B, index_t>& pos,
                                     index_t rows, index_t begin, index_t end) {
  local_active_set<B> out;
  out.set.layout = set.layout;
  out.target_pos.resize(static_cast<std::size_t>(rows), ex);  // every row's written below
  const index_t* p = raw(pos);
  index_t* lp = raw(out.target_pos);
  if (set.layout == active_layout::shared) {  // ascending: the slice is one run [lo, hi)
    count_host_read(), count_host_read();  // lo and hi
    const index_t lo = static_cast<index_t>(thrust::lower_bound(ex.policy(), set.classes.begin(), set.classes.end(), begin) -
                                            set.classes.begin());
    const index_t hi = static_cast<index_t>(thrust::lower_bound(ex.policy(), set.classes.begin(), set.classes.end(), end) -
                                            set.classes.begin());
    const index_t n = hi - lo;
    out.set.classes.resize(static_cast<std::size_t>(n), ex);
    const index_t* c = thrust::raw_pointer_cast(set.classes.data());
    index_t* lc = raw(out.set.classes);
    XSOFTMAX_PARALLEL_FOR(ex, n, j, { lc[j] = c[lo + j] - begin; });
    const auto slice = [&](const auto& from, scratch_vector<B, float>& to) {  // an offset vector's run [lo, hi)
      if (from.empty()) return;
      to.resize(static_cast<std::size_t>(n), ex);
      thrust::copy(ex.policy(), from.begin() + lo, from.begin() + hi, to.begin());
    };
    slice(set.negative_offset, out.set.negative_offset);
    slice(set.target_offset, out.set.target_offset);
    XSOFTMAX_PARALLEL_FOR(ex, rows, r, { lp[r] = p[r] >= lo && p[r] < hi ? p[r] - lo : -1; });
    return out;
  }
  // Per sample: each row keeps its entries in [begin, end), in order (so its first target entry
  // stays its first target entry).
  const index_t* off = thrust::raw_pointer_cast(set.offsets.data());
  const index_t* ids = thrust::raw_pointer_cast(set.ids.data());
  const float* eo = set.id_offset.empty() ? nullptr : thrust::raw_pointer_cast(set.id_offset.data());
  out.set.offsets.resize(static_cast<std::size_t>(rows + 1), ex);
  index_t* loff = raw(out.set.offsets);
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    index_t count = 0;
    for (index_t e = off[r]; e < off[r + 1]; ++e) count += ids[e] >= begin && ids[e] < end ? 1 : 0;
    loff[r] = count;
  });
  thrust::exclusive_scan(ex.policy(), out.set.offsets.begin(), out.set.offsets.end(), out.set.offsets.begin());
  const index_t nnz = backend_ops<B>::read(ex.res, loff + rows);
  out.set.ids.resize(static_cast<std::size_t>(nnz), ex);
  out.set.id_offset.resize(eo ? static_cast<std::size_t>(nnz) : 0, ex);
  index_t* lids = raw(out.set.ids);
  float* leo = eo ? raw(out.set.id_offset) : nullptr;
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    index_t o = loff[r];
    lp[r] = -1;
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      if (ids[e] < begin || ids[e] >= end) continue;
      if (e == p[r]) lp[r] = o;
      lids[o] = ids[e] - begin;
      if (leo) leo[o] = eo[e];
      ++o;
    }
  });
  return out;
}

/// The whole weight matrix (num_classes x dim, storage type T, in the backend's memory), gathered
/// from every rank's local rows (through fp32: the communicators move floats; bf16 and fp16 round
/// trip through fp32 exactly). Costs num_classes x dim x (4 + sizeof(T)) bytes on every rank while
/// it lives.
template <class B, class Comm, class T>
backend_vector<B, T> gather_weights(const execution<B>& ex, const class_sharding<Comm>& sh, matrix_view<const T> local) {
  const index_t d = local.cols, n_local = local.rows, n = sh.num_classes();
  backend_vector<B, float> mine(static_cast<std::size_t>(n_local * d)), all(static_cast<std::size_t>(n * d));
  float* m = raw(mine);
  XSOFTMAX_PARALLEL_FOR(ex, n_local * d, e, { m[e] = to_float(local(e / d, e % d)); });
  std::vector<index_t> counts(static_cast<std::size_t>(sh.size()));
  for (int q = 0; q < sh.size(); ++q) counts[static_cast<std::size_t>(q)] = (sh.shard_begin(q + 1) - sh.shard_begin(q)) * d;
  all_gather_into(ex, sh.communicator(), m, n_local * d, all, counts.data());
  backend_vector<B, T> out(all.size());
  const float* a = raw(all);
  T* o = raw(out);
  XSOFTMAX_PARALLEL_FOR(ex, n * d, e, { o[e] = from_float<T>(a[e]); });
  return out;
}

/// This rank's share of an exact KNN graph build from the gathered weights: the rows of its
/// classes; the shares' rows are all-gathered into the whole graph (so every rank does 1/S of the
/// build's O(N^2 d) work). `ex` and `sh` must outlive the share. The path of a communicator without
/// the ring step (`graph_ring_share` otherwise).
template <class B, class Comm>
knn_build_share graph_build_share(const execution<B>& ex, const class_sharding<Comm>& sh) {
  knn_build_share share;
  share.first = sh.class_begin();
  share.count = sh.local_classes();
  share.all_gather = [&ex, &sh](const index_t* ids, const float* sims, index_t k, index_t* all_ids, float* all_sims) {
    std::vector<index_t> counts(static_cast<std::size_t>(sh.size()));
    for (int q = 0; q < sh.size(); ++q)
      counts[static_cast<std::size_t>(q)] = (sh.shard_begin(q + 1) - sh.shard_begin(q)) * k;
    const index_t mine = counts[static_cast<std::size_t>(sh.rank())], total = sh.num_classes() * k;
    all_gather_into(ex, sh.communicator(), ids, mine, all_ids, total, counts.data());
    all_gather_into(ex, sh.communicator(), sims, mine, all_sims, total, counts.data());
  };
  return share;
}

/// Whether a sharding's graph builds go round the ring (its communicator has `shift`).
template <class Sharding>
inline constexpr bool has_ring = false;
template <class Comm>
inline constexpr bool has_ring<class_sharding<Comm>> = has_shift<Comm, float>;

/// One ring step on `send` / `recv` in the execution's memory (see `all_gather_into` for the staging).
template <class Comm, class B, class T>
void shift_into(const execution<B>& ex, Comm& comm, const T* send, index_t send_count, T* recv, index_t recv_count) {
  if constexpr (takes_device_memory<Comm> || is_host_backend<B>) {
    in_comm_memory<Comm>(ex, send, send_count, false, [&](const T* p) { comm.shift(p, send_count, recv, recv_count); });
  } else {
    std::vector<T> h(static_cast<std::size_t>(recv_count));
    on_host(ex, send, send_count, false, [&](const T* p) { comm.shift(p, send_count, h.data(), recv_count); });
    backend_ops<B>::copy(ex.res, recv, h.data(), recv_count);
  }
}

/// This rank's share of a graph build through the ring (see `knn_build_share`): its rows, every
/// rank's first class, the ring step (`ex` and `sh` must outlive the build), and the row gather a
/// selector keeps (it holds copies of the sharding and the resources): every rank packs the first
/// `used` neighbours of the targets it owns, in row order, one all-gather (rows x used ids in all)
/// gives every rank every target's row.
template <class B, class Comm>
knn_build_share graph_ring_share(const execution<B>& ex, const class_sharding<Comm>& sh) {
  knn_build_share share;
  share.first = sh.class_begin();
  share.count = sh.local_classes();
  share.rank = sh.rank();
  for (int q = 0; q <= sh.size(); ++q) share.bounds.push_back(sh.shard_begin(q));
  share.shift = [&ex, &sh](const float* send, index_t send_count, float* recv, index_t recv_count) {
    shift_into(ex, sh.communicator(), send, send_count, recv, recv_count);
  };
  share.gather_rows = [sh, res = ex.res, bounds = share.bounds](const index_t* targets, index_t rows,
                                                                 const index_t* own, index_t k, index_t used,
                                                                 index_t* out) {
    const execution<B> ex{res};
    const int size = sh.size(), rank = sh.rank();
    const index_t begin = sh.class_begin();
    std::vector<int> owner(static_cast<std::size_t>(rows));
    std::vector<index_t> counts(static_cast<std::size_t>(size), 0), mine;
    for (index_t r = 0; r < rows; ++r) {
      const index_t t = targets[r];
      const int q = static_cast<int>(std::upper_bound(bounds.begin(), bounds.end(), t) - bounds.begin()) - 1;
      owner[static_cast<std::size_t>(r)] = q;
      counts[static_cast<std::size_t>(q)] += used;
      if (q == rank) mine.insert(mine.end(), own + (t - begin) * k, own + (t - begin) * k + used);
    }
    const index_t total = rows * used;
    scratch_buffer<B, index_t> send(mine.size(), ex), all(static_cast<std::size_t>(total), ex);
    backend_ops<B>::copy(ex.res, raw(send), mine.data(), static_cast<index_t>(mine.size()));
    all_gather_into(ex, sh.communicator(), raw(send), static_cast<index_t>(mine.size()), all, counts.data());
    std::vector<index_t> h(static_cast<std::size_t>(total)), at(static_cast<std::size_t>(size), 0);
    backend_ops<B>::copy(ex.res, h.data(), raw(all), total);
    for (int q = 1; q < size; ++q)
      at[static_cast<std::size_t>(q)] = at[static_cast<std::size_t>(q) - 1] + counts[static_cast<std::size_t>(q) - 1];
    for (index_t r = 0; r < rows; ++r) {  // each owner's block lists its targets' rows in row order
      index_t& from = at[static_cast<std::size_t>(owner[static_cast<std::size_t>(r)])];
      std::copy_n(h.begin() + from, used, out + r * used);
      from += used;
    }
  };
  return share;
}

}  // namespace xsoftmax::detail
