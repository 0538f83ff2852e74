// SPDX-License-Identifier: Apache-2.0
// Driver of bench/RESULTS.md "KNN graph builds" (issue 29): three builds of the ivf_class_probes
// KNN graph (1000 lists, nprobe 4, K = 50) over the KNN study's clustered class centres (N = 1e5,
// d = 64; bench/synthetic_classes.hpp), the vectors moved by 0.01 x Gaussian noise per coordinate
// between builds, with one knn_graph_builder: every build from scratch (refresh -1), or rebuilds
// refreshed with r k-means rounds from the last centroids (knn_build_options::refresh_iterations).
// Prints each build's wall time. Public API only, so it builds against any revision (old and new
// headers alternated compare a change).
//   g++ -std=c++17 -O2 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -Ibench -I/usr/local/cuda/include/cccl
//     -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//     bench/tools/knn_refresh_driver.cpp -lopenblas -o knn_refresh_driver
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 OPENBLAS_CORETYPE=Haswell ./knn_refresh_driver [refresh = -1]
#include "synthetic_classes.hpp"

#include <xsoftmax/selection/knn_graph.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace xs = xsoftmax;

int main(int argc, char** argv) {
  const xs::index_t n = 100000, d = 64;
  synthetic_classes::engine rng(29);
  synthetic_classes::gaussian gauss;
  auto w = synthetic_classes::clustered_centres(n, d, 50, 0.7, rng, gauss);
  xs::knn_build_options o;
  o.k = 50;
  o.method = xs::knn_build_method::ivf_class_probes;
  o.ivf.num_lists = 1000;
  o.nprobe = 4;
  o.refresh_iterations = argc > 1 ? std::atoi(argv[1]) : -1;
  xs::knn_graph_builder builder(o);
  xs::knn_graph g;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    builder.build<xs::omp>(xs::matrix_view<const float>(w.data(), n, d), g);
    std::printf("build %d: %.3f s\n", r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (auto& x : w) x += 0.01f * gauss(rng);  // the weights move a little
  }
  return 0;
}
