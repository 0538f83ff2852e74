// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The device memory of a `cuda_resources`, all from one `device_cache`: Thrust's temporaries
/// (`caching_allocator`) and the tuned kernels' scratch (`workspace`, `arena` per call). The cache is
/// a `cub::CachingDeviceAllocator`, or the caller's `device_memory_resource` when the resources were
/// given one (a framework's allocator: PyTorch's caching allocator in the PyTorch package).
///
/// Why a cache: cudaMalloc is slow and cudaFree synchronises the device; a freed block goes back to
/// CUB's cache and the next request of its size bin takes it again. Reusing a block at once,
/// although kernels that used it may still be queued, is safe: CUB ties each block to the stream it
/// was allocated on, which reuses it at once (stream order queues the next user behind every earlier
/// one); another stream reuses it only once the block's ready event has completed.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/memory_resource.cuh>

#include <cub/util_allocator.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

namespace xsoftmax::detail::gpu {

/// CUB's cache with power-of-two bins from 256 B to 2^48 B: every block is cached (CUB's default
/// caches blocks up to 2 MiB only; score chunks are tens of MiB), at most twice its request, and the
/// cached total is unbounded (an allocation that fails empties the cache and retries). With an
/// external `device_memory_resource` every block comes from it instead and CUB's cache stays empty.
struct device_cache : cub::CachingDeviceAllocator {
  explicit device_cache(std::shared_ptr<device_memory_resource> external = nullptr)
      : cub::CachingDeviceAllocator(2, 8, 48), external_(std::move(external)) {}
  /// A block of at least `bytes` bytes used on `stream`. Throws `cuda_error` (or what the external
  /// resource throws) when out of memory.
  [[nodiscard]] void* take(std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) bytes = 1;
    if (external_) return external_->allocate(bytes, stream);
    void* p = nullptr;
    XSOFTMAX_CUDA_TRY(DeviceAllocate(&p, bytes, stream));
    return p;
  }
  /// Returns a block `take(bytes, stream)` gave (work queued on `stream` may still use it).
  void give_back(void* p, std::size_t bytes, cudaStream_t stream) noexcept {
    if (!p) return;
    if (external_) external_->deallocate(p, bytes == 0 ? 1 : bytes, stream);
    else XSOFTMAX_CUDA_TRY_NOTHROW(DeviceFree(p));
  }

 private:
  std::shared_ptr<device_memory_resource> external_;
};

/// Thrust's temporary storage from the cache, on the resources' stream (what
/// `backend_traits<cuda>::policy(res)` hands Thrust: `thrust::cuda::par_nosync(allocator).on(stream)`).
class caching_allocator {
 public:
  using value_type = char;
  caching_allocator(device_cache& cache, cudaStream_t stream) : cache_(&cache), stream_(stream) {}
  [[nodiscard]] char* allocate(std::ptrdiff_t bytes) {
    return static_cast<char*>(cache_->take(bytes > 0 ? static_cast<std::size_t>(bytes) : 0, stream_));
  }
  void deallocate(char* p, std::size_t bytes) noexcept { cache_->give_back(p, bytes, stream_); }

 private:
  device_cache* cache_;
  cudaStream_t stream_;
};

/// The tuned kernels' scratch: one block from the cache, handed out in 256-byte aligned pieces and
/// kept from call to call. A piece that does not fit the block comes from the cache on its own; at
/// the end of such a call (`reset`) those pieces go back and the block grows to the call's total, so
/// from then on the same call takes nothing from the cache. `reserve` sizes the block up front.
/// Not thread-safe: one workspace serves one stream, used by one host thread at a time.
class workspace {
 public:
  static constexpr std::size_t alignment = 256;

  workspace(device_cache& cache, cudaStream_t stream) : cache_(cache), stream_(stream) {}
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
  ~workspace() {
    release_extra();
    cache_.give_back(block_, size_, stream_);
  }

  [[nodiscard]] static constexpr std::size_t round_up(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  /// A piece of at least `bytes` bytes (a zero-byte request still gets a distinct piece), valid
  /// until the next `reset`. Throws `cuda_error` when the device is out of memory.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const std::size_t need = round_up(std::max<std::size_t>(bytes, 1));
    used_ += need;
    void* piece = nullptr;
    if (used_ <= size_) {
      piece = static_cast<char*>(block_) + (used_ - need);
    } else {
      piece = cache_.take(need, stream_);
      extra_.emplace_back(piece, need);
    }
    if (poisoned()) XSOFTMAX_CUDA_TRY(cudaMemsetAsync(piece, 0xFF, need, stream_));
    return piece;
  }

  /// Whether every piece is filled with 0xFF bytes when handed out (NaN as a float, -1 as an
  /// index): set the environment variable XSOFTMAX_POISON_WORKSPACE=1 to make a kernel that reads
  /// scratch it did not write give NaNs and wrong indices, which the tests see. A cheaper check
  /// than compute-sanitizer's initcheck, and one that sees writes initcheck misses. Read once.
  [[nodiscard]] static bool poisoned() {
    static const bool on = [] {
      const char* v = std::getenv("XSOFTMAX_POISON_WORKSPACE");
      return v != nullptr && v[0] != '\0' && v[0] != '0';
    }();
    return on;
  }

  /// Ends a call: every piece is released. No wait: the cache keeps stream order.
  void reset() noexcept {
    release_extra();
    if (used_ > size_) {
      try {
        reserve(used_);
      } catch (...) {  // not fatal: the next call takes its pieces from the cache
      }
    }
    used_ = 0;
  }

  /// Makes sure the next call can take `bytes` bytes without taking from the cache. Call between
  /// verbs. Throws `cuda_error` when the device is out of memory.
  void reserve(std::size_t bytes) {
    bytes = round_up(bytes);
    if (bytes <= size_) return;
    cache_.give_back(std::exchange(block_, nullptr), size_, stream_);
    size_ = 0;
    block_ = cache_.take(bytes, stream_);
    size_ = bytes;
  }

  /// Bytes the block holds (what the largest call so far needed, or the reservation).
  [[nodiscard]] std::size_t capacity() const noexcept { return size_; }

 private:
  void release_extra() noexcept {
    for (const auto& [p, bytes] : extra_) cache_.give_back(p, bytes, stream_);
    extra_.clear();
  }

  device_cache& cache_;
  cudaStream_t stream_;
  void* block_ = nullptr;
  std::size_t size_ = 0, used_ = 0;
  std::vector<std::pair<void*, std::size_t>> extra_;  // pieces that did not fit the block, with their sizes
};

/// Typed pieces of a workspace for one call, released when the arena goes out of scope (also when
/// the call throws). A verb creates exactly one arena.
class arena {
 public:
  explicit arena(workspace& ws) : ws_(ws) {}
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() { ws_.reset(); }

  /// `n` uninitialised elements of type T (n >= 0).
  template <class T>
  [[nodiscard]] T* take(index_t n) {
    return static_cast<T*>(ws_.allocate(static_cast<std::size_t>(n < 0 ? 0 : n) * sizeof(T)));
  }

 private:
  workspace& ws_;
};

}  // namespace xsoftmax::detail::gpu
