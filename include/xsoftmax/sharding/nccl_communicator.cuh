// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `nccl_communicator`: the communicator of `class_sharding` over an NCCL communicator (GPUs), for
/// heads on the `cuda` backend. Include it only in programs compiled by nvcc and linked with NCCL
/// (`nccl.h`, `libnccl.so`); host builds never include it.
///
/// As `raft::comms` does, the caller owns the transport: it creates the `ncclComm_t` (with
/// `ncclCommInitRank` / `ncclCommInitAll`) and a `cudaStream_t`, keeps both alive while any head
/// uses them, and destroys them afterwards. The communicator only issues collectives on them.
///
/// Memory: `device_memory` is true, so a sharded head hands it **device** pointers (the gathered
/// hidden rows, the row statistics, the hidden gradients go from GPU to GPU with no host staging);
/// host buffers of the sharded algorithm (a rank's row count, the top-k candidates) are staged
/// through device copies by the head.
///
/// Ordering: every verb is blocking, as `mpi_communicator`'s: the head synchronises its own stream
/// before the call (so the inputs are ready whatever stream the communicator uses), and the verb
/// synchronises the communicator's stream before returning (so the outputs are ready for any
/// stream). Passing the head's own stream costs nothing extra; overlapping a collective with the
/// next chunk's GEMM is not done here.
///
/// One verb is not blocking: `start_all_gather` (the prefetch of the next micro-batch's rows,
/// `full_softmax::gather_rows_async`) issues its `ncclAllGather` on a second stream (the caller's
/// `gather_stream`, or one the communicator creates on first use and destroys with its last copy),
/// after an event recorded on the communicator's stream (so it follows the work queued there), and
/// records an event there that the request's `wait()` makes the communicator's stream wait for and
/// then synchronises. NCCL does not promise that two operations of one communicator progress
/// concurrently (a program must work when one blocks the other); every rank issues the gather
/// before the next collective on the main stream (the current batch's row-statistics all-reduce),
/// so that one may wait for the gather: the gather overlaps at least the compute up to that
/// collective (the first pass's score GEMMs). A gather on a second NCCL
/// communicator (`ncclCommSplit`) could overlap further; not done. Not measured on a GPU yet.
///
/// Determinism: NCCL sums in an order fixed by the communicator's algorithm (ring or tree),
/// protocol and topology. For a given communicator (same ranks, same GPUs and links, same
/// NCCL_ALGO / NCCL_PROTO) repeated runs are bitwise equal, and every rank receives the same bits
/// of an all-reduce; the order is *not* the rank order of `mpi_communicator`, so an NCCL run and an
/// MPI run of the same step agree to rounding only, and changing the rank count or the topology
/// changes the rounding. With one rank every collective is a copy (bitwise the unsharded head's).
///
/// Unequal per-rank counts (`all_gather`, `reduce_scatter` with `counts` that differ, as when
/// ranks pack different numbers of rows) are padded to the largest count in a scratch buffer owned
/// by the communicator, so that NCCL's bandwidth-optimal ring `ncclAllGather` / `ncclReduceScatter`
/// still applies; equal counts go straight through.

#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax {

/// An NCCL call failed: the message names the call and `ncclGetErrorString` (and NCCL's last error
/// text when it has one). A `cuda_error`, so code that catches the backend's errors catches it.
struct nccl_error : cuda_error {
  using cuda_error::cuda_error;
};

namespace detail::gpu {
[[noreturn]] inline void throw_nccl_error(ncclResult_t r, const char* call, ncclComm_t comm) {
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw nccl_error(message("nccl_communicator: ", call, " failed: ", ncclGetErrorString(r), " (ncclResult_t ",
                           static_cast<int>(r), ")", last && *last ? ": " : "", last ? last : ""));
}
}  // namespace detail::gpu

/// Collectives of `class_sharding` over `comm` on `stream` (neither owned), on device memory. See
/// class_sharding.hpp for each verb's contract and the file comment for ordering and determinism.
/// Copies share the scratch buffer (one communicator per rank, used from one thread at a time).
class nccl_communicator {
 public:
  /// The sharded head passes device pointers to every collective (see the file comment).
  static constexpr bool device_memory = true;

  /// Wraps `comm` and `stream`, and `gather_stream` for `start_all_gather` (null: the communicator
  /// creates a non-blocking stream when first needed). Throws `invalid_argument` when `comm` is
  /// null, `nccl_error` when NCCL cannot report the communicator's rank or size.
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, cudaStream_t gather_stream = nullptr)
      : comm_(comm), stream_(stream) {
    detail::expects(comm_ != nullptr, "nccl_communicator: comm is null (create it with ncclCommInitRank)");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    gather_->stream = gather_stream;
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] ncclComm_t native() const { return comm_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }

  /// In place over `n` device elements (`float`, `double` or `index_t`); every rank gets the same bits.
  template <class T>
  void all_reduce(T* data, index_t n, reduce_op op) {
    if (n == 0) return;
    check(ncclAllReduce(data, data, count(n), type<T>(), op == reduce_op::max ? ncclMax : ncclSum, comm_, stream_),
          "ncclAllReduce");
    finish();
  }

  /// Rank q's `counts[q]` device elements (counts on the host), concatenated in rank order into `recv`.
  template <class T>
  void all_gather(const T* send, index_t n, T* recv, const index_t* counts) {
    detail::expects(n == counts[rank_], "nccl_communicator::all_gather: count = ", n, " but counts[", rank_,
                    "] = ", counts[rank_]);
    gather_on(stream_, *scratch_, send, n, recv, counts);
    finish();
  }

  /// A started `start_all_gather`: move-only; `wait()` makes the communicator's stream wait for
  /// the gather and blocks until it is complete. Destroying a pending request waits for it.
  class gather_request {
   public:
    gather_request() = default;
    gather_request(gather_request&& o) noexcept
        : done_(std::exchange(o.done_, nullptr)), stream_(o.stream_) {}
    gather_request& operator=(gather_request&& o) noexcept {
      if (this != &o) release(), done_ = std::exchange(o.done_, nullptr), stream_ = o.stream_;
      return *this;
    }
    gather_request(const gather_request&) = delete;
    gather_request& operator=(const gather_request&) = delete;
    ~gather_request() { release(); }
    /// Blocks until `recv` holds every rank's elements; later work on the communicator's stream
    /// is ordered after the gather.
    void wait() {
      if (!done_) return;
      XSOFTMAX_CUDA_TRY(cudaStreamWaitEvent(stream_, done_, 0));
      XSOFTMAX_CUDA_TRY(cudaEventSynchronize(done_));
      XSOFTMAX_CUDA_TRY(cudaEventDestroy(std::exchange(done_, nullptr)));
    }
    /// True once complete (`cudaEventQuery`); a device runs NCCL without the host's help.
    bool test() {
      if (!done_) return true;
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaErrorNotReady) return false;
      XSOFTMAX_CUDA_TRY(e);
      return true;
    }

   private:
    friend class nccl_communicator;
    void release() noexcept {
      if (!done_) return;
      XSOFTMAX_CUDA_TRY_NOTHROW(cudaEventSynchronize(done_));
      XSOFTMAX_CUDA_TRY_NOTHROW(cudaEventDestroy(std::exchange(done_, nullptr)));
    }
    cudaEvent_t done_ = nullptr;
    cudaStream_t stream_ = nullptr;
  };

  /// `all_gather` issued on the gather stream (see the file comment) and returned pending: `send`
  /// and `recv` must stay alive and `recv` unread until the request's `wait()` returns; `counts`
  /// (host) may go at once. Unequal counts are padded in a scratch buffer of the gather stream.
  template <class T>
  [[nodiscard]] gather_request start_all_gather(const T* send, index_t n, T* recv, const index_t* counts) {
    detail::expects(n == counts[rank_], "nccl_communicator::start_all_gather: count = ", n, " but counts[", rank_,
                    "] = ", counts[rank_]);
    cudaStream_t gs = gather_stream();
    gather_request r;
    r.stream_ = stream_;
    cudaEvent_t ready = nullptr;
    XSOFTMAX_CUDA_TRY(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    XSOFTMAX_CUDA_TRY(cudaEventRecord(ready, stream_));
    const cudaError_t waited = cudaStreamWaitEvent(gs, ready, 0);
    XSOFTMAX_CUDA_TRY(cudaEventDestroy(ready));  // released once the recorded work completes
    XSOFTMAX_CUDA_TRY(waited);
    gather_on(gs, gather_->scratch, send, n, recv, counts);
    XSOFTMAX_CUDA_TRY(cudaEventCreateWithFlags(&r.done_, cudaEventDisableTiming));
    XSOFTMAX_CUDA_TRY(cudaEventRecord(r.done_, gs));
    return r;
  }

  /// Rank q gets `send_counts[q]` device elements of `send` (blocks in rank order); `recv` gets
  /// `recv_counts[q]` device elements from each rank q, in rank order (counts on the host). One
  /// NCCL group of point-to-point `ncclSend` / `ncclRecv` (NCCL has no all-to-all-v collective);
  /// the block a rank sends itself is a device copy.
  template <class T>
  void all_to_all(const T* send, const index_t* send_counts, T* recv, const index_t* recv_counts) {
    std::vector<std::size_t> send_at(static_cast<std::size_t>(size_) + 1, 0), recv_at(send_at);
    for (int q = 0; q < size_; ++q) {
      send_at[static_cast<std::size_t>(q) + 1] = send_at[static_cast<std::size_t>(q)] + count(send_counts[q]);
      recv_at[static_cast<std::size_t>(q) + 1] = recv_at[static_cast<std::size_t>(q)] + count(recv_counts[q]);
    }
    detail::expects(send_counts[rank_] == recv_counts[rank_], "nccl_communicator::all_to_all: send_counts[", rank_,
                    "] = ", send_counts[rank_], " but recv_counts[", rank_, "] = ", recv_counts[rank_]);
    if (send_counts[rank_] > 0)
      XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(recv + recv_at[static_cast<std::size_t>(rank_)],
                                        send + send_at[static_cast<std::size_t>(rank_)], bytes<T>(send_counts[rank_]),
                                        cudaMemcpyDeviceToDevice, stream_));
    check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const auto qs = static_cast<std::size_t>(q);
      if (send_counts[q] > 0)
        check(ncclSend(send + send_at[qs], count(send_counts[q]), type<T>(), q, comm_, stream_), "ncclSend");
      if (recv_counts[q] > 0)
        check(ncclRecv(recv + recv_at[qs], count(recv_counts[q]), type<T>(), q, comm_, stream_), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    finish();
  }

  /// Sends `send_count` device elements to rank + 1 and receives `recv_count` from rank - 1 (both
  /// mod size) into `recv`: one ncclSend and one ncclRecv in a group (one rank: a device copy).
  template <class T>
  void shift(const T* send, index_t send_count, T* recv, index_t recv_count) {
    if (size_ == 1) {
      detail::expects(send_count == recv_count, "nccl_communicator::shift: send_count = ", send_count,
                      " but recv_count = ", recv_count, " on one rank");
      if (send_count > 0)
        XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(recv, send, bytes<T>(send_count), cudaMemcpyDeviceToDevice, stream_));
      finish();
      return;
    }
    check(ncclGroupStart(), "ncclGroupStart");
    if (send_count > 0)
      check(ncclSend(send, count(send_count), type<T>(), (rank_ + 1) % size_, comm_, stream_), "ncclSend");
    if (recv_count > 0)
      check(ncclRecv(recv, count(recv_count), type<T>(), (rank_ + size_ - 1) % size_, comm_, stream_), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    finish();
  }

  /// `recv` (counts[rank] device elements) = sum over ranks of their block `rank` of `send`
  /// (sum(counts) device elements on every rank).
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) {
    const index_t largest = *std::max_element(counts, counts + size_);
    if (largest == 0) return;
    if (std::all_of(counts, counts + size_, [&](index_t c) { return c == largest; })) {
      check(ncclReduceScatter(send, recv, count(largest), type<T>(), ncclSum, comm_, stream_), "ncclReduceScatter");
      finish();
      return;
    }
    // Spread the blocks to a stride of `largest` (zero padding), reduce-scatter, keep the prefix.
    const std::size_t padded_n = static_cast<std::size_t>(largest) * static_cast<std::size_t>(size_);
    T* padded = scratch<T>(padded_n + static_cast<std::size_t>(largest));
    T* mine = padded + padded_n;
    XSOFTMAX_CUDA_TRY(cudaMemsetAsync(padded, 0, padded_n * sizeof(T), stream_));
    index_t at = 0;
    for (int q = 0; q < size_; ++q) {
      if (counts[q] > 0)
        XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(padded + static_cast<std::size_t>(q) * largest, send + at,
                                          bytes<T>(counts[q]), cudaMemcpyDeviceToDevice, stream_));
      at += counts[q];
    }
    check(ncclReduceScatter(padded, mine, count(largest), type<T>(), ncclSum, comm_, stream_), "ncclReduceScatter");
    if (counts[rank_] > 0)
      XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(recv, mine, bytes<T>(counts[rank_]), cudaMemcpyDeviceToDevice, stream_));
    finish();
  }

 private:
  /// A device buffer grown on demand, shared by copies of the communicator; freed with the last.
  struct scratch_buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    scratch_buffer() = default;
    scratch_buffer(const scratch_buffer&) = delete;
    scratch_buffer& operator=(const scratch_buffer&) = delete;
    ~scratch_buffer() {
      if (data) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(data));
    }
  };

  /// The gather stream and its scratch buffer, shared by copies of the communicator.
  struct gather_state {
    cudaStream_t stream = nullptr;
    bool owned = false;
    scratch_buffer scratch;
    gather_state() = default;
    gather_state(const gather_state&) = delete;
    gather_state& operator=(const gather_state&) = delete;
    ~gather_state() {
      if (owned) XSOFTMAX_CUDA_TRY_NOTHROW(cudaStreamDestroy(stream));
    }
  };
  cudaStream_t gather_stream() {
    if (!gather_->stream) {
      XSOFTMAX_CUDA_TRY(cudaStreamCreateWithFlags(&gather_->stream, cudaStreamNonBlocking));
      gather_->owned = true;
    }
    return gather_->stream;
  }

  /// Queues the gather on `stream` (equal counts: one ncclAllGather; unequal: padded to the
  /// largest count in `buffer`, gathered, compacted into `recv`).
  template <class T>
  void gather_on(cudaStream_t stream, scratch_buffer& buffer, const T* send, index_t n, T* recv,
                 const index_t* counts) {
    const index_t largest = *std::max_element(counts, counts + size_);
    if (largest == 0) return;
    if (std::all_of(counts, counts + size_, [&](index_t c) { return c == largest; })) {
      check(ncclAllGather(send, recv, count(n), type<T>(), comm_, stream), "ncclAllGather");
      return;
    }
    T* padded = scratch<T>(buffer, stream, static_cast<std::size_t>(largest) * static_cast<std::size_t>(size_ + 1));
    T* own = padded + static_cast<std::size_t>(largest) * static_cast<std::size_t>(size_);
    if (n > 0) XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(own, send, bytes<T>(n), cudaMemcpyDeviceToDevice, stream));
    check(ncclAllGather(own, padded, count(largest), type<T>(), comm_, stream), "ncclAllGather");
    index_t at = 0;
    for (int q = 0; q < size_; ++q) {
      if (counts[q] > 0)
        XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(recv + at, padded + static_cast<std::size_t>(q) * largest,
                                          bytes<T>(counts[q]), cudaMemcpyDeviceToDevice, stream));
      at += counts[q];
    }
  }

  template <class T>
  static ncclDataType_t type() {
    if constexpr (std::is_same_v<T, float>) return ncclFloat32;
    else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
    else {
      static_assert(std::is_same_v<T, index_t> && sizeof(index_t) == 8,
                    "nccl_communicator: float, double or index_t (int64) buffers");
      return ncclInt64;
    }
  }
  static std::size_t count(index_t n) {
    detail::expects(n >= 0, "nccl_communicator: a negative element count ", n);
    return static_cast<std::size_t>(n);
  }
  template <class T>
  static std::size_t bytes(index_t n) { return count(n) * sizeof(T); }
  /// `buffer` grown to `elements` T, after `stream` (whose queued work may still read it) is idle.
  template <class T>
  static T* scratch(scratch_buffer& buffer, cudaStream_t stream, std::size_t elements) {
    const std::size_t need = elements * sizeof(T);
    if (need > buffer.bytes) {
      XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
      if (buffer.data) XSOFTMAX_CUDA_TRY(cudaFree(buffer.data));
      buffer.data = nullptr, buffer.bytes = 0;
      XSOFTMAX_CUDA_TRY(cudaMalloc(&buffer.data, need));
      buffer.bytes = need;
    }
    return static_cast<T*>(buffer.data);
  }
  template <class T>
  T* scratch(std::size_t elements) { return scratch<T>(*scratch_, stream_, elements); }
  void finish() { XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream_)); }
  void check(ncclResult_t r, const char* call) const {
    if (r != ncclSuccess) detail::gpu::throw_nccl_error(r, call, comm_);
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<scratch_buffer> scratch_ = std::make_shared<scratch_buffer>();
  std::shared_ptr<gather_state> gather_ = std::make_shared<gather_state>();
};

}  // namespace xsoftmax
