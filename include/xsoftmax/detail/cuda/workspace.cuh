// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The device workspace of a `cuda_resources`: one cached buffer the verbs take their scratch from
/// (`workspace`, `arena` for one call), and `workspace_plan`, the size query over the same takes.

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/cuda/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace xsoftmax::detail::gpu {

/// Device memory handed out to the verbs in 256-byte aligned pieces, reused from call to call.
///
/// Within one call pieces are bumped off the current block; when it is full a new block is
/// allocated (earlier pieces stay valid: blocks never move). At the end of the call (`reset`) all
/// pieces are released, and if the call needed more than one block they are replaced by a single
/// block of their total size, so from then on the same call allocates nothing. A caller that knows
/// its needs can `reserve` them up front.
///
/// Not thread-safe: one workspace serves one stream, used by one host thread at a time.
class workspace {
 public:
  static constexpr std::size_t alignment = 256;

  workspace() = default;
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
  ~workspace() { release_blocks(); }

  [[nodiscard]] static constexpr std::size_t round_up(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  /// A piece of at least `bytes` bytes (a zero-byte request still gets a distinct piece), valid
  /// until the next `reset`. Throws `cuda_error` when the device is out of memory.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const std::size_t need = round_up(bytes == 0 ? 1 : bytes);
    if (!blocks_.empty() && blocks_.back().size - blocks_.back().used >= need) {
      block& b = blocks_.back();
      void* p = static_cast<char*>(b.ptr) + b.used;
      b.used += need;
      return p;
    }
    // Geometric growth so a call that grows piece by piece does O(log) allocations.
    std::size_t size = need;
    if (!blocks_.empty() && blocks_.back().size > size) size = blocks_.back().size;
    if (size < (std::size_t(1) << 20)) size = std::size_t(1) << 20;
    void* p = nullptr;
    XSOFTMAX_CUDA_TRY(cudaMalloc(&p, size));
    blocks_.push_back({p, size, need});
    return p;
  }

  /// Ends a call: every piece is released. `stream` is the stream the pieces were used on; when
  /// blocks are merged, it is synchronised first so that no queued kernel still uses them.
  void reset(cudaStream_t stream) noexcept {
    if (blocks_.size() <= 1) {
      if (!blocks_.empty()) blocks_.front().used = 0;
      return;
    }
    std::size_t total = 0;
    for (const block& b : blocks_) total += b.size;
    XSOFTMAX_CUDA_TRY_NOTHROW(cudaStreamSynchronize(stream));
    release_blocks();
    void* p = nullptr;
    if (cudaMalloc(&p, total) == cudaSuccess) {
      blocks_.push_back({p, total, 0});
    } else {
      (void)cudaGetLastError();  // not fatal: the next call allocates as it goes
    }
  }

  /// Makes sure the next call can take `bytes` bytes without allocating. Call between verbs.
  void reserve(std::size_t bytes, cudaStream_t stream) {
    if (capacity() >= bytes && blocks_.size() <= 1) return;
    XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
    release_blocks();
    void* p = nullptr;
    XSOFTMAX_CUDA_TRY(cudaMalloc(&p, round_up(bytes)));
    blocks_.push_back({p, round_up(bytes), 0});
  }

  /// Bytes currently held (what the largest call so far needed, after its `reset`).
  [[nodiscard]] std::size_t capacity() const noexcept {
    std::size_t total = 0;
    for (const block& b : blocks_) total += b.size;
    return total;
  }

 private:
  struct block {
    void* ptr;
    std::size_t size;
    std::size_t used;
  };

  void release_blocks() noexcept {
    for (const block& b : blocks_) XSOFTMAX_CUDA_TRY_NOTHROW(cudaFree(b.ptr));
    blocks_.clear();
  }

  std::vector<block> blocks_;
};

/// Typed pieces of a workspace for one call, released when the arena goes out of scope (also when
/// the call throws). A verb creates exactly one arena.
class arena {
 public:
  arena(workspace& ws, cudaStream_t stream) : ws_(ws), stream_(stream) {}
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() { ws_.reset(stream_); }

  /// `n` uninitialised elements of type T (n >= 0).
  template <class T>
  [[nodiscard]] T* take(index_t n) {
    return static_cast<T*>(ws_.allocate(static_cast<std::size_t>(n < 0 ? 0 : n) * sizeof(T)));
  }

 private:
  workspace& ws_;
  cudaStream_t stream_;
};

/// Counts what a sequence of `take` calls would use, without allocating: the size-query half of
/// "size query, then run" (see `cuda_resources::reserve_workspace`).
class workspace_plan {
 public:
  template <class T>
  T* take(index_t n) {
    const std::size_t bytes = static_cast<std::size_t>(n < 0 ? 0 : n) * sizeof(T);
    bytes_ += workspace::round_up(bytes == 0 ? 1 : bytes);  // as workspace::allocate rounds
    return nullptr;
  }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

}  // namespace xsoftmax::detail::gpu
