// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Host working memory kept from one call to the next: the host backends' scratch vectors and
/// Thrust's temporary buffers take their blocks from a per-thread cache of blocks freed by earlier
/// calls, the host twin of the cuda backend's caching allocator.
///
/// Why: a call frees its working memory when it returns, and glibc gives the top of the heap (and
/// every block above its mmap threshold) back to the kernel; the next call's first touch of each of
/// those pages is a page fault and a zeroed page. For a binary-Huffman hierarchical-softmax step on
/// the omp backend (50K classes, d = 100, batch 1024) that was ~380 page faults and a third of the
/// step in the kernel: 2.9 ms a step against 1.8 ms with glibc told to keep its memory, and two
/// threads then ran 1.85x one (bench/RESULTS.md, issue 30). The serial backend escaped by the luck
/// of its allocation order.
///
/// Blocks below `host_cache_min_block` go to malloc (glibc serves them from its bins); blocks
/// between the two limits are rounded up to one of 8 size classes per power of two (at most 12.5 %
/// more) and kept after use, oldest first out, up to `host_cache_capacity` bytes per thread;
/// larger ones go to malloc and back (their call's work dwarfs their page faults). A thread's cache
/// is freed when the thread ends, or by `release_host_memory()`.

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace xsoftmax::detail {

/// Blocks smaller than this are not cached.
inline constexpr std::size_t host_cache_min_block = std::size_t(64) << 10;
/// Blocks larger than this are not cached.
inline constexpr std::size_t host_cache_max_block = std::size_t(64) << 20;
/// The most bytes one thread's cache keeps.
inline constexpr std::size_t host_cache_capacity = std::size_t(256) << 20;

/// One thread's cache of freed blocks (see the file comment). Not shared between threads: a block
/// freed on another thread than the one that took it joins that other thread's cache.
class host_block_cache {
 public:
  /// Under AddressSanitizer nothing is cached: a block reused by the next call would hide a read
  /// after its free from the sanitizer.
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  static constexpr bool sanitized = true;
#else
  static constexpr bool sanitized = false;
#endif
#else
  static constexpr bool sanitized = false;
#endif

  host_block_cache() = default;
  host_block_cache(const host_block_cache&) = delete;
  host_block_cache& operator=(const host_block_cache&) = delete;
  ~host_block_cache() { release(); }

  /// The calling thread's cache; null once it has been destroyed at the thread's end (a static
  /// object destroyed after the main thread's thread-locals still frees its memory: to malloc).
  static host_block_cache* local();

  /// `bytes` from the calling thread's cache (malloc once it has ended).
  [[nodiscard]] static void* take(std::size_t bytes) {
    host_block_cache* c = local();
    return c ? c->allocate(bytes) : checked_malloc(bytes);
  }
  /// Gives `p` (from `take(bytes)` on any thread) to the calling thread's cache, or to free.
  static void give(void* p, std::size_t bytes) noexcept {
    if (host_block_cache* c = local()) c->deallocate(p, bytes);
    else std::free(p);
  }

  /// The size a cached block of `bytes` has: `bytes` rounded up to the next of 8 classes per power
  /// of two.
  [[nodiscard]] static std::size_t size_class(std::size_t bytes) {
    std::size_t step = 1;  // the largest power of two <= bytes / 8 (1 for tiny sizes)
    while (step * 2 <= bytes / 8) step <<= 1;
    return (bytes + step - 1) / step * step;
  }
  [[nodiscard]] static bool cacheable(std::size_t bytes) {
    return !sanitized && bytes >= host_cache_min_block && size_class(bytes) <= host_cache_max_block;
  }

  /// `bytes` of memory aligned as malloc's; throws std::bad_alloc.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    if (!cacheable(bytes)) return checked_malloc(bytes);
    const std::size_t size = size_class(bytes);
    for (std::size_t i = blocks_.size(); i-- > 0;) {  // the most recently freed block of the class
      if (blocks_[i].size != size) continue;
      void* p = blocks_[i].memory;
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
      held_ -= size;
      return p;
    }
    return checked_malloc(size);
  }

  /// Gives back `p`, taken by `allocate(bytes)` on any thread.
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    if (!cacheable(bytes)) {
      std::free(p);
      return;
    }
    const std::size_t size = size_class(bytes);
    while (!blocks_.empty() && held_ + size > host_cache_capacity) {  // the oldest out
      std::free(blocks_.front().memory);
      held_ -= blocks_.front().size;
      blocks_.erase(blocks_.begin());
    }
    try {
      blocks_.push_back(block{p, size});
      held_ += size;
    } catch (...) {  // no room to remember it: give it back
      std::free(p);
    }
  }

  /// Frees every cached block.
  void release() noexcept {
    for (const block& b : blocks_) std::free(b.memory);
    blocks_.clear();
    held_ = 0;
  }

  /// Bytes held in cached blocks.
  [[nodiscard]] std::size_t held() const noexcept { return held_; }

 private:
  struct block {
    void* memory;
    std::size_t size;
  };

  friend struct host_thread_cache;
  // Set when the thread's cache is destroyed; a trivially destructible thread-local, readable
  // until the thread is gone.
  static bool& ended() noexcept {
    thread_local bool flag = false;
    return flag;
  }

  static void* checked_malloc(std::size_t bytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }

  std::vector<block> blocks_;
  std::size_t held_ = 0;
};

/// A thread's cache, which marks itself ended when the thread destroys it.
struct host_thread_cache : host_block_cache {
  ~host_thread_cache() { ended() = true; }
};

inline host_block_cache* host_block_cache::local() {
  if (ended()) return nullptr;
  thread_local host_thread_cache cache;
  return &cache;
}

/// The allocator the host backends' Thrust policies hand their temporary buffers to (Thrust's
/// allocator interface for temporaries: bytes as `char`).
struct host_temporary_allocator {
  using value_type = char;
  char* allocate(std::ptrdiff_t bytes) { return static_cast<char*>(host_block_cache::take(static_cast<std::size_t>(bytes))); }
  void deallocate(char* p, std::size_t bytes) noexcept { host_block_cache::give(p, bytes); }
};

/// The one instance the policies refer to (stateless: every thread reaches its own cache through it).
inline host_temporary_allocator host_temporaries;

}  // namespace xsoftmax::detail

namespace xsoftmax {
/// Frees the calling thread's cache of host working memory (detail/host/block_cache.hpp): the
/// blocks the host backends keep between calls, at most 256 MiB per thread.
inline void release_host_memory() noexcept {
  if (detail::host_block_cache* c = detail::host_block_cache::local()) c->release();
}
}  // namespace xsoftmax
