// SPDX-License-Identifier: Apache-2.0
// Driver of bench/RESULTS.md (stop 18): builds an exact KNN graph, an IVF KNN graph and an IVF
// index (k-means over every vector + list assignment) of N random clustered class vectors through
// the public API only, so the same source builds against any revision of the library. Prints
// the wall time of each part and an FNV-1a hash of its results (graph ids and similarities;
// centroids, list ids and list vectors), so that two revisions can be compared bit for bit.
// Build (from a worktree root; one binary per revision):
//   g++ -std=c++17 -O2 -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl \
//     -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp \
//     bench/tools/knn_build_driver.cpp -lopenblas -o knn_build_driver
// Run:   OPENBLAS_NUM_THREADS=1 ./knn_build_driver <serial|omp> <exact|ivf|kmeans|all> [N=20000] [d=64] [k=32] [reps=1]
//   callgrind: OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind ./knn_build_driver serial all 4000
#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/knn_graph.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class B>
void run(const std::string& what, index_t n, index_t d, index_t k, int reps) {
  std::mt19937 g(18);
  std::normal_distribution<float> nd;
  const index_t clusters = 200;
  std::vector<float> centre(static_cast<std::size_t>(clusters * d)), w(static_cast<std::size_t>(n * d));
  for (auto& x : centre) x = nd(g);
  for (index_t i = 0; i < n; ++i) {
    const index_t c = static_cast<index_t>(g() % clusters);
    for (index_t p = 0; p < d; ++p) w[i * d + p] = centre[c * d + p] + 0.5f * nd(g);
  }
  const xs::matrix_view<const float> view(w.data(), n, d);
  for (int r = 0; r < reps; ++r) {
    if (what == "exact" || what == "all") {
      xs::knn_build_options o;
      o.k = k;
      const auto t0 = std::chrono::steady_clock::now();
      const xs::knn_graph gr = xs::build_knn_graph<B>(view, o);
      const double s = seconds_since(t0);
      std::uint64_t h = fnv(14695981039346656037ull, gr.ids().data(), gr.ids().size() * sizeof(index_t));
      h = fnv(h, gr.similarities().data(), gr.similarities().size() * sizeof(float));
      std::printf("exact  %8.3f s  hash %016llx\n", s, static_cast<unsigned long long>(h));
    }
    if (what == "ivf" || what == "all") {
      xs::knn_build_options o;
      o.k = k;
      o.method = xs::knn_build_method::ivf;
      o.nprobe = 8;
      const auto t0 = std::chrono::steady_clock::now();
      const xs::knn_graph gr = xs::build_knn_graph<B>(view, o);
      const double s = seconds_since(t0);
      std::uint64_t h = fnv(14695981039346656037ull, gr.ids().data(), gr.ids().size() * sizeof(index_t));
      h = fnv(h, gr.similarities().data(), gr.similarities().size() * sizeof(float));
      std::printf("ivf    %8.3f s  hash %016llx\n", s, static_cast<unsigned long long>(h));
    }
    if (what == "kmeans" || what == "all") {
      xs::ivf_options io;
      io.train_points = n;  // k-means over every vector
      io.metric = xs::similarity::inner_product;
      xs::ivf_index index;
      const auto t0 = std::chrono::steady_clock::now();
      index.build<B>(view, io);
      const double s = seconds_since(t0);
      const auto c = index.centroids();
      const auto v = index.list_vectors();
      std::uint64_t h = fnv(14695981039346656037ull, c.data, static_cast<std::size_t>(c.size()) * sizeof(float));
      h = fnv(h, index.list_ids().data(), index.list_ids().size() * sizeof(index_t));
      h = fnv(h, v.data, static_cast<std::size_t>(v.size()) * sizeof(float));
      std::printf("kmeans %8.3f s  hash %016llx\n", s, static_cast<unsigned long long>(h));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <serial|omp> <exact|ivf|kmeans|all> [N] [d] [k] [reps]\n", argv[0]);
    return 2;
  }
  const std::string backend = argv[1], what = argv[2];
  const index_t n = argc > 3 ? std::atol(argv[3]) : 20000, d = argc > 4 ? std::atol(argv[4]) : 64,
                k = argc > 5 ? std::atol(argv[5]) : 32;
  const int reps = argc > 6 ? std::atoi(argv[6]) : 1;
  if (backend == "omp") run<xs::omp>(what, n, d, k, reps);
  else run<xs::serial>(what, n, d, k, reps);
  return 0;
}
