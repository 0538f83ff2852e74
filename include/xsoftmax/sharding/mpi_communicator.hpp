// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mpi_communicator`: the communicator of `class_sharding` over an MPI communicator (hosts; Debian's
/// OpenMPI). Include it only in programs linked with MPI (`find_package(MPI)`, `MPI::MPI_CXX`).
///
/// Sums are made deterministic and identical on every rank whatever MPI's reduction algorithm:
/// `all_reduce(sum)` gathers every rank's values and adds them in rank order (S x n elements move
/// instead of about 2n: the reductions of a softmax head are per batch row, a few KiB);
/// `reduce_scatter` sends each block to its owner, which adds the contributions in rank order.

#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

// The C API only: OpenMPI's deprecated C++ bindings warn under -Wextra.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

/// Collectives of `class_sharding` over `comm` (not owned: the caller initialises MPI and keeps the
/// communicator alive). Every MPI error is thrown as `invalid_argument` naming the call.
class mpi_communicator {
 public:
  /// Wraps `comm` (MPI_COMM_WORLD by default). MPI must be initialised.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    detail::expects(initialised != 0, "mpi_communicator: MPI is not initialised (call MPI_Init first)");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] MPI_Comm native() const { return comm_; }

  /// In place over `n` elements; sums in rank order (bitwise the same on every rank and every run).
  template <class T>
  void all_reduce(T* data, index_t n, reduce_op op) {
    if (n == 0) return;
    if (op == reduce_op::max) {
      check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n), type<T>(), MPI_MAX, comm_), "MPI_Allreduce");
      return;
    }
    std::vector<T> all(static_cast<std::size_t>(n) * static_cast<std::size_t>(size_));
    check(MPI_Allgather(data, count_of(n), type<T>(), all.data(), count_of(n), type<T>(), comm_), "MPI_Allgather");
    for (index_t i = 0; i < n; ++i) {
      T acc = all[static_cast<std::size_t>(i)];
      for (int q = 1; q < size_; ++q) acc += all[static_cast<std::size_t>(q) * static_cast<std::size_t>(n) + i];
      data[i] = acc;
    }
  }

  /// Rank q's `counts[q]` elements, concatenated in rank order into `recv` (sum(counts) elements).
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    std::vector<int> c(static_cast<std::size_t>(size_)), off(c.size());
    layout(counts, c, off);
    detail::expects(count == counts[rank_], "mpi_communicator::all_gather: count = ", count, " but counts[",
                    rank_, "] = ", counts[rank_]);
    check(MPI_Allgatherv(send, count_of(count), type<T>(), recv, c.data(), off.data(), type<T>(), comm_),
          "MPI_Allgatherv");
  }

  /// A started `start_all_gather`: move-only; `wait()` completes it (`MPI_Wait`), `test()` asks
  /// whether it has completed and lets MPI progress it (`MPI_Test`). Destroying a pending request
  /// waits for it (errors are then not reported).
  class gather_request {
   public:
    gather_request() = default;
    gather_request(gather_request&& o) noexcept
        : request_(std::exchange(o.request_, MPI_REQUEST_NULL)), c_(std::move(o.c_)), off_(std::move(o.off_)) {}
    gather_request& operator=(gather_request&& o) noexcept {
      if (this != &o) {
        finish_nothrow();
        request_ = std::exchange(o.request_, MPI_REQUEST_NULL), c_ = std::move(o.c_), off_ = std::move(o.off_);
      }
      return *this;
    }
    gather_request(const gather_request&) = delete;
    gather_request& operator=(const gather_request&) = delete;
    ~gather_request() { finish_nothrow(); }
    /// Blocks until `recv` holds every rank's elements (at once when already complete).
    void wait() {
      if (request_ != MPI_REQUEST_NULL) check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    }
    /// True once complete (then `wait()` returns at once). A call into MPI: it also progresses the
    /// transfer, which OpenMPI's non-blocking collectives over shared memory need (they move only
    /// inside MPI calls). Over TCP with `--mca btl_tcp_progress_thread 1` they move by themselves:
    /// a 16.8 MB gather completed during 200 ms of computation (bench/RESULTS.md, "Overlap with a
    /// transport that progresses by itself").
    bool test() {
      if (request_ == MPI_REQUEST_NULL) return true;
      int done = 0;
      check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
      return done != 0;
    }

   private:
    friend class mpi_communicator;
    void finish_nothrow() noexcept {
      if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    }
    MPI_Request request_ = MPI_REQUEST_NULL;
    std::vector<int> c_, off_;  // MPI reads the count arrays until completion
  };

  /// `all_gather`, started (`MPI_Iallgatherv`) and returned pending: `send` and `recv` must stay
  /// alive, and `recv` unread, until the request's `wait()` returns; `counts` may go at once.
  /// Other collectives may be issued meanwhile (in the same order on every rank).
  template <class T>
  [[nodiscard]] gather_request start_all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    gather_request r;
    r.c_.resize(static_cast<std::size_t>(size_)), r.off_.resize(r.c_.size());
    layout(counts, r.c_, r.off_);
    detail::expects(count == counts[rank_], "mpi_communicator::start_all_gather: count = ", count, " but counts[",
                    rank_, "] = ", counts[rank_]);
    check(MPI_Iallgatherv(send, count_of(count), type<T>(), recv, r.c_.data(), r.off_.data(), type<T>(), comm_,
                          &r.request_),
          "MPI_Iallgatherv");
    return r;
  }

  /// `all_to_all`, started (`MPI_Ialltoallv`) and returned pending, as `start_all_gather` (the
  /// same request type; it keeps the four count arrays MPI reads until completion).
  template <class T>
  [[nodiscard]] gather_request start_all_to_all(const T* send, const index_t* send_counts, T* recv,
                                                const index_t* recv_counts) {
    gather_request r;
    const std::size_t n = static_cast<std::size_t>(size_);
    std::vector<int> sc(n), so(n), rc(n), ro(n);
    layout(send_counts, sc, so);
    layout(recv_counts, rc, ro);
    r.c_ = sc, r.c_.insert(r.c_.end(), rc.begin(), rc.end());
    r.off_ = so, r.off_.insert(r.off_.end(), ro.begin(), ro.end());
    check(MPI_Ialltoallv(send, r.c_.data(), r.off_.data(), type<T>(), recv, r.c_.data() + n, r.off_.data() + n,
                         type<T>(), comm_, &r.request_),
          "MPI_Ialltoallv");
    return r;
  }

  /// Rank q gets `send_counts[q]` elements of `send` (blocks in rank order); `recv` gets
  /// `recv_counts[q]` elements from each rank q, in rank order (`MPI_Alltoallv`).
  template <class T>
  void all_to_all(const T* send, const index_t* send_counts, T* recv, const index_t* recv_counts) {
    std::vector<int> sc(static_cast<std::size_t>(size_)), so(sc.size()), rc(sc.size()), ro(sc.size());
    layout(send_counts, sc, so);
    layout(recv_counts, rc, ro);
    check(MPI_Alltoallv(send, sc.data(), so.data(), type<T>(), recv, rc.data(), ro.data(), type<T>(), comm_),
          "MPI_Alltoallv");
  }

  /// Sends `send_count` elements to rank + 1 and receives `recv_count` from rank - 1 (both mod size)
  /// into `recv` (`MPI_Sendrecv`: a ring step; one rank sends to itself).
  template <class T>
  void shift(const T* send, index_t send_count, T* recv, index_t recv_count) {
    check(MPI_Sendrecv(send, count_of(send_count), type<T>(), (rank_ + 1) % size_, shift_tag, recv,
                       count_of(recv_count), type<T>(), (rank_ + size_ - 1) % size_, shift_tag, comm_,
                       MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }

  /// `recv` (counts[rank] elements) = sum over ranks, in rank order, of their block `rank` of `send`.
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) {
    std::vector<int> c(static_cast<std::size_t>(size_)), off(c.size());
    layout(counts, c, off);
    const int mine = c[static_cast<std::size_t>(rank_)];
    std::vector<T> blocks(static_cast<std::size_t>(mine) * static_cast<std::size_t>(size_));
    std::vector<int> recv_counts(c.size(), mine), recv_off(c.size());
    for (int q = 0; q < size_; ++q) recv_off[static_cast<std::size_t>(q)] = q * mine;
    // Rank q receives block q of everyone: an all-to-all with per-destination blocks.
    check(MPI_Alltoallv(send, c.data(), off.data(), type<T>(), blocks.data(), recv_counts.data(), recv_off.data(),
                        type<T>(), comm_),
          "MPI_Alltoallv");
    for (int i = 0; i < mine; ++i) {
      T acc = blocks[static_cast<std::size_t>(i)];
      for (int q = 1; q < size_; ++q) acc += blocks[static_cast<std::size_t>(q) * static_cast<std::size_t>(mine) + i];
      recv[i] = acc;
    }
  }

 private:
  template <class T>
  static MPI_Datatype type() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else {
      static_assert(std::is_same_v<T, index_t>, "mpi_communicator: float, double or index_t buffers");
      return MPI_INT64_T;
    }
  }
  static int count_of(index_t n) {
    detail::expects(n >= 0 && n <= index_t(INT32_MAX), "mpi_communicator: a message of ", n,
                    " elements does not fit MPI's int count");
    return static_cast<int>(n);
  }
  void layout(const index_t* counts, std::vector<int>& c, std::vector<int>& off) const {
    index_t at = 0;
    for (int q = 0; q < size_; ++q) {
      c[static_cast<std::size_t>(q)] = count_of(counts[q]);
      off[static_cast<std::size_t>(q)] = count_of(at);
      at += counts[q];
    }
    count_of(at);
  }
  static void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    detail::expects(false, "mpi_communicator: ", call, " failed: ", std::string(text, static_cast<std::size_t>(length)));
  }

  static constexpr int shift_tag = 7177;  // the ring's point-to-point messages
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace xsoftmax
