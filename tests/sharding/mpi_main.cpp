// SPDX-License-Identifier: Apache-2.0
// doctest's main for the MPI tests: every rank runs every case; a rank whose checks fail makes the
// process (and mpirun) exit non-zero. Only rank 0 prints doctest's summary.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("no-intro", true), context.setOption("minimal", true);
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
