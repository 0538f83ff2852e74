// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The steps a class-sharded head adds around its local algorithm, on every backend: gather the
/// batch's rows from every rank (data-parallel layout), combine each row's log-sum-exp statistics
/// over the ranks' class ranges, and return each row's hidden gradient to the rank that owns it.
/// A communicator works on host memory (`mpi_communicator`: a device backend's buffers are staged
/// through host copies) unless it declares `static constexpr bool device_memory = true`
/// (`nccl_communicator`): then the head's device buffers are passed as they are, and the few host
/// buffers of the algorithm (row counts, top-k candidates) are staged through device copies.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>

#include <thrust/copy.h>
#include <thrust/host_vector.h>

#include <cmath>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// Sum of `counts` (one per rank).
inline index_t total_of(const std::vector<index_t>& counts) {
  index_t total = 0;
  for (index_t c : counts) total += c;
  return total;
}

/// Element counts of `rows` rows (one count per rank) of `width` elements each.
inline std::vector<index_t> element_counts(const std::vector<index_t>& rows, index_t width) {
  std::vector<index_t> out(rows);
  for (index_t& x : out) x *= width;
  return out;
}

/// Runs `f(host_pointer)` on `n` elements at `data` (the execution's memory): in place on a host
/// backend, through a host copy (copied in, and back out when `write_back`) on a device backend.
template <class B, class T, class F>
void on_host(const execution<B>& ex, T* data, index_t n, bool write_back, F f) {
  if constexpr (is_host_backend<B>) {
    (void)ex, (void)n, (void)write_back;
    f(data);
  } else {
    std::vector<std::remove_const_t<T>> h(static_cast<std::size_t>(n));
    backend_ops<B>::copy(ex.res, h.data(), data, n);  // cudaMemcpyDefault: any direction
    backend_ops<B>::synchronize(ex.res);
    f(h.data());
    if constexpr (!std::is_const_v<T>) {
      if (write_back) {
        backend_ops<B>::copy(ex.res, data, h.data(), n);
        backend_ops<B>::synchronize(ex.res);
      }
    }
  }
}

/// Whether `Comm`'s collectives take device memory (`Comm::device_memory`; false when absent).
template <class Comm, class = void>
inline constexpr bool takes_device_memory = false;
template <class Comm>
inline constexpr bool takes_device_memory<Comm, std::void_t<decltype(Comm::device_memory)>> = Comm::device_memory;

/// Whether a device-memory communicator may be handed a host backend's buffers: false (a compile
/// error: NCCL would get host pointers). tests/sharding/nccl_mock_mpi.cpp sets it for
/// `nccl_communicator` over a host mock of CUDA and NCCL, to run the communicator without a GPU.
template <class Comm>
inline constexpr bool device_communicator_on_host = false;

/// Runs `f(pointer)` on `n` elements at `data` (the execution's memory) with a pointer to memory
/// `Comm` takes: host staging for a host-memory communicator (see `on_host`); for a device-memory
/// one, `data` itself after the execution's stream is synchronised (the communicator may run on
/// another stream; it returns with its results complete).
template <class Comm, class B, class T, class F>
void in_comm_memory(const execution<B>& ex, T* data, index_t n, bool write_back, F f) {
  if constexpr (takes_device_memory<Comm>) {
    static_assert(!is_host_backend<B> || device_communicator_on_host<Comm>,
                  "xsoftmax: a device-memory communicator (nccl_communicator) needs a device backend (cuda)");
    (void)n, (void)write_back;
    backend_ops<B>::synchronize(ex.res);
    f(data);
  } else {
    on_host(ex, data, n, write_back, f);
  }
}

/// Runs `f(pointer)` on `n` elements at host `data` with a pointer to memory `Comm` takes: `data`
/// itself, or a device copy (copied back when `write_back`) for a device-memory communicator.
template <class Comm, class B, class T, class F>
void host_in_comm_memory(const execution<B>& ex, T* data, index_t n, bool write_back, F f) {
  if constexpr (takes_device_memory<Comm>) {
    backend_vector<B, std::remove_const_t<T>> d(data, data + n);
    backend_ops<B>::synchronize(ex.res);
    f(raw(d));
    if constexpr (!std::is_const_v<T>)
      if (write_back) thrust::copy(d.begin(), d.end(), data);
  } else {
    (void)ex, (void)n, (void)write_back;
    f(data);
  }
}

/// All-gathers `count` elements at `send` (the execution's memory) into `recv` (the execution's
/// memory, `total` = sum(counts) elements), staging through the host only when `Comm` takes host
/// memory and the backend's memory is not host memory.
template <class Comm, class B, class T>
void all_gather_into(const execution<B>& ex, Comm& comm, const T* send, index_t count, T* recv, index_t total,
                     const index_t* counts) {
  if constexpr (takes_device_memory<Comm> || is_host_backend<B>) {
    (void)total;
    in_comm_memory<Comm>(ex, send, count, false, [&](const T* p) { comm.all_gather(p, count, recv, counts); });
  } else {
    std::vector<T> h(static_cast<std::size_t>(total));
    on_host(ex, send, count, false, [&](const T* p) { comm.all_gather(p, count, h.data(), counts); });
    backend_ops<B>::copy(ex.res, recv, h.data(), total);  // complete on return
  }
}
/// `all_gather_into` a vector (a backend or scratch vector) of sum(counts) elements.
template <class Comm, class B, class T, class Vector>
void all_gather_into(const execution<B>& ex, Comm& comm, const T* send, index_t count, Vector& recv,
                     const index_t* counts) {
  all_gather_into(ex, comm, send, count, static_cast<T*>(raw(recv)), static_cast<index_t>(recv.size()), counts);
}

/// The rows every rank scores: the gathered batch (every rank's packed rows in rank order, or the
/// replicated batch itself), where this rank's own rows start, and every rank's row count.
template <class B>
struct sharded_rows {
  batch_rows<B> all;                 ///< `sample` is unused; `target` holds global class ids
  scratch_vector<B, float> upstream; ///< all.rows, when gradients are wanted
  std::vector<index_t> counts;       ///< rows of each rank (replicated: every rank's = all.rows)
  index_t own_offset = 0;            ///< first row of this rank's own rows in `all`
};

/// Every rank's `mine` (one count each), in rank order: one all_gather of one index per rank.
template <class B, class Comm>
std::vector<index_t> gather_counts(const execution<B>& ex, const class_sharding<Comm>& sh, index_t mine) {
  const int size = sh.size();
  const std::vector<index_t> ones(static_cast<std::size_t>(size), 1);
  std::vector<index_t> counts(static_cast<std::size_t>(size));
  host_in_comm_memory<Comm>(ex, &mine, 1, false, [&](const index_t* send) {
    host_in_comm_memory<Comm>(ex, counts.data(), size, true, [&](index_t* recv) {
      sh.communicator().all_gather(send, 1, recv, ones.data());
    });
  });
  return counts;
}

/// Gathers `own` (this rank's packed rows) and its `upstream` gradients (may be null) from every
/// rank; in the replicated layout `own` already is the batch and is moved in.
template <class B, class Comm>
sharded_rows<B> gather_rows(const execution<B>& ex, const class_sharding<Comm>& sh, batch_rows<B> own,
                            non_deduced<scratch_vector<B, float>>* upstream) {
  sharded_rows<B> out;
  const int size = sh.size();
  if (sh.layout() == hidden_layout::replicated) {
    out.counts.assign(static_cast<std::size_t>(size), own.rows);
    out.all = std::move(own);
    if (upstream) out.upstream = std::move(*upstream);
    return out;
  }
  Comm& comm = sh.communicator();
  out.counts = gather_counts(ex, sh, own.rows);
  index_t total = 0;
  for (int q = 0; q < size; ++q) {
    if (q == sh.rank()) out.own_offset = total;
    total += out.counts[static_cast<std::size_t>(q)];
  }
  const index_t d = own.dim;
  const std::vector<index_t> elements = element_counts(out.counts, d);
  out.all.dim = d;
  out.all.rows = total;
  out.all.hidden.resize(static_cast<std::size_t>(total * d), ex);
  out.all.target.resize(static_cast<std::size_t>(total), ex);
  if (upstream) out.upstream.resize(static_cast<std::size_t>(total), ex);
  all_gather_into(ex, comm, raw(own.hidden), own.rows * d, out.all.hidden, elements.data());
  all_gather_into(ex, comm, raw(own.target), own.rows, out.all.target, out.counts.data());
  if (upstream) all_gather_into(ex, comm, raw(*upstream), own.rows, out.upstream, out.counts.data());
  return out;
}

/// Row r's local (max, sum) rescaled to the global max (a rank whose classes all scored -inf for a
/// row contributes nothing).
struct rescale_to_global_max {
  float* max;
  float* sum;
  const float* global_max;
  XSOFTMAX_HD void operator()(index_t r) const {
    const float g = global_max[r];
    sum[r] = max[r] == -INFINITY ? 0.f : sum[r] * ::expf(max[r] - g);
    max[r] = g;
  }
};

/// Replaces a block's row statistics (see `dense_row_statistics`) by those over every rank's block:
/// one max all-reduce, then one sum all-reduce of (rescaled sum, target score, finite sum) and, with
/// label smoothing, one of the finite counts. The target's score is 0 on the ranks that do not hold
/// the target, so the sum is the owner's.
template <class B, class Comm>
void combine_row_statistics(const execution<B>& ex, Comm& comm, const dense_row_statistics& st) {
  const index_t rows = st.rows;
  scratch_buffer<B, float> global_max(static_cast<std::size_t>(rows), ex);  // both buffers copied into first
  thrust::copy(ex.policy(), st.max, st.max + rows, global_max.begin());
  in_comm_memory<Comm>(ex, raw(global_max), rows, true, [&](float* p) { comm.all_reduce(p, rows, reduce_op::max); });
  parallel_for(ex, rows, rescale_to_global_max{st.max, st.sum, raw(global_max)});
  const index_t parts = st.finite_sum ? 3 : 2;
  scratch_buffer<B, float> packed(static_cast<std::size_t>(parts * rows), ex);
  thrust::copy(ex.policy(), st.sum, st.sum + rows, packed.begin());
  thrust::copy(ex.policy(), st.target_logit, st.target_logit + rows, packed.begin() + rows);
  if (st.finite_sum) thrust::copy(ex.policy(), st.finite_sum, st.finite_sum + rows, packed.begin() + 2 * rows);
  in_comm_memory<Comm>(ex, raw(packed), parts * rows, true,
                       [&](float* p) { comm.all_reduce(p, parts * rows, reduce_op::sum); });
  thrust::copy(ex.policy(), packed.begin(), packed.begin() + rows, st.sum);
  thrust::copy(ex.policy(), packed.begin() + rows, packed.begin() + 2 * rows, st.target_logit);
  if (st.finite_sum) {
    thrust::copy(ex.policy(), packed.begin() + 2 * rows, packed.end(), st.finite_sum);
    in_comm_memory<Comm>(ex, st.finite_count, rows, true,
                         [&](index_t* p) { comm.all_reduce(p, rows, reduce_op::sum); });
  }
}

/// `rows.all`'s hidden gradients (this rank's classes' contributions, all.rows x d) summed over the
/// ranks and returned to their owner: this rank's own rows (reduce-scatter), or every row when
/// the batch is replicated (all-reduce). The result is in the execution's memory.
template <class B, class Comm>
scratch_vector<B, float> return_row_gradients(const execution<B>& ex, const class_sharding<Comm>& sh,
                                              const sharded_rows<B>& rows, scratch_vector<B, float>& grad_all) {
  Comm& comm = sh.communicator();
  const index_t d = rows.all.dim, total = rows.all.rows;
  if (sh.layout() == hidden_layout::replicated) {
    in_comm_memory<Comm>(ex, raw(grad_all), total * d, true,
                         [&](float* p) { comm.all_reduce(p, total * d, reduce_op::sum); });
    return std::move(grad_all);
  }
  const std::vector<index_t> elements = element_counts(rows.counts, d);
  const index_t mine = elements[static_cast<std::size_t>(sh.rank())];
  if constexpr (takes_device_memory<Comm> || is_host_backend<B>) {
    scratch_vector<B, float> own(static_cast<std::size_t>(mine), ex);
    in_comm_memory<Comm>(ex, raw(grad_all), total * d, false,
                         [&](float* p) { comm.reduce_scatter(p, raw(own), elements.data()); });
    return own;
  } else {
    thrust::host_vector<float> own(static_cast<std::size_t>(mine));
    on_host(ex, raw(grad_all), total * d, false,
            [&](float* p) { comm.reduce_scatter(p, raw(own), elements.data()); });
    scratch_vector<B, float> out(static_cast<std::size_t>(mine), ex);
    backend_ops<B>::copy(ex.res, out.data(), own.data(), mine);  // complete on return
    return out;
  }
}

/// A sharded verb's rows: `own`, this rank's packed rows' sample map (where its results go back:
/// dim, rows and sample ids, no hidden rows), and `rows`, the rows every rank scores.
template <class B>
struct sharded_batch {
  batch_rows<B> own;
  sharded_rows<B> rows;
};

/// The set-up of a sharded loss verb: this rank's rows packed (ignored targets dropped), their
/// upstream gradients when `with_upstream`, and every rank's rows gathered (moved in when the rows
/// are replicated). Every rank sees the same options, so every rank throws here alike, before any
/// collective.
template <class B, class Comm, class H>
sharded_batch<B> gather_batch(const execution<B>& ex, const char* where, const class_sharding<Comm>& sh,
                               matrix_view<const H> hidden, vector_view<const index_t> targets,
                               const loss_options& options, bool with_upstream, vector_view<const float> grad_output) {
  batch_rows<B> packed = pack_rows(ex, hidden, targets, options.ignore_index);
  scratch_vector<B, float> upstream;
  if (with_upstream) upstream = upstream_gradients(ex, where, packed, hidden.rows, options.reduce, grad_output);
  sharded_batch<B> out;
  out.own.dim = packed.dim;
  out.own.rows = packed.rows;
  out.own.sample = packed.sample;
  out.rows = gather_rows(ex, sh, std::move(packed), with_upstream ? &upstream : nullptr);
  return out;
}

/// The tear-down of a sharded loss verb: `grad_all` (the gathered `rows`' hidden gradients from
/// this rank's classes; read only with `grad_hidden`) summed and returned to each row's owner and
/// scattered into `grad_hidden`; this rank's rows' `losses` (of the gathered rows) scattered into
/// `per_sample` (when not empty) and reduced into `loss` (when not null). `own`: this rank's sample
/// map (`sharded_batch::own`).
template <class B, class Comm>
void finish_batch(const execution<B>& ex, const class_sharding<Comm>& sh, const sharded_rows<B>& rows,
                  const batch_rows<B>& own, scratch_vector<B, float>& grad_all, const scratch_vector<B, float>& losses,
                  reduction reduce, vector_view<float> per_sample, matrix_view<float>* grad_hidden, float* loss) {
  if (grad_hidden) {
    scratch_vector<B, float> own_grad = return_row_gradients(ex, sh, rows, grad_all);
    scatter_rows(ex, own, raw(own_grad), *grad_hidden);
  }
  const float* own_losses = raw(losses) + rows.own_offset;
  if (per_sample.size != 0) scatter_losses(ex, own, own_losses, per_sample);
  if (loss) reduce_losses_into(ex, own_losses, own.rows, reduce, loss);
}

/// t[i] - first: global class ids as columns of the block that starts at class `first` (a target
/// outside the block falls outside [0, block size), which the dense softmax ignores).
template <class B>
scratch_vector<B, index_t> block_columns(const execution<B>& ex, const scratch_vector<B, index_t>& t, index_t first) {
  scratch_vector<B, index_t> out(t.size(), ex);
  const index_t* in = raw(t);
  index_t* o = raw(out);
  XSOFTMAX_PARALLEL_FOR(ex, static_cast<index_t>(t.size()), i, { o[i] = in[i] - first; });
  return out;
}

}  // namespace xsoftmax::detail
