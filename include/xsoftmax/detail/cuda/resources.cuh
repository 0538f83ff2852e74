// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `xsoftmax::cuda_resources`: what a head on the `cuda` backend holds besides its weights — the
/// stream every kernel, Thrust algorithm and cuBLAS call runs on, a cuBLAS handle bound to that
/// stream, a device workspace (a cached buffer reused by every call) and a caching allocator for
/// Thrust's temporaries, both from one CUB cache of device blocks (detail/cuda/workspace.cuh) or
/// from the caller's `device_memory_resource`. (A call's host lists reach the device through the
/// process's ring of page-locked memory, not the resources': detail/cuda/pinned_staging.cuh.)

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/memory_resource.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace xsoftmax {

/// Resources of a head on the `cuda` backend: a stream (not owned), a cuBLAS handle bound to it
/// (created on first use), a device workspace and the caching allocator of Thrust's temporaries.
/// Copies share all of them, so a copy is cheap; the last copy destroys them.
///
/// Every blocking verb of a head runs on `stream()` and synchronises it before returning (they
/// return host values such as the loss, and their outputs are ready on return). The `_async` verbs
/// only queue their work on `stream()`: their outputs are ready once the stream is synchronised
/// (`synchronize()`, a blocking verb, or any CUDA synchronisation the caller does), and their
/// inputs and outputs must stay alive until then. Every verb, `_async` ones included, validates its
/// inputs (data checks on the device) before it queues anything and throws from the call.
///
/// Thread safety: like a cuBLAS handle, one `cuda_resources` (with its copies) must be used by one
/// host thread at a time. Heads used concurrently from several threads each need their own
/// `cuda_resources` (typically each on its own stream).
///
/// The cuBLAS handle and the workspace belong to the device that is current when they are first
/// used; use the head on that device.
///
/// A host framework shares its own resources with a head (as the PyTorch package does with torch's
/// current stream, caching allocator and cuBLAS handle):
///
///     xsoftmax::cuda_resources res(stream, std::make_shared<my_allocator>());  // a device_memory_resource
///     res.use_cublas(framework_handle);  // borrowed, already bound to `stream`
class cuda_resources {
 public:
  /// Runs on the legacy default stream (stream 0).
  cuda_resources() : state_(std::make_shared<state>(nullptr, nullptr)) {}
  /// Runs on `stream` (not owned: it must outlive every head using these resources).
  explicit cuda_resources(cudaStream_t stream) : stream_(stream), state_(std::make_shared<state>(stream, nullptr)) {}
  /// Runs on `stream`, and takes every working buffer (workspace, Thrust's temporaries, per-call
  /// buffers) from `memory` instead of a cache of its own (see `device_memory_resource`); null
  /// `memory` means the library's cache. The resource is shared: it lives as long as the last copy
  /// of these resources.
  cuda_resources(cudaStream_t stream, std::shared_ptr<device_memory_resource> memory)
      : stream_(stream), state_(std::make_shared<state>(stream, std::move(memory))) {}

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// Uses the caller's cuBLAS `handle` from now on (every copy of these resources), instead of one
  /// of their own: borrowed, never destroyed, and never re-bound (cublasSetStream would also reset
  /// the handle's workspace). The caller binds it to `stream()` first (a framework's handle comes
  /// bound to its current stream, with its workspace); its math mode is the caller's too (PyTorch's
  /// handle allows TF32 for fp32 GEMMs only when torch.backends.cuda.matmul.allow_tf32 is set). A
  /// null handle returns to the resources' own. Throws `invalid_argument` when `handle` is
  /// bound to another stream, `cuda_error` when cuBLAS cannot tell.
  void use_cublas(cublasHandle_t handle) const {
    if (handle) {
      cudaStream_t bound = nullptr;
      XSOFTMAX_CUBLAS_TRY(cublasGetStream(handle, &bound));
      detail::expects(bound == stream_, "cuda_resources::use_cublas: the handle is bound to stream ",
                      stream_name(bound), ", these resources run on ", stream_name(stream_),
                      " (cublasSetStream it first)");
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->borrowed = handle;
  }

  /// The cuBLAS handle, bound to `stream()`: the borrowed one (`use_cublas`), else the resources'
  /// own, created on first call. Throws `cuda_error`.
  [[nodiscard]] cublasHandle_t cublas() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->borrowed) return state_->borrowed;
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
  /// allocate (e.g. what `workspace_bytes()` reports after a call of the largest batch). Throws
  /// `cuda_error` when the device is out of memory.
  void reserve_workspace(std::size_t bytes) const { state_->ws.reserve(bytes); }

  /// Bytes the cached workspace holds now.
  [[nodiscard]] std::size_t workspace_bytes() const noexcept { return state_->ws.capacity(); }

  /// Thrust's temporary-storage allocator (see detail/cuda/workspace.cuh).
  [[nodiscard]] detail::gpu::caching_allocator& thrust_allocator() const noexcept { return state_->alloc; }

  /// Waits for everything queued on `stream()`. Throws `cuda_error` when the stream reports a CUDA
  /// error.
  void synchronize() const { XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream_)); }

  /// `synchronize()` (the name the `_async` verbs' callers used before their data errors were
  /// thrown from the call).
  void check() const { synchronize(); }

 private:
  static std::string stream_name(cudaStream_t s) {
    return s == nullptr ? std::string("0 (the default stream)") : std::to_string(reinterpret_cast<std::uintptr_t>(s));
  }

  struct state {
    std::mutex mutex;
    cublasHandle_t handle = nullptr;    // owned, created on first use
    cublasHandle_t borrowed = nullptr;  // the caller's (use_cublas), used instead of `handle`
    detail::gpu::device_cache cache;    // before its users: destroyed after them
    detail::gpu::workspace ws;
    detail::gpu::caching_allocator alloc;
    state(cudaStream_t stream, std::shared_ptr<device_memory_resource> memory)
        : cache(std::move(memory)), ws(cache, stream), alloc(cache, stream) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (handle) XSOFTMAX_CUBLAS_TRY_NOTHROW(cublasDestroy(handle));
    }
  };

  cudaStream_t stream_ = nullptr;
  std::shared_ptr<state> state_;
};

}  // namespace xsoftmax
