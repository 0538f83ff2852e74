// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `gpu::pinned_staging`: host-to-device uploads of a call's small host lists (a level's runs, a
/// grouped GEMM's pointers, the gradient's row ids) that do not wait for the stream.
///
/// Why: `cudaMemcpyAsync` from pageable host memory may synchronise with the stream before it stages
/// the data ("API synchronization behavior" in the CUDA runtime's manual), and the generic `copy`
/// waits for the stream besides (it is complete on return, for reads). Each such wait drains the
/// queue: the GPU idles until the host has launched the next kernels. The hierarchical softmax's
/// step uploads three lists a level; the fifth GPU session measured its 2-level step at 4.93 ms
/// against a 0.52 ms bandwidth floor (bench/RESULTS.md).
///
/// How: the bytes are copied on the host into a ring of page-locked memory, and from there queued
/// on the stream (a copy from page-locked memory is asynchronous). Each upload records an event; a
/// later upload that needs the same bytes of the ring first waits for that event, so a region is
/// never overwritten before the device has read it. The ring starts at 1 MiB and doubles, up to a
/// limit (64 MiB); an upload larger than the limit is left to the caller's waiting copy. The
/// process has one ring per device (`upload_staged`), shared by every head under a lock: a head
/// built for one call (as the PyTorch package builds the full softmax) must not pay for allocating
/// page-locked memory, which takes milliseconds.

#include <xsoftmax/detail/cuda/error.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace xsoftmax::detail::gpu {

/// A growing ring of page-locked host memory through which host lists are queued for the device
/// (see the file's comment). Not thread-safe (`upload_staged` guards the process's rings).
class pinned_staging {
 public:
  static constexpr std::size_t initial_bytes = std::size_t(1) << 20;
  static constexpr std::size_t default_limit_bytes = std::size_t(64) << 20;
  static constexpr std::size_t alignment = 256;

  explicit pinned_staging(std::size_t limit_bytes = default_limit_bytes) : limit_(limit_bytes) {}
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    while (!in_flight_.empty()) {
      XSOFTMAX_CUDA_TRY_NOTHROW(cudaEventSynchronize(in_flight_.front().done));
      XSOFTMAX_CUDA_TRY_NOTHROW(cudaEventDestroy(in_flight_.front().done));
      in_flight_.pop_front();
    }
    for (cudaEvent_t e : idle_events_) XSOFTMAX_CUDA_TRY_NOTHROW(cudaEventDestroy(e));
    if (base_) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFreeHost(base_));
  }

  /// Queues a copy of `bytes` from host memory `src` to device (or managed) memory `dst` on
  /// `stream`, after the work queued before it; `src` may be reused on return. False, with nothing
  /// done, when `bytes` exceeds the limit, page-locked memory cannot be had, or the stream is
  /// capturing a graph: the caller copies another way. Throws `cuda_error` when the runtime reports
  /// an error.
  bool upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return true;
    // Under stream capture (a CUDA graph) a copy from the ring would be replayed later, from bytes
    // since overwritten: leave it to the caller's copy (which refuses capture loudly).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    XSOFTMAX_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return false;
    const std::size_t need = (bytes + alignment - 1) / alignment * alignment;
    if (need > limit_) return false;
    if (need > capacity_ && !grow(need)) return false;
    std::size_t at = head_;
    if (at + need > capacity_) at = 0;  // the ring's tail end is skipped
    // The oldest uploads hold the bytes after the newest: wait for them until the region is free
    // (and keep the list of events short: the device is long done with uploads 64 back).
    while (!in_flight_.empty() && (overlaps_any(at, at + need) || in_flight_.size() >= 64)) retire_oldest();
    std::memcpy(base_ + at, src, bytes);
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(dst, base_ + at, bytes, cudaMemcpyDefault, stream));
    cudaEvent_t done = take_event();
    const cudaError_t recorded = cudaEventRecord(done, stream);
    if (recorded != cudaSuccess) {
      idle_events_.push_back(done);
      // The copy is queued but cannot be tracked: wait for it here, so the region is free again.
      XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
      XSOFTMAX_CUDA_TRY(recorded);
    }
    in_flight_.push_back({at, at + need, done});
    head_ = at + need;
    return true;
  }

  /// Bytes of page-locked memory held.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  struct span {
    std::size_t begin, end;
    cudaEvent_t done;  // recorded after the span's copy was queued
  };

  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0, head_ = 0, limit_;
  std::deque<span> in_flight_;
  std::vector<cudaEvent_t> idle_events_;

  [[nodiscard]] bool overlaps_any(std::size_t begin, std::size_t end) const {
    return std::any_of(in_flight_.begin(), in_flight_.end(),
                       [&](const span& s) { return s.begin < end && begin < s.end; });
  }

  void retire_oldest() {
    const cudaEvent_t done = in_flight_.front().done;
    XSOFTMAX_CUDA_TRY(cudaEventSynchronize(done));
    in_flight_.pop_front();
    idle_events_.push_back(done);
  }

  cudaEvent_t take_event() {
    if (!idle_events_.empty()) {
      const cudaEvent_t e = idle_events_.back();
      idle_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    XSOFTMAX_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  /// A ring of at least `need` bytes (doubling, within the limit), once every upload in flight is
  /// done with the old one. False when page-locked memory cannot be allocated (the runtime's error
  /// is not sticky; it is cleared so that a later launch check does not report it).
  bool grow(std::size_t need) {
    while (!in_flight_.empty()) retire_oldest();
    std::size_t bytes = std::max(capacity_ == 0 ? initial_bytes : 2 * capacity_, need);
    bytes = std::min(bytes, limit_);
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (base_) XSOFTMAX_CUDA_TRY(cudaFreeHost(base_));
    base_ = static_cast<std::byte*>(p);
    capacity_ = bytes;
    head_ = 0;
    return true;
  }
};

/// `pinned_staging::upload` through the process's ring of the current device (made on first use,
/// freed at exit, before the CUDA runtime's own teardown: it is made after the runtime started),
/// under a lock shared by every thread.
inline bool upload_staged(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  int device = 0;
  XSOFTMAX_CUDA_TRY(cudaGetDevice(&device));
  struct rings {
    std::mutex mutex;
    std::map<int, std::unique_ptr<pinned_staging>> by_device;  // events belong to a device
  };
  static rings process;
  std::lock_guard<std::mutex> lock(process.mutex);
  std::unique_ptr<pinned_staging>& ring = process.by_device[device];
  if (!ring) ring = std::make_unique<pinned_staging>();
  return ring->upload(dst, src, bytes, stream);
}

}  // namespace xsoftmax::detail::gpu
