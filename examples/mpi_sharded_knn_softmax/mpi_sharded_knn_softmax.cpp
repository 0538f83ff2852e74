// SPDX-License-Identifier: Apache-2.0
// A class-sharded KNN softmax trained data-parallel over MPI ranks:
//
//   mpirun -np 4 ./build/examples/mpi_sharded_knn_softmax [classes=100000] [dim=64] [rows_per_rank=512]
//                                                         [steps=20] [graph_k=32]
//
// Each rank holds classes/ranks classes and its own batch of rows (synthetic: each row its class's
// centre plus noise). The exact KNN graph is built round a ring at construction (and again every
// `rebuild_every` steps): each rank's weight block passes every rank, and each rank keeps the graph
// rows of its own classes only; each step all-gathers the rows, gathers the targets' neighbour rows
// from their owners (the same active set on every rank), scores the active
// classes of the local range, combines the row statistics over the ranks, reduce-scatters
// grad_hidden and applies SGD to the local active rows. Rank 0 prints the loss, the size of the
// active set, the local gradient rows and the step time. Built when CMake finds MPI.
#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/knn_softmax.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const index_t classes = argc > 1 ? std::atoll(argv[1]) : 100000;
  const index_t dim = argc > 2 ? std::atoll(argv[2]) : 64;
  const index_t rows = argc > 3 ? std::atoll(argv[3]) : 512;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 20;
  int status = 0;
  try {
    using sharding = xs::class_sharding<xs::mpi_communicator>;
    sharding sh(xs::mpi_communicator(MPI_COMM_WORLD), classes);
    xs::knn_options options;
    options.graph.k = argc > 5 ? std::atoll(argv[5]) : 32;
    options.rebuild_every = 10;
    const auto t_build = std::chrono::steady_clock::now();
    xs::knn_softmax<xs::fp32, xs::omp, sharding> head(sh, dim, options);  // collective: builds the graph
    const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();
    const int rank = sh.rank(), ranks = sh.size();
    if (rank == 0)
      std::printf("%lld classes x %lld dims over %d ranks (%lld classes each), %lld rows per rank; graph k = %lld "
                  "(%.1f MB of graph rows on rank 0), built in %.2f s\n",
                  static_cast<long long>(classes), static_cast<long long>(dim), ranks,
                  static_cast<long long>(head.local_classes()), static_cast<long long>(rows),
                  static_cast<long long>(options.graph.k),
                  12e-6 * static_cast<double>(head.graph().held_rows() * options.graph.k),
                  build_s);

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
    const xs::matrix_view<const float> h(hidden.data(), rows, dim);
    const xs::vector_view<const index_t> t(targets.data(), rows);
    decltype(head)::gradient_type grad;
    xs::active_set active;
    for (int s = 0; s < steps; ++s) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      const float loss = head.forward_backward(h, t, xs::matrix_view<float>(grad_hidden.data(), rows, dim), grad);
      head.apply_sgd(grad, 1.f);
      head.next_step();  // collective: every rebuild_every steps, rebuilds the graph round the ring
      MPI_Barrier(MPI_COMM_WORLD);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s % 5 == 0 || s == steps - 1) {
        head.select(h, t, active);  // collective: the step's global active set, for the printout
        if (rank == 0)
          std::printf("step %3d  loss %.4f  active set %lld classes, %lld local gradient rows on rank 0  %.1f ms\n", s,
                      loss, static_cast<long long>(active.entries()), static_cast<long long>(grad.num_rows()),
                      1e3 * dt);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_sharded_knn_softmax: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
