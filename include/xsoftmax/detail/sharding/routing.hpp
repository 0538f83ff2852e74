// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The moves of a routed sharded head (the sharded hierarchical softmax: rows sent to the owner of
/// their target's subtree and their results sent back), on every backend: an all-to-all between
/// buffers in the execution's memory, one between host buffers, and the row gathers and
/// scatter-adds around them. The routing's bookkeeping (which row goes where) is host-side; rows
/// and gradients stay in the execution's memory, staged through the host only for a host-memory
/// communicator on a device backend (as `all_gather_into`, sharded_rows.hpp).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/sharding/sharded_rows.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// `n` elements at `data` (the execution's memory) as a host vector.
template <class B, class T>
std::vector<std::remove_const_t<T>> to_host(const execution<B>& ex, T* data, index_t n) {
  std::vector<std::remove_const_t<T>> out(static_cast<std::size_t>(n));
  if (n > 0) {
    backend_ops<B>::copy(ex.res, out.data(), data, n);
    backend_ops<B>::synchronize(ex.res);
  }
  return out;
}

/// All-to-all of `send` (sum(send_counts) elements, the execution's memory, blocks in rank order)
/// into `recv` (sum(recv_counts) elements, the execution's memory); counts on the host. Staged
/// through host copies only when `Comm` takes host memory and the backend's memory is not.
template <class Comm, class B, class T>
void all_to_all_into(const execution<B>& ex, Comm& comm, const T* send, const std::vector<index_t>& send_counts,
                     T* recv, const std::vector<index_t>& recv_counts) {
  const index_t out = total_of(send_counts), in = total_of(recv_counts);
  if constexpr (takes_device_memory<Comm> || is_host_backend<B>) {
    (void)out, (void)in;
    backend_ops<B>::synchronize(ex.res);  // `send` may have been written on the execution's stream
    comm.all_to_all(send, send_counts.data(), recv, recv_counts.data());
  } else {
    std::vector<T> h_in(static_cast<std::size_t>(in));
    on_host(ex, send, out, false, [&](const T* p) { comm.all_to_all(p, send_counts.data(), h_in.data(), recv_counts.data()); });
    if (in > 0) backend_ops<B>::copy(ex.res, recv, h_in.data(), in);
    backend_ops<B>::synchronize(ex.res);
  }
}

/// All-to-all of host `send` into host `recv` (the routing's small per-row arrays: counts,
/// classes, upstream gradients), through device copies for a device-memory communicator.
template <class Comm, class B, class T>
void host_all_to_all(const execution<B>& ex, Comm& comm, const T* send, const std::vector<index_t>& send_counts,
                     T* recv, const std::vector<index_t>& recv_counts) {
  host_in_comm_memory<Comm>(ex, send, total_of(send_counts), false, [&](const T* s) {
    host_in_comm_memory<Comm>(ex, recv, total_of(recv_counts), true, [&](T* r) {
      comm.all_to_all(s, send_counts.data(), r, recv_counts.data());
    });
  });
}

/// Row counts to and from every rank: `recv_rows[q]` = rank q's `send_rows[rank]`. Collective.
template <class Comm, class B>
std::vector<index_t> exchange_counts(const execution<B>& ex, Comm& comm, const std::vector<index_t>& send_rows) {
  const std::vector<index_t> ones(send_rows.size(), 1);
  std::vector<index_t> recv_rows(send_rows.size(), 0);
  host_all_to_all(ex, comm, send_rows.data(), ones, recv_rows.data(), ones);
  return recv_rows;
}

/// Every rank's `count` host elements at `send`, concatenated in rank order into host `recv`
/// (`counts[q]` from rank q), through device copies for a device-memory communicator.
template <class Comm, class B, class T>
void host_all_gather(const execution<B>& ex, Comm& comm, const T* send, index_t count, T* recv,
                     const std::vector<index_t>& counts) {
  host_in_comm_memory<Comm>(ex, send, count, false, [&](const T* s) {
    host_in_comm_memory<Comm>(ex, recv, total_of(counts), true, [&](T* r) { comm.all_gather(s, count, r, counts.data()); });
  });
}

/// dst row p = src.row(rows[p]) for the n rows p (`dst` contiguous, src.cols wide; all in the
/// execution's memory).
template <class B, class T>
void gather_rows_by(const execution<B>& ex, matrix_view<const T> src, const index_t* rows, index_t n, T* dst) {
  const index_t width = src.cols;
  XSOFTMAX_PARALLEL_FOR(ex, n, p, {
    const T* s = src.row(rows[p]);
    T* o = dst + p * width;
    for (index_t c = 0; c < width; ++c) o[c] = s[c];
  });
}

/// dst row rows[p] = src row p, for the n rows p (`width` elements each, both contiguous; all in
/// the execution's memory; `rows` unique).
template <class B, class T>
void scatter_rows_to(const execution<B>& ex, const T* src, index_t width, const index_t* rows, index_t n, T* dst) {
  XSOFTMAX_PARALLEL_FOR(ex, n, p, {
    const T* s = src + p * width;
    T* o = dst + rows[p] * width;
    for (index_t c = 0; c < width; ++c) o[c] = s[c];
  });
}

/// reply row rows[j] = (loss[j], then grad row j when `grad` is not null) for the n rows j of one
/// scoring call: a row of `reply` is 1 + d wide with gradients, 1 without (all in the execution's
/// memory).
template <class B>
void place_replies(const execution<B>& ex, const float* loss, const float* grad, index_t d, const index_t* rows,
                   index_t n, float* reply) {
  const index_t width = grad ? 1 + d : 1;
  XSOFTMAX_PARALLEL_FOR(ex, n, j, {
    float* to = reply + rows[j] * width;
    to[0] = loss[j];
    if (grad)
      for (index_t c = 0; c < d; ++c) to[1 + c] = grad[j * d + c];
  });
}

/// The routed rows' results added to their own rows: for each of the n routed rows p with
/// dest[p] >= 0, part[dest[p]] += back row p's loss and, with gradients (`grad_hidden` not empty),
/// grad_hidden row dest[p] += its gradient (`back` rows are 1 + d wide then, else 1). Each row
/// appears once in `dest` (all in the execution's memory).
template <class B>
void add_routed_results(const execution<B>& ex, const float* back, const index_t* dest, index_t n, float* part,
                        matrix_view<float> grad_hidden) {
  const bool with_grad = grad_hidden.data != nullptr;
  const index_t d = grad_hidden.cols, width = with_grad ? 1 + d : 1;
  XSOFTMAX_PARALLEL_FOR(ex, n, p, {
    const index_t i = dest[p];
    if (i < 0) return;
    const float* f = back + p * width;
    part[i] += f[0];
    if (with_grad) {
      float* g = grad_hidden.row(i);
      for (index_t c = 0; c < d; ++c) g[c] += f[1 + c];
    }
  });
}

}  // namespace xsoftmax::detail
