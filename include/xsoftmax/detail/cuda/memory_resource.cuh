// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `xsoftmax::device_memory_resource`: where a `cuda_resources` takes the device memory of a head's
/// calls, when a host framework (PyTorch, JAX, RMM, ...) should provide it instead of the library's
/// own cache of device blocks.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace xsoftmax {

/// Stream-ordered device memory for the working buffers of a head's calls: Thrust's temporaries,
/// the tuned kernels' workspace and every per-call buffer (packed rows, losses, score chunks).
/// Give one to `cuda_resources(stream, memory)` so that a framework's allocator serves them and
/// counts them (PyTorch's `torch.cuda.max_memory_allocated` then includes the head's memory, and
/// nothing is cached beside the framework's own cache).
///
/// Contract, the one PyTorch's caching allocator, RMM's stream-ordered resources and
/// `cudaMallocAsync` keep:
/// * `allocate(bytes, stream)` returns at least `bytes` bytes of device memory (a distinct block
///   also for 0 bytes, or nullptr for 0 bytes), usable by work queued on `stream` from now on,
///   aligned to 256 bytes; it throws (any exception; `cuda_error` preferred) when out of memory.
/// * `deallocate(p, bytes, stream)` returns a block `allocate(bytes, stream)` gave, possibly while
///   work queued on `stream` still uses it: the resource must not hand the block to another stream
///   before that work is done (reusing it on `stream` itself is safe: stream order). It must not
///   throw.
/// * Both are called from the host thread that uses the head, one call at a time per
///   `cuda_resources`; a resource shared by several `cuda_resources` used from several threads must
///   be thread-safe.
///
/// The library's own default (no resource given) is a CUB `CachingDeviceAllocator` per
/// `cuda_resources` (detail/cuda/workspace.cuh).
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;
  [[nodiscard]] virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept = 0;
};

}  // namespace xsoftmax
