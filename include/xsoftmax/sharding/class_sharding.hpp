// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The sharding policy of a head: `no_sharding` (the default: one process holds every class) or
/// `class_sharding<Communicator>` (each rank of a communicator holds a contiguous range of classes,
/// as Megatron's vocab-parallel cross-entropy and InsightFace's Partial FC do).
///
/// A *communicator* is a thin adapter over an existing transport (MPI on hosts: `mpi_communicator`;
/// NCCL on GPUs: `nccl_communicator`). It offers, on buffers of `index_t` or `float` in host memory
/// — or in device memory when it declares `static constexpr bool device_memory = true` (then the
/// sharded head of a device backend passes its device buffers as they are; `counts` stay on the
/// host) — with every verb complete on return:
///  * `int rank() const`, `int size() const`;
///  * `all_reduce(T* data, index_t n, reduce_op op)` (in place, every rank gets the result);
///  * `all_gather(const T* send, index_t count, T* recv, const index_t* counts)`: rank q sends
///    `counts[q]` elements (its own `count == counts[rank]`); `recv` receives them in rank order;
///  * `reduce_scatter(const float* send, float* recv, const index_t* counts)`: `send` holds
///    sum(counts) elements on every rank; rank q receives in `recv` the element-wise sum over ranks
///    of the q-th block (`counts[q]` elements);
///  * `all_to_all(const T* send, const index_t* send_counts, T* recv, const index_t* recv_counts)`:
///    rank p sends `send_counts[q]` elements to rank q (the blocks of `send`, in rank order) and
///    receives `recv_counts[q]` elements from rank q into `recv` (in rank order); `recv_counts[q]`
///    on rank p must equal `send_counts[p]` on rank q (exchange the counts first, with an
///    `all_to_all` of one count per rank). Only data moves: no sum, so any transport is bitwise
///    exact. Used by `sharded_hierarchical_softmax` to route rows to their subtree's owner and back.
/// Optionally (detected by `detail::has_start_all_gather`; a communicator without it, such as the
/// PyTorch package's, makes `gather_rows_async` gather at once, blocking):
///  * `start_all_gather(const T* send, index_t count, T* recv, const index_t* counts)`: the same
///    gather, started and returned as a move-only request `r` whose `r.wait()` completes it (then
///    `recv` holds the result, readable from any stream); `send` and `recv` must stay alive and
///    `recv` unread until then, `counts` may go at once; other collectives may be issued between
///    start and wait, in the same order on every rank; destroying a pending request waits for it.
///    MPI: `MPI_Iallgatherv` (OpenMPI over shared memory moves it only inside MPI calls, see
///    `gather_request::test`; over TCP with `btl_tcp_progress_thread 1` it moves by itself);
///    NCCL: `ncclAllGather` on a second stream, ordered after the communicator's stream by events;
///    solo: a copy, complete on return. Used by the sharded heads to prefetch the next
///    micro-batch's rows while the current one computes (`full_softmax::gather_rows_async`).
/// Optionally (detected by `detail::has_shift`; without it, such as the PyTorch package's
/// communicator, a sharded KNN head gathers the whole weight matrix and graph as before):
///  * `shift(const T* send, index_t send_count, T* recv, index_t recv_count)`: one ring step: every
///    rank sends `send_count` elements to rank (rank + 1) % size and receives `recv_count` elements
///    from rank (rank - 1 + size) % size (whose `send_count` it must equal); complete on return.
///    MPI: `MPI_Sendrecv`; NCCL: `ncclSend` + `ncclRecv` in a group; solo: a copy. Used by the
///    exact KNN graph build of a sharded head (`knn_softmax`): each rank's weight block visits every
///    rank, so no rank holds more than its own rows and two visiting blocks.
/// Collectives are issued in the same order on every rank (every rank calls the same verb with the
/// same options); a rank that throws before a collective leaves the others waiting in it, so every
/// input check that can differ between ranks runs before the first collective of a verb.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <type_traits>
#include <utility>

namespace xsoftmax {

/// The default sharding policy: the head holds all classes.
struct no_sharding {};

/// The reduction of `all_reduce`.
enum class reduce_op { sum, max };

/// How the hidden rows of a sharded head's verbs are laid out across ranks.
enum class hidden_layout {
  /// Each rank passes its own batch (data-parallel feature extractor): the rows are all-gathered,
  /// every rank scores every row against its classes, and each rank receives the loss,
  /// `grad_hidden`, log-probabilities and top-k of its own rows (reduce-scatter).
  data_parallel,
  /// Every rank passes the same batch (tensor-parallel: the rows are already replicated): no
  /// gather; every rank receives the same loss and the full `grad_hidden` (all-reduce).
  replicated,
};

/// Each of the communicator's `size()` ranks holds the classes [class_begin, class_end) of
/// `num_classes`: the first `num_classes % size` ranks one more than the others (rank r starts at
/// r * (N / S) + min(r, N % S)).
///
/// The head's weights (and `grad_weights.rows`, and `apply_sgd`) are those of the local range, row 0
/// being class `class_begin()`; targets, `topk` classes and `log_prob` targets are global class ids.
///
/// \tparam Communicator see the file comment (`mpi_communicator`).
template <class Communicator>
class class_sharding {
 public:
  using communicator_type = Communicator;

  /// Throws `invalid_argument` when `num_classes < communicator.size()` (a rank would hold no class)
  /// or when `layout` is not one of `hidden_layout`'s values.
  class_sharding(Communicator communicator, index_t num_classes, hidden_layout layout = hidden_layout::data_parallel)
      : comm_(std::move(communicator)), num_classes_(num_classes), layout_(layout) {
    const int s = comm_.size();
    detail::expects(num_classes_ >= s, "class_sharding: num_classes = ", num_classes_, " is less than the ", s,
                    " ranks of the communicator: a rank would hold no class");
    detail::expects(layout_ == hidden_layout::data_parallel || layout_ == hidden_layout::replicated,
                    "class_sharding: layout = ", static_cast<int>(layout_), " is not a hidden_layout value");
  }

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  [[nodiscard]] index_t num_classes() const { return num_classes_; }
  [[nodiscard]] hidden_layout layout() const { return layout_; }
  /// First class of rank `r` (r in [0, size]; `shard_begin(size)` is num_classes).
  [[nodiscard]] index_t shard_begin(int r) const {
    const index_t s = size(), base = num_classes_ / s, extra = num_classes_ % s;
    return r * base + (r < extra ? r : extra);
  }
  [[nodiscard]] index_t class_begin() const { return shard_begin(rank()); }
  [[nodiscard]] index_t class_end() const { return shard_begin(rank() + 1); }
  [[nodiscard]] index_t local_classes() const { return class_end() - class_begin(); }
  /// The communicator (collectives are not const: they change the transport's state).
  [[nodiscard]] Communicator& communicator() const { return comm_; }

 private:
  mutable Communicator comm_;
  index_t num_classes_;
  hidden_layout layout_;
};

namespace detail {
/// Whether `Comm` offers `start_all_gather` on `T` buffers (see the file comment).
template <class Comm, class T, class = void>
inline constexpr bool has_start_all_gather = false;
template <class Comm, class T>
inline constexpr bool has_start_all_gather<
    Comm, T,
    std::void_t<decltype(std::declval<Comm&>().start_all_gather(std::declval<const T*>(), index_t{}, std::declval<T*>(),
                                                                std::declval<const index_t*>())
                             .wait())>> = true;
/// Whether `Comm` offers the ring step `shift` on `T` buffers (see the file comment).
template <class Comm, class T, class = void>
inline constexpr bool has_shift = false;
template <class Comm, class T>
inline constexpr bool has_shift<Comm, T,
                                std::void_t<decltype(std::declval<Comm&>().shift(std::declval<const T*>(), index_t{},
                                                                                 std::declval<T*>(), index_t{}))>> =
    true;
}  // namespace detail

/// Whether `Sharding` is a `class_sharding<...>`.
template <class Sharding>
inline constexpr bool is_class_sharding = false;
template <class Communicator>
inline constexpr bool is_class_sharding<class_sharding<Communicator>> = true;

}  // namespace xsoftmax
