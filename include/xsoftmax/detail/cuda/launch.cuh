// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Launch helpers of the CUDA kernels (block size, grid sizes for grid-stride loops, thread
/// indices) and small host <-> device copies.
///
/// Conventions: all pointers are device pointers unless named `host_*`; every kernel runs on the
/// resources' stream; element offsets are computed in 64-bit `index_t`.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/types.hpp>

#include <climits>
#include <cstdint>
#include <vector>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// Launch helpers
// ------------------------------------------------------------------------------------------------

/// Threads per block of the element-wise kernels.
inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than the loop
/// needs, and within the grid limit whatever n is (the loops stride, so any n is covered).
[[nodiscard]] inline unsigned grid_for(index_t n, int threads = block_threads) {
  const index_t blocks = (n + threads - 1) / threads;
  constexpr index_t cap = index_t(1) << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

/// Blocks for kernels with one block per row (rows strided by the grid).
[[nodiscard]] inline unsigned grid_rows(index_t rows) {
  constexpr index_t cap = index_t(1) << 30;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

__device__ inline index_t global_thread() { return static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline index_t grid_threads() { return static_cast<index_t>(gridDim.x) * blockDim.x; }

/// Copies one element from device to host (waits for the stream first, so queued work is done).
template <class T>
[[nodiscard]] T read_one(const T* device_ptr, cudaStream_t stream) {
  T value;
  XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(&value, device_ptr, sizeof(T), cudaMemcpyDeviceToHost, stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
  return value;
}

/// Copies n elements from device to a new host vector.
template <class T>
[[nodiscard]] std::vector<T> to_host(const T* device_ptr, index_t n, cudaStream_t stream) {
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0)
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(out.data(), device_ptr, static_cast<std::size_t>(n) * sizeof(T),
                                      cudaMemcpyDeviceToHost, stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
  return out;
}

/// Copies a host vector to device memory (n = host.size() elements). Synchronises, so the host
/// vector may be a temporary.
template <class T>
void to_device(T* device_ptr, const std::vector<T>& host, cudaStream_t stream) {
  if (host.empty()) return;
  XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(device_ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                                    stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

}  // namespace xsoftmax::detail::gpu
