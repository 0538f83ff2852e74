// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The prefetch of a class-sharded head's rows (issue 14): `gathered_batch`, a handle owning one
/// micro-batch's hidden rows gathered from every rank by a gather started ahead of the verb that
/// scores them, so that the next batch's gather runs while the current one computes.
///
/// The rows are gathered *before* the targets are known, so every row travels (ignored ones too);
/// when the verb runs, the targets (a few bytes a row) are gathered blocking and the ignored rows
/// are dropped from the gathered matrix, which leaves exactly the rows, in exactly the order, that
/// the blocking verb's `gather_rows` produces: the results are bitwise the blocking verb's.

#include <xsoftmax/detail/sharding/routing.hpp>
#include <xsoftmax/detail/sharding/sharded_rows.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

/// The communicator of a sharding policy (`void` for `no_sharding`).
template <class Sharding>
struct communicator_of {
  using type = void;
};
template <class Comm>
struct communicator_of<class_sharding<Comm>> {
  using type = Comm;
};

/// `start_all_gather`'s request type of `Comm` for T buffers (a placeholder when it has none).
template <class Comm, class T, bool = has_start_all_gather<Comm, T>>
struct gather_request_of {
  struct type {
    void wait() {}
  };
};
template <class Comm, class T>
struct gather_request_of<Comm, T, true> {
  using type = decltype(std::declval<Comm&>().start_all_gather(std::declval<const T*>(), index_t{},
                                                              std::declval<T*>(), std::declval<const index_t*>()));
};

/// What a `gathered_batch` owns.
template <class B, class Comm>
struct gathered_state {
  const void* owner = nullptr;  ///< the head that started the gather
  index_t rows = 0, dim = 0;    ///< this rank's batch
  bool used = false;
  bool replicated = false;            ///< the head's layout replicates the rows: nothing moves
  scratch_vector<B, float> own;       ///< this rank's rows as fp32 (the gather's send buffer)
  scratch_vector<B, float> all;       ///< every rank's rows in rank order, complete after `complete()`
  std::vector<float> host_send, host_recv;  ///< staging (device backend, host-memory communicator)
  std::vector<index_t> counts;              ///< every rank's batch rows
  /// The running gather. Declared last: destroyed (which waits for it) before the buffers it uses.
  std::optional<typename gather_request_of<Comm, float>::type> pending;

  /// Waits for the gather (if still running) and leaves every rank's rows in `all`.
  void complete() {
    if (!pending) return;
    pending->wait();
    pending.reset();
    if (!host_recv.empty()) thrust::copy(host_recv.begin(), host_recv.end(), all.begin());
  }
};

}  // namespace xsoftmax::detail

namespace xsoftmax {

namespace detail {
struct gathered_access;
}

/// One micro-batch's hidden rows, gathered from every rank ahead of the verb that scores them:
/// returned by a class-sharded head's `gather_rows_async(hidden)` and passed, once, to that head's
/// `forward`, `forward_backward`, `backward`, `log_prob` or `topk` in place of `hidden`. Owns a
/// copy of this rank's rows (fp32) and the gathered rows, and the gather while it runs: destroying
/// it unused waits for the gather. Move-only.
template <class Backend, class Communicator>
class gathered_batch {
 public:
  gathered_batch() = default;
  /// This rank's batch rows: the verb's targets and outputs have this many rows.
  [[nodiscard]] index_t rows() const { return state_ ? state_->rows : 0; }
  [[nodiscard]] index_t dim() const { return state_ ? state_->dim : 0; }
  /// False when default-constructed or moved from, or once a verb has used it.
  [[nodiscard]] bool usable() const { return state_ && !state_->used; }

 private:
  friend struct detail::gathered_access;
  std::unique_ptr<detail::gathered_state<Backend, Communicator>> state_;
};

namespace detail {
/// The head's access to a `gathered_batch`'s state.
struct gathered_access {
  template <class B, class C>
  static gathered_batch<B, C> make(std::unique_ptr<gathered_state<B, C>> s) {
    gathered_batch<B, C> g;
    g.state_ = std::move(s);
    return g;
  }
  template <class B, class C>
  static gathered_state<B, C>* state(const gathered_batch<B, C>& g) { return g.state_.get(); }
};

/// Packs `hidden` as fp32 and starts gathering it from every rank (data-parallel layout; the
/// counts are gathered first, blocking) with the communicator's `start_all_gather`, or gathers it
/// at once when the communicator has none. Collective.
template <class B, class Comm, class H>
gathered_batch<B, Comm> start_gather(const execution<B>& ex, const class_sharding<Comm>& sh,
                                     matrix_view<const H> hidden, const void* owner) {
  auto st = std::make_unique<gathered_state<B, Comm>>();
  st->owner = owner, st->rows = hidden.rows, st->dim = hidden.cols;
  st->own = std::move(pack_rows(ex, hidden, {}, 0).hidden);
  const int size = sh.size();
  if (sh.layout() == hidden_layout::replicated) {
    st->replicated = true;
    st->counts.assign(static_cast<std::size_t>(size), hidden.rows);
    return gathered_access::make(std::move(st));
  }
  Comm& comm = sh.communicator();
  st->counts = gather_counts(ex, sh, hidden.rows);
  const index_t d = hidden.cols, n = hidden.rows * d;
  const std::vector<index_t> elements = element_counts(st->counts, d);
  const index_t total = total_of(elements);
  st->all.resize(static_cast<std::size_t>(total), ex);
  if constexpr (has_start_all_gather<Comm, float>) {
    if constexpr (takes_device_memory<Comm> || is_host_backend<B>) {
      in_comm_memory<Comm>(ex, raw(st->own), n, false, [&](const float* p) {
        st->pending.emplace(comm.start_all_gather(p, n, raw(st->all), elements.data()));
      });
    } else {  // a device backend's rows through host buffers that live as long as the gather
      st->host_send.resize(static_cast<std::size_t>(n));
      st->host_recv.resize(static_cast<std::size_t>(total));
      backend_ops<B>::synchronize(ex.res);  // pack_rows wrote `own` on the head's stream
      thrust::copy(st->own.begin(), st->own.end(), st->host_send.begin());
      st->pending.emplace(comm.start_all_gather(st->host_send.data(), n, st->host_recv.data(), elements.data()));
    }
  } else {  // no non-blocking gather (e.g. the PyTorch process group's communicator): gather now
    all_gather_into(ex, comm, raw(st->own), n, st->all, elements.data());
  }
  return gathered_access::make(std::move(st));
}
}  // namespace detail

}  // namespace xsoftmax

namespace xsoftmax::detail {

/// The rows a verb scores from a prefetched batch, as `gather_rows` would have gathered them:
/// waits for the gather, gathers every rank's `targets` (blocking; none for `topk`: every row
/// counts) and keeps the rows whose target is not `ignore_index`, then gathers the kept rows'
/// `upstream` gradients (may be null). Consumes the state's buffers. Collective.
template <class B, class Comm>
sharded_rows<B> finish_gather(const execution<B>& ex, const class_sharding<Comm>& sh, gathered_state<B, Comm>& st,
                              vector_view<const index_t> targets, index_t ignore_index,
                              non_deduced<scratch_vector<B, float>>* upstream) {
  st.complete();
  const int size = sh.size();
  const index_t d = st.dim;
  // Every row's target (in rank order, in the execution's memory), and the rows of each rank (one
  // segment when replicated).
  const std::vector<index_t> segments = st.replicated ? std::vector<index_t>{st.rows} : st.counts;
  const index_t total = total_of(segments);
  backend_vector<B, index_t> gathered;
  vector_view<const index_t> all_targets;  // empty for topk: every row is kept
  if (targets.size != 0 && st.replicated) {
    all_targets = targets;
  } else if (targets.size != 0) {
    gathered.resize(static_cast<std::size_t>(total));
    all_gather_into(ex, sh.communicator(), targets.data, st.rows, gathered, st.counts.data());
    all_targets = vector_view<const index_t>(raw(gathered), total);
  }
  // The kept rows, as the blocking verb's pack_rows packs them (then gathers them): when every row
  // is kept (no ignored target: the usual case), the gathered rows themselves, moved in; else the
  // kept rows copied out. (Packing them all again cost a fresh buffer of every rank's rows a step:
  // its page faults and a copy: prefetched steps took 1.27-1.30x the blocking ones at 16.8 MB a
  // rank, bench/RESULTS.md.)
  scratch_vector<B, float>& source = st.replicated ? st.own : st.all;
  const matrix_view<const float> source_rows(raw(source), total, d);
  sharded_rows<B> out;
  out.all = pack_rows(ex, source_rows, all_targets, ignore_index, /*with_hidden=*/false);
  const index_t rows = out.all.rows;
  if (rows == total) {
    out.all.hidden = std::move(source);
  } else {
    out.all.hidden.resize(static_cast<std::size_t>(rows * d));
    gather_rows_by(ex, source_rows, out.all.sample_data(), rows, raw(out.all.hidden));
  }
  std::vector<index_t> kept_counts(segments.size(), 0);
  if (rows == total) {
    kept_counts = segments;
  } else {  // each rank's kept rows: the packed rows' samples, bucketed by segment
    std::vector<index_t> kept(static_cast<std::size_t>(rows));
    thrust::copy(out.all.sample.begin(), out.all.sample.end(), kept.begin());
    std::size_t q = 0;
    index_t end = segments[0];
    for (index_t k : kept) {
      while (k >= end) end += segments[++q];
      ++kept_counts[q];
    }
  }
  out.all.sample = scratch_vector<B, index_t>();
  source = scratch_vector<B, float>();
  if (st.replicated) {
    out.counts.assign(static_cast<std::size_t>(size), rows);
    if (upstream) out.upstream = std::move(*upstream);
    return out;
  }
  out.counts = kept_counts;
  for (int q = 0; q < sh.rank(); ++q) out.own_offset += kept_counts[static_cast<std::size_t>(q)];
  if (upstream) {
    out.upstream.resize(static_cast<std::size_t>(rows), ex);
    all_gather_into(ex, sh.communicator(), raw(*upstream), static_cast<index_t>(upstream->size()), out.upstream,
                    out.counts.data());
  }
  return out;
}

}  // namespace xsoftmax::detail

// ---------------------------------------------------------------------------------------------
// The sharded hierarchical softmax's prefetch: the routing of a micro-batch's rows to the owners
// of their targets' subtrees, started ahead of the verb (see sharded_hierarchical_softmax.hpp).

namespace xsoftmax::detail {

/// Whether `Comm` offers `start_all_to_all(const T* send, const index_t* send_counts, T* recv,
/// const index_t* recv_counts)`: `all_to_all` started and returned as a request whose `wait()`
/// completes it, with `start_all_gather`'s contract (class_sharding.hpp). Optional: without it
/// the routing runs at once, blocking.
template <class Comm, class T, class = void>
inline constexpr bool has_start_all_to_all = false;
template <class Comm, class T>
inline constexpr bool has_start_all_to_all<
    Comm, T,
    std::void_t<decltype(std::declval<Comm&>().start_all_to_all(std::declval<const T*>(), std::declval<const index_t*>(),
                                                                std::declval<T*>(), std::declval<const index_t*>())
                             .wait())>> = true;

/// `start_all_to_all`'s request type of `Comm` for T buffers (a placeholder when it has none).
template <class Comm, class T, bool = has_start_all_to_all<Comm, T>>
struct exchange_request_of {
  struct type {
    void wait() {}
  };
};
template <class Comm, class T>
struct exchange_request_of<Comm, T, true> {
  using type = decltype(std::declval<Comm&>().start_all_to_all(std::declval<const T*>(), std::declval<const index_t*>(),
                                                               std::declval<T*>(), std::declval<const index_t*>()));
};

/// Buffers (`Vector`: a host or backend vector) kept from one step to the next: a fresh allocation
/// of megabytes per step costs its page faults again whenever the allocator has returned the memory
/// to the system (measured: bench/RESULTS.md, the sharded HS's prefetch); on a GPU, an allocation
/// and a free per step.
template <class Vector>
struct buffer_pool {
  std::vector<Vector> free;
  /// A buffer of `n` elements (their values unspecified): the smallest kept one that holds them
  /// without growing, else the largest kept one, else a new one.
  Vector take(std::size_t n) {
    std::size_t best = free.size();
    for (std::size_t i = 0; i < free.size(); ++i) {
      const std::size_t c = free[i].capacity();
      const bool fits = c >= n;
      if (best == free.size()) { best = i; continue; }
      const std::size_t b = free[best].capacity();
      if (fits ? (b < n || c < b) : (b < n && c > b)) best = i;
    }
    Vector v;
    if (best < free.size()) v = std::move(free[best]), free.erase(free.begin() + static_cast<std::ptrdiff_t>(best));
    v.resize(n);
    return v;
  }
  /// Keeps `v` for a later `take` (at most 8 buffers).
  void give(Vector&& v) {
    if (v.capacity() > 0 && free.size() < 8) free.push_back(std::move(v));
  }
};

/// One micro-batch routed by the sharded hierarchical softmax: this rank's rows and targets, the
/// rows sent to each rank (`order`, grouped by destination; host bookkeeping) and the rows
/// received (the execution's memory).
template <class B, class Comm>
struct hs_routed_state {
  const void* owner = nullptr;  ///< the head that routed the rows
  index_t rows = 0, dim = 0;    ///< this rank's batch
  bool used = false;
  backend_vector<B, float> own;        ///< this rank's rows (rows x dim), prefetch only
  backend_vector<B, index_t> targets;  ///< this rank's targets, prefetch only
  std::vector<index_t> order;          ///< this rank's routed rows, by destination rank then row
  std::vector<index_t> send_rows, recv_rows;          ///< routed rows to / from each rank
  backend_vector<B, float> send_hidden, recv_hidden;  ///< their hidden rows, out and in
  std::vector<float> host_send, host_recv;  ///< staging (device backend, host-memory communicator)
  /// The running exchange of the hidden rows. Declared last: destroyed (which waits for it) before
  /// the buffers it uses.
  std::optional<typename exchange_request_of<Comm, float>::type> pending;
  /// Waits for the exchange (if still running): `recv_hidden` then holds the received rows.
  void complete() {
    if (!pending) return;
    pending->wait();
    pending.reset();
    if (!host_recv.empty()) thrust::copy(host_recv.begin(), host_recv.end(), recv_hidden.begin());
  }
};
}  // namespace xsoftmax::detail

namespace xsoftmax {

namespace detail {
struct routed_access;
}

/// One micro-batch's hidden rows, routed to the owners of their targets' subtrees ahead of the verb
/// that scores them: returned by `sharded_hierarchical_softmax::route_rows_async(hidden, targets)`
/// and passed, once, to that head's `forward`, `forward_backward` or `log_prob` in place of
/// `hidden` and `targets`. Owns copies of this rank's rows and targets, the routed rows, and the
/// exchange while it runs: destroying it unused waits for the exchange. Move-only.
template <class Backend, class Communicator>
class routed_batch {
 public:
  routed_batch() = default;
  /// This rank's batch rows: the verb's outputs have this many rows.
  [[nodiscard]] index_t rows() const { return state_ ? state_->rows : 0; }
  [[nodiscard]] index_t dim() const { return state_ ? state_->dim : 0; }
  /// False when default-constructed or moved from, or once a verb has used it.
  [[nodiscard]] bool usable() const { return state_ && !state_->used; }

 private:
  friend struct detail::routed_access;
  std::unique_ptr<detail::hs_routed_state<Backend, Communicator>> state_;
};

namespace detail {
/// The head's access to a `routed_batch`'s state.
struct routed_access {
  template <class B, class C>
  static routed_batch<B, C> make(std::unique_ptr<hs_routed_state<B, C>> s) {
    routed_batch<B, C> g;
    g.state_ = std::move(s);
    return g;
  }
  template <class B, class C>
  static hs_routed_state<B, C>* state(const routed_batch<B, C>& g) { return g.state_.get(); }
};
}  // namespace detail

}  // namespace xsoftmax
