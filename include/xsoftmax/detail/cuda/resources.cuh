// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `xsoftmax::cuda_resources`: what a head on the `cuda` backend holds besides its weights — the
/// stream every kernel, Thrust algorithm and cuBLAS call runs on, a cuBLAS handle bound to that
/// stream, a device workspace (a cached buffer reused by every call), a caching allocator for
/// Thrust's temporaries, and the device status word in which the `_async` verbs record a failed
/// data check.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/cuda/caching_allocator.cuh>
#include <xsoftmax/detail/cuda/device_status.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>

namespace xsoftmax {

/// Resources of a head on the `cuda` backend: a stream (not owned), a cuBLAS handle bound to it
/// (created on first use), a device workspace, the caching allocator of Thrust's temporaries and
/// the `_async` verbs' device status word. Copies share all of them, so a copy is cheap; the last
/// copy destroys them.
///
/// Every blocking verb of a head runs on `stream()` and synchronises it before returning (they
/// return host values such as the loss, and their outputs are ready on return). The `_async` verbs
/// only queue their work on `stream()`: their outputs are ready once the stream is synchronised
/// (`synchronize()`, `check()`, a blocking verb, or any CUDA synchronisation the caller does), and
/// their inputs and outputs must stay alive until then.
///
/// Data checks of the `_async` verbs (finite hidden values, targets in range, finite upstream
/// gradients) run on the device and record the first failure in a device status word held here;
/// `check()`, `synchronize()` and the next blocking verb of any head on these resources read it and
/// throw what the blocking verb would have thrown (same type, same message). The outputs of the
/// failed call and of calls queued after it are unspecified.
///
/// Thread safety: like a cuBLAS handle, one `cuda_resources` (with its copies) must be used by one
/// host thread at a time. Heads used concurrently from several threads each need their own
/// `cuda_resources` (typically each on its own stream).
///
/// The cuBLAS handle and the workspace belong to the device that is current when they are first
/// used; use the head on that device.
class cuda_resources {
 public:
  /// Runs on the legacy default stream (stream 0).
  cuda_resources() : state_(std::make_shared<state>()) {}
  /// Runs on `stream` (not owned: it must outlive every head using these resources).
  explicit cuda_resources(cudaStream_t stream) : stream_(stream), state_(std::make_shared<state>()) {}

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// The cuBLAS handle, bound to `stream()`; created on first call. Throws `cuda_error`.
  [[nodiscard]] cublasHandle_t cublas() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->handle) {
      cublasHandle_t h = nullptr;
      XSOFTMAX_CUBLAS_TRY(cublasCreate(&h));
      const cublasStatus_t s = cublasSetStream(h, stream_);
      if (s != CUBLAS_STATUS_SUCCESS) {
        XSOFTMAX_CUBLAS_TRY_NOTHROW(cublasDestroy(h));
        XSOFTMAX_CUBLAS_TRY(s);
      }
      state_->handle = h;
    }
    return state_->handle;
  }

  /// The workspace the verbs allocate their temporary buffers from.
  [[nodiscard]] detail::gpu::workspace& workspace() const { return state_->ws; }

  /// Grows the cached workspace to at least `bytes` now, so that calls needing no more do not
  /// allocate (size query first with e.g. `cuda_workspace_bytes(head, batch_rows)`). Throws
  /// `cuda_error` when the device is out of memory.
  void reserve_workspace(std::size_t bytes) const { state_->ws.reserve(bytes, stream_); }

  /// Bytes the cached workspace holds now.
  [[nodiscard]] std::size_t workspace_bytes() const noexcept { return state_->ws.capacity(); }

  /// Thrust's temporary-storage allocator (see `detail::gpu::caching_allocator`).
  [[nodiscard]] detail::gpu::caching_allocator& thrust_allocator() const noexcept { return state_->alloc; }

  /// Waits for everything queued on `stream()`, then throws a failure an `_async` verb recorded
  /// (as `check()`). Throws `cuda_error`, or what the failed verb's blocking form throws.
  void synchronize() const { check(); }

  /// Waits for everything queued on `stream()` and, when an `_async` verb queued since the last
  /// check recorded a failed data check, clears it and throws what the blocking verb would have
  /// thrown (`out_of_range`, `non_finite_error`, with the same message). Throws `cuda_error` when
  /// the stream reports a CUDA error.
  void check() const {
    XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (!state_->async_pending) return;
    state_->async_pending = false;
    detail::gpu::device_status s{};
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(&s, state_->status, sizeof s, cudaMemcpyDeviceToHost, stream_));
    XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (s.kind == detail::gpu::device_status::none) return;
    // Queued on the stream: every later recording kernel runs after the reset.
    XSOFTMAX_CUDA_TRY(cudaMemsetAsync(state_->status, 0, sizeof s, stream_));
    detail::gpu::throw_status(s);
  }

  /// `check()` when an `_async` verb has been queued since the last check (what the blocking verbs
  /// call first); nothing otherwise, so code that never uses `_async` verbs pays nothing.
  void check_pending() const {
    if (state_->async_pending) check();
  }

  /// The device status word the `_async` verbs record failures in (allocated on first use, which
  /// synchronises the device, and zeroed on the stream), marked as pending a check. For the verbs'
  /// implementation.
  [[nodiscard]] detail::gpu::device_status* begin_async() const {
    if (!state_->status) {
      void* p = nullptr;
      XSOFTMAX_CUDA_TRY(cudaMalloc(&p, sizeof(detail::gpu::device_status)));
      state_->status = static_cast<detail::gpu::device_status*>(p);
      XSOFTMAX_CUDA_TRY(cudaMemsetAsync(p, 0, sizeof(detail::gpu::device_status), stream_));
    }
    state_->async_pending = true;
    return state_->status;
  }

 private:
  struct state {
    std::mutex mutex;
    cublasHandle_t handle = nullptr;
    detail::gpu::workspace ws;
    detail::gpu::caching_allocator alloc;
    detail::gpu::device_status* status = nullptr;
    bool async_pending = false;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (handle) XSOFTMAX_CUBLAS_TRY_NOTHROW(cublasDestroy(handle));
      if (status) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(status));
    }
  };

  cudaStream_t stream_ = nullptr;
  std::shared_ptr<state> state_;
};

}  // namespace xsoftmax
