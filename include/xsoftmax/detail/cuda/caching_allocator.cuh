// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The allocator of Thrust's temporary storage on the `cuda` backend (see `caching_allocator`).

#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>

namespace xsoftmax::detail::gpu {

/// Thrust's temporary storage, from cached device blocks (what `backend_traits<cuda>::policy(res)`
/// hands Thrust: `thrust::cuda::par_nosync(allocator).on(stream)`).
///
/// Without it every Thrust algorithm that needs temporaries (sort, reduce_by_key, copy_if, ...)
/// calls cudaMalloc and cudaFree, and cudaFree synchronises the whole device. Here a freed block
/// goes to a free list keyed by size and the next request of at most its size (and at least half
/// of it, so a small request does not pin a huge block) takes it again.
///
/// Why reusing a block right after Thrust frees it is safe although the kernels that used it may
/// still be queued: every Thrust call through these resources runs on their one stream, so a
/// kernel that gets the block next is queued behind every kernel that used it before (stream
/// order). Not thread-safe (one `cuda_resources` is used by one host thread at a time). The blocks
/// are released by the destructor; cudaFree waits for the device, so no queued kernel still uses
/// them then.
class caching_allocator {
 public:
  using value_type = char;

  caching_allocator() = default;
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  ~caching_allocator() { release(); }

  /// A block of at least `bytes` bytes. Throws `cuda_error` when the device is out of memory (after
  /// giving the cached free blocks back and trying again).
  [[nodiscard]] char* allocate(std::ptrdiff_t bytes) {
    const std::size_t need = workspace::round_up(bytes <= 0 ? 1 : static_cast<std::size_t>(bytes));
    const auto hit = free_.lower_bound(need);
    if (hit != free_.end() && hit->first / 2 <= need) {
      char* p = hit->second;
      used_.emplace(p, hit->first);
      free_.erase(hit);
      return p;
    }
    void* p = nullptr;
    if (cudaMalloc(&p, need) != cudaSuccess) {
      (void)cudaGetLastError();
      release_free();
      XSOFTMAX_CUDA_TRY(cudaMalloc(&p, need));
    }
    used_.emplace(static_cast<char*>(p), need);
    return static_cast<char*>(p);
  }

  /// Returns a block to the free list (no CUDA call: see the class comment for why that is safe).
  void deallocate(char* p, std::size_t) noexcept {
    const auto it = used_.find(p);
    if (it == used_.end()) return;
    free_.emplace(it->second, p);
    used_.erase(it);
  }

  /// Bytes held in free blocks.
  [[nodiscard]] std::size_t cached_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& kv : free_) total += kv.first;
    return total;
  }

 private:
  void release_free() noexcept {
    for (const auto& kv : free_) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(kv.second));
    free_.clear();
  }
  void release() noexcept {
    release_free();
    for (const auto& kv : used_) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(kv.first));
    used_.clear();
  }

  std::multimap<std::size_t, char*> free_;  ///< size -> block
  std::map<char*, std::size_t> used_;       ///< block -> size
};

}  // namespace xsoftmax::detail::gpu
