// SPDX-License-Identifier: Apache-2.0
// doctest's main for the MPI tests: every rank runs every case; a rank whose checks fail makes the
// process (and mpirun) exit non-zero. Only rank 0 prints doctest's summary. In the cuda build
// (xsoftmax_cuda_mpi_tests, XSOFTMAX_TEST_ON_CUDA) every rank first looks for a GPU: without one
// every rank exits with 77, which CTest reports as skipped (listing the cases needs none).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#if defined(XSOFTMAX_TEST_ON_CUDA)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
#if defined(XSOFTMAX_TEST_ON_CUDA)
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    listing = listing || std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-l", 2) == 0;
  int devices = 0;
  const cudaError_t status = listing ? cudaSuccess : cudaGetDeviceCount(&devices);
  if (!listing && (status != cudaSuccess || devices == 0)) {
    if (rank == 0)
      std::printf("xsoftmax_cuda_mpi_tests: no usable CUDA device (%s); skipping the GPU tests on %d rank(s)\n",
                  status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0", size);
    MPI_Finalize();
    return 77;
  }
  if (!listing && rank == 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      std::printf("xsoftmax_cuda_mpi_tests: %d rank(s) on %s (sm_%d%d), device 0 of %d\n", size, prop.name, prop.major,
                  prop.minor, devices);
  }
#endif
  if (rank != 0) context.setOption("no-intro", true), context.setOption("minimal", true);
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
