// SPDX-License-Identifier: Apache-2.0
// Recall and time of neighbours-of-neighbours passes (NN-descent's local join in its "pull" form;
// since stop 42 the library's `detail::refine_knn_graph`, detail/selection/knn_refine.hpp: class c
// scores the first `sample` neighbours of each of its first `fanout` neighbours and keeps its K
// best; each pass reads the last graph and writes a new one) after an ivf_class_probes build,
// against a dumped exact graph (bench/knn_graph_builds.cpp with XSOFTMAX_KNN_DUMP=<prefix>:
// <prefix>.vectors.f32 and <prefix>.exact.i64).
//   g++ -std=c++17 -O2 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -I include -I /usr/local/cuda/include/cccl \
//     -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp \
//     bench/tools/knn_refine_driver.cpp -lopenblas -o /tmp/knn_refine_driver
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/knn_refine_driver <prefix> N d K lists nprobe fanout sample passes [old|-] [reverse]
// With [old] (N x d fp32, e.g. the KNN study's weights 50 steps earlier): the IVF graph is built from
// those, and the passes refresh it with the prefix's vectors -- a refresh against a rebuild. With
// [reverse] R > 0: each pass also takes up to R reverse neighbours per class (classes that have it
// among their first `fanout`) and their first `sample` neighbours as candidates (NN-descent's
// reverse half; the lists, the smallest ids first, are built before each pass).
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/selection/knn_refine.hpp>
#include <xsoftmax/selection/knn_graph.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

template <class T>
std::vector<T> read_all(const std::string& path, std::size_t count) {
  std::vector<T> v(count);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(v.data(), sizeof(T), count, f) != count) {
    std::fprintf(stderr, "cannot read %zu values from %s\n", count, path.c_str());
    std::exit(1);
  }
  std::fclose(f);
  return v;
}

int main(int argc, char** argv) {
  if (argc < 10) {
    std::fprintf(stderr, "usage: %s prefix N d K lists nprobe fanout sample passes [old vectors]\n", argv[0]);
    return 2;
  }
  const std::string prefix = argv[1];
  const index_t n = std::atol(argv[2]), d = std::atol(argv[3]), k = std::atol(argv[4]), lists = std::atol(argv[5]),
                nprobe = std::atol(argv[6]), fanout = std::atol(argv[7]), sample = std::atol(argv[8]),
                passes = std::atol(argv[9]);
  std::vector<float> w = read_all<float>(prefix + ".vectors.f32", static_cast<std::size_t>(n * d));
  const xs::knn_graph exact = xs::knn_graph::from_lists(n, d, k, read_all<index_t>(prefix + ".exact.i64", n * k));
  const auto t0 = std::chrono::steady_clock::now();
  xs::knn_build_options o;
  o.k = k;
  o.method = xs::knn_build_method::ivf_class_probes;
  o.ivf.num_lists = lists;
  o.nprobe = nprobe;
  const std::vector<float> old =
      argc > 10 && std::string(argv[10]) != "-" ? read_all<float>(argv[10], static_cast<std::size_t>(n * d)) : w;
  const index_t reverse = argc > 11 ? std::atol(argv[11]) : 0;  // reverse neighbours per class (0: none)
  const xs::knn_graph g = xs::build_knn_graph<xs::omp>(xs::matrix_view<const float>(old.data(), n, d), o);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("ivf_class_probes %lld x %lld: %.3f s, recall %.4f\n", static_cast<long long>(lists),
              static_cast<long long>(nprobe), s, xs::knn_graph_recall(g, exact));
  for (index_t r = 0; r < n; ++r) {  // unit rows: cosine as inner product
    double q = 0;
    for (index_t p = 0; p < d; ++p) q += double(w[r * d + p]) * w[r * d + p];
    for (index_t p = 0; p < d; ++p) w[r * d + p] = static_cast<float>(w[r * d + p] / std::sqrt(q));
  }
  std::vector<index_t> ids = g.ids();
  std::vector<float> sims = g.similarities();
  const xs::backend_resources<xs::omp> res{};
  const xs::detail::execution<xs::omp> ex{res};
  for (index_t p = 1; p <= passes; ++p) {
    const auto t1 = std::chrono::steady_clock::now();
    xs::detail::refine_knn_graph(ex, xs::matrix_view<const float>(w.data(), n, d), ids.data(), sims.data(), k, fanout,
                                 sample, reverse, 1);
    const double ps = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    s += ps;
    std::printf("pass %lld (fanout %lld, sample %lld): %.3f s, total %.3f s, recall %.4f\n", static_cast<long long>(p),
                static_cast<long long>(fanout), static_cast<long long>(sample), ps, s,
                xs::knn_graph_recall(xs::knn_graph::from_lists(n, d, k, ids), exact));
    std::fflush(stdout);
  }
  return 0;
}
