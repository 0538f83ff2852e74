// SPDX-License-Identifier: Apache-2.0
// A class-sharded full softmax trained data-parallel over MPI ranks:
//
//   mpirun -np 4 ./build/examples/mpi_sharded_training [classes=200000] [dim=256] [rows_per_rank=1024] [steps=20]
//                                                      [checkpoint_dir]
//
// Each rank holds classes/ranks classes and its own batch of rows (synthetic: each row its class's
// centre plus noise); every step all-gathers the rows, combines the row statistics over the ranks
// (one max and one sum all-reduce), reduce-scatters grad_hidden and applies SGD to the local rows.
// Rank 0 prints the loss, the step time, the time spent inside the collectives and the bytes each
// rank sent per step (counted by a thin wrapper around the communicator), then one summary line
// (`summary ranks=... step_ms=... comm_ms=... mb_per_rank=...`) for bench/RESULTS.md. Built when
// CMake finds MPI. With a checkpoint_dir, the trained head is saved as a sharded checkpoint (one
// file per rank and a manifest) and read back whole by rank 0, as an evaluation job on one
// process would (`load_sharded_checkpoint` into an unsharded head: any rank count loads it).
#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/io/sharded_checkpoint.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

/// mpi_communicator that counts the bytes this rank contributes to each collective, and the wall
/// time spent in them (waiting for the slowest rank included).
struct counting_communicator {
  xs::mpi_communicator mpi;
  double* bytes;
  double* seconds;
  struct timer {
    double* total;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~timer() { *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  };
  [[nodiscard]] int rank() const { return mpi.rank(); }
  [[nodiscard]] int size() const { return mpi.size(); }
  template <class T>
  void all_reduce(T* data, index_t n, xs::reduce_op op) {
    *bytes += static_cast<double>(n) * sizeof(T);
    const timer t{seconds};
    mpi.all_reduce(data, n, op);
  }
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    *bytes += static_cast<double>(count) * sizeof(T);
    const timer t{seconds};
    mpi.all_gather(send, count, recv, counts);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) {
    index_t total = 0;
    for (int q = 0; q < size(); ++q) total += counts[q];
    *bytes += static_cast<double>(total - counts[rank()]) * sizeof(T);
    const timer t{seconds};
    mpi.reduce_scatter(send, recv, counts);
  }
};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const index_t classes = argc > 1 ? std::atoll(argv[1]) : 200000;
  const index_t dim = argc > 2 ? std::atoll(argv[2]) : 256;
  const index_t rows = argc > 3 ? std::atoll(argv[3]) : 1024;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 20;
  double bytes = 0, comm_seconds = 0;
  int status = 0;
  try {
    using sharding = xs::class_sharding<counting_communicator>;
    sharding sh(counting_communicator{xs::mpi_communicator(MPI_COMM_WORLD), &bytes, &comm_seconds}, classes);
    xs::full_softmax<xs::fp32, xs::omp, sharding> head(sh, dim);
    const int rank = sh.rank(), ranks = sh.size();
    if (rank == 0)
      std::printf("%lld classes x %lld dims over %d ranks (%lld classes each), %lld rows per rank\n",
                  static_cast<long long>(classes), static_cast<long long>(dim), ranks,
                  static_cast<long long>(head.local_classes()), static_cast<long long>(rows));

    // Synthetic batch: 1000 classes in use, each row its class's centre plus noise.
    std::mt19937 g(11 + static_cast<unsigned>(rank));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> centre(static_cast<std::size_t>(1000 * dim));
    std::mt19937 gc(5);
    for (auto& x : centre) x = nd(gc);
    std::vector<float> hidden(static_cast<std::size_t>(rows * dim)), grad_hidden(hidden.size());
    std::vector<index_t> targets(static_cast<std::size_t>(rows));
    for (index_t i = 0; i < rows; ++i) {
      const index_t c = static_cast<index_t>(g() % 1000);
      targets[static_cast<std::size_t>(i)] = c * (classes / 1000);
      for (index_t j = 0; j < dim; ++j) hidden[i * dim + j] = centre[c * dim + j] + 0.5f * nd(g);
    }
    decltype(head)::gradient_type grad;
    double seconds = 0, comm_total = 0, fastest = 1e300;
    for (int s = 0; s < steps; ++s) {
      bytes = 0, comm_seconds = 0;
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      const float loss = head.forward_backward(xs::matrix_view<const float>(hidden.data(), rows, dim),
                                               xs::vector_view<const index_t>(targets.data(), rows),
                                               xs::matrix_view<float>(grad_hidden.data(), rows, dim), grad);
      head.apply_sgd(grad, 2.f);
      MPI_Barrier(MPI_COMM_WORLD);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) seconds += dt, comm_total += comm_seconds, fastest = std::min(fastest, dt);  // step 0 allocates
      if (rank == 0 && (s % 5 == 0 || s == steps - 1))
        std::printf("step %3d  loss %.4f  %.1f ms (%.1f ms in collectives)  %.2f MB sent by rank 0\n", s, loss,
                    1e3 * dt, 1e3 * comm_seconds, bytes / 1e6);
    }
    if (rank == 0 && steps > 1) {
      std::printf("mean step %.1f ms over %d steps; %.2f MB sent per rank per step\n", 1e3 * seconds / (steps - 1),
                  steps - 1, bytes / 1e6);
      std::printf("summary ranks=%d classes=%lld dim=%lld rows_per_rank=%lld step_ms=%.1f fastest_ms=%.1f "
                  "comm_ms=%.1f mb_per_rank=%.3f\n",
                  ranks, static_cast<long long>(classes), static_cast<long long>(dim), static_cast<long long>(rows),
                  1e3 * seconds / (steps - 1), 1e3 * fastest, 1e3 * comm_total / (steps - 1), bytes / 1e6);
    }
    if (argc > 5) {
      const std::string dir = argv[5];
      xs::save_sharded_checkpoint(dir, head);  // collective
      if (rank == 0) {
        xs::full_softmax<xs::fp32, xs::omp> whole(classes, dim);
        xs::load_sharded_checkpoint(dir, whole);
        std::printf("saved %d shard(s) to %s; rank 0 reloaded all %lld classes unsharded\n", ranks, dir.c_str(),
                    static_cast<long long>(whole.num_classes()));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_sharded_training: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
