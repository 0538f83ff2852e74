// SPDX-License-Identifier: Apache-2.0
// `gpu::pinned_staging` (detail/cuda/pinned_staging.cuh), the ring of page-locked memory through
// which a call's host lists reach the device without waiting for the stream: every upload arrives
// intact although the host overwrites its source at once and the stream is busy (the ring wraps
// many times, so a region is reused only after the device has read it); the ring grows for a
// large list; what exceeds its limit, or comes while the stream captures a graph, is refused.

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/detail/cuda/pinned_staging.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace {

/// Keeps the stream busy for about `cycles` clock ticks (one thread), so that the uploads queued
/// after it wait in the stream while the host goes on.
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

std::vector<int> read_back(const int* device, std::size_t n) {
  std::vector<int> host(n);
  REQUIRE(cudaMemcpy(host.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

}  // namespace

TEST_CASE("cuda pinned_staging: uploads behind a busy stream arrive intact; the ring wraps, grows and refuses") {
  using xsoftmax::detail::gpu::pinned_staging;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  SUBCASE("a small ring wraps every few uploads") {
    pinned_staging ring(8192);  // lists of up to 2.4 KB: a wrap every 3-8 uploads
    const int lists = 200;
    std::vector<int*> device(lists, nullptr);
    std::vector<std::size_t> size(lists);
    for (int i = 0; i < lists; ++i) {
      size[static_cast<std::size_t>(i)] = 1 + static_cast<std::size_t>((i * 37) % 600);
      REQUIRE(cudaMalloc(&device[static_cast<std::size_t>(i)], size[static_cast<std::size_t>(i)] * sizeof(int)) ==
              cudaSuccess);
    }
    spin_kernel<<<1, 1, 0, stream>>>(20000000);  // ~10 ms at 2 GHz
    REQUIRE(cudaGetLastError() == cudaSuccess);
    std::vector<int> source(600);
    for (int i = 0; i < lists; ++i) {  // one host buffer, overwritten after each upload
      for (std::size_t j = 0; j < source.size(); ++j) source[j] = i * 100000 + static_cast<int>(j);
      CHECK(ring.upload(device[static_cast<std::size_t>(i)], source.data(), size[static_cast<std::size_t>(i)] * sizeof(int),
                        stream));
    }
    CHECK(ring.capacity() == 8192);
    std::vector<int> too_large(8192 / sizeof(int) + 1, 7);
    CHECK_FALSE(ring.upload(device[0], too_large.data(), too_large.size() * sizeof(int), stream));  // left to the caller
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    int wrong = 0;
    for (int i = 0; i < lists; ++i) {
      const std::vector<int> got = read_back(device[static_cast<std::size_t>(i)], size[static_cast<std::size_t>(i)]);
      for (std::size_t j = 0; j < got.size(); ++j) wrong += got[j] != i * 100000 + static_cast<int>(j);
    }
    CHECK(wrong == 0);
    for (int* p : device) CHECK(cudaFree(p) == cudaSuccess);
  }

  SUBCASE("the ring grows for a list larger than it holds") {
    pinned_staging ring;
    std::vector<int> small(100, 3), large((std::size_t(3) << 20) / sizeof(int));  // 3 MiB: past the first 1 MiB
    for (std::size_t j = 0; j < large.size(); ++j) large[j] = static_cast<int>(j * 3 + 1);
    int *a = nullptr, *b = nullptr;
    REQUIRE(cudaMalloc(&a, small.size() * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, large.size() * sizeof(int)) == cudaSuccess);
    spin_kernel<<<1, 1, 0, stream>>>(2000000);
    CHECK(ring.upload(a, small.data(), small.size() * sizeof(int), stream));
    CHECK(ring.capacity() == pinned_staging::initial_bytes);
    CHECK(ring.upload(b, large.data(), large.size() * sizeof(int), stream));
    CHECK(ring.capacity() >= large.size() * sizeof(int));
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(read_back(a, small.size()) == small);
    CHECK(read_back(b, large.size()) == large);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess);
  }

  SUBCASE("nothing is staged while the stream captures a graph (a replay would read reused bytes)") {
    pinned_staging ring;
    int* a = nullptr;
    REQUIRE(cudaMalloc(&a, 16 * sizeof(int)) == cudaSuccess);
    std::vector<int> values(16, 5);
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    const bool staged = ring.upload(a, values.data(), values.size() * sizeof(int), stream);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    CHECK_FALSE(staged);
    if (graph) CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    CHECK(cudaFree(a) == cudaSuccess);
  }

  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}
