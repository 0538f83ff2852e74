// SPDX-License-Identifier: Apache-2.0
// The doctest runner of the CUDA tests (tests/cuda/*_test.cu). Without a usable CUDA device it
// prints why and exits with 77, which CTest reports as "skipped" (SKIP_RETURN_CODE 77).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  // Listing runs no test: it works without a GPU (CI prints what the GPU run would execute).
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-l", 2) == 0) return context.run();
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("xsoftmax_cuda_tests: no usable CUDA device (%s); skipping the GPU tests\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("xsoftmax_cuda_tests: running on %s (sm_%d%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  return context.run();
}
