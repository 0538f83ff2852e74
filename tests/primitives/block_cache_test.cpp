// SPDX-License-Identifier: Apache-2.0
// The host backends' per-thread cache of working memory (detail/host/block_cache.hpp): size
// classes hold the request and waste at most an eighth; a freed block of a class comes back for
// the next request of that class; blocks outside the limits are never kept; the cache never holds
// more than its capacity, drops its oldest blocks first and frees everything on release; scratch
// vectors and Thrust's temporaries on the host backends go through it.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/host/block_cache.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <doctest/doctest.h>

#include <thrust/sort.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

namespace {

namespace xd = xsoftmax::detail;
using std::size_t;

TEST_CASE("host block cache: size classes") {
  for (size_t bytes = 1; bytes < (size_t(1) << 30); bytes = bytes * 3 / 2 + 7) {
    const size_t c = xd::host_block_cache::size_class(bytes);
    CHECK(c >= bytes);
    CHECK(c - bytes <= bytes / 8);
    CHECK(xd::host_block_cache::size_class(c) == c);  // a class is its own class
  }
  CHECK(!xd::host_block_cache::cacheable(xd::host_cache_min_block - 1));
  CHECK(xd::host_block_cache::cacheable(xd::host_cache_min_block) != xd::host_block_cache::sanitized);
  CHECK(xd::host_block_cache::cacheable(xd::host_cache_max_block) != xd::host_block_cache::sanitized);
  CHECK(!xd::host_block_cache::cacheable(xd::host_cache_max_block + 1));
}

TEST_CASE("host block cache: reuse, limits, capacity and release") {
  if (xd::host_block_cache::sanitized) {
    MESSAGE("AddressSanitizer build: the cache keeps nothing");
    return;
  }
  xd::host_block_cache cache;
  const size_t a = 100000;
  void* p = cache.allocate(a);
  std::memset(p, 1, a);
  cache.deallocate(p, a);
  CHECK(cache.held() == xd::host_block_cache::size_class(a));
  CHECK(cache.allocate(a + 1) == p);  // the same class: the same block back
  CHECK(cache.held() == 0);
  cache.deallocate(p, a + 1);
  void* other = cache.allocate(4 * a);  // another class: a new block
  CHECK(other != p);
  cache.deallocate(other, 4 * a);
  // Blocks outside the limits are never held.
  cache.release();
  cache.deallocate(cache.allocate(100), 100);
  cache.deallocate(cache.allocate(xd::host_cache_max_block + 1), xd::host_cache_max_block + 1);
  CHECK(cache.held() == 0);
  // Never more than the capacity: the oldest go first.
  std::vector<void*> blocks;
  const size_t big = xd::host_cache_max_block;
  const size_t n = xd::host_cache_capacity / big + 2;
  for (size_t i = 0; i < n; ++i) blocks.push_back(cache.allocate(big));
  for (void* b : blocks) cache.deallocate(b, big);
  CHECK(cache.held() <= xd::host_cache_capacity);
  CHECK(cache.held() == (xd::host_cache_capacity / big) * big);
  CHECK(cache.allocate(big) == blocks.back());  // the most recently freed block is kept
  cache.deallocate(blocks.back(), big);
  cache.release();
  CHECK(cache.held() == 0);
}

TEST_CASE("host block cache: scratch vectors and Thrust temporaries of the host backends use it") {
  if (xd::host_block_cache::sanitized) return;
  auto& local = *xd::host_block_cache::local();
  local.release();
  const xsoftmax::host_resources res;
  {
    const xd::execution<xsoftmax::omp> ex{res};
    xd::scratch_vector<xsoftmax::omp, float> v(100000, ex, 2.f);
    CHECK(v[99999] == 2.f);
  }
  const size_t held = local.held();
  CHECK(held == xd::host_block_cache::size_class(100000 * sizeof(float)));
  // A sort's temporaries go through the policy's allocator and come back to the cache.
  std::vector<long> keys(200000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<long>((i * 7919) % 200003);
  thrust::stable_sort(xsoftmax::backend_traits<xsoftmax::omp>::policy(res), keys.begin(), keys.end());
  CHECK(keys.front() <= keys.back());
  CHECK(local.held() > 0);
  xsoftmax::release_host_memory();
  CHECK(local.held() == 0);
}

std::atomic<bool> freed_after_cache_ended{false};

// Frees a block when its thread ends, after that thread's cache is gone (thread-locals are
// destroyed in reverse order of construction; this one is made first).
struct frees_at_thread_end {
  void* p = nullptr;
  size_t bytes = 0;
  ~frees_at_thread_end() {
    freed_after_cache_ended = xd::host_block_cache::local() == nullptr;
    xd::host_block_cache::give(p, bytes);  // to free: no use of the destroyed cache
  }
};

TEST_CASE("host block cache: a block freed after its thread's cache is gone goes to free") {
  std::thread([] {
    thread_local frees_at_thread_end holder;
    holder.bytes = 100000;
    holder.p = xd::host_block_cache::take(holder.bytes);  // makes the thread's cache, after holder
    xd::host_block_cache::give(xd::host_block_cache::take(200000), 200000);
  }).join();
  CHECK(freed_after_cache_ended);
}

}  // namespace
