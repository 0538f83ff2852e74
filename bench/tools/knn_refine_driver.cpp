// SPDX-License-Identifier: Apache-2.0
// Recall and time of neighbours-of-neighbours passes (NN-descent's local join in its "pull" form,
// below: class c scores the first `sample` neighbours of each of its first `fanout` neighbours and
// keeps its K best; each pass reads the last graph and writes a new one) after an ivf_class_probes
// build, against a dumped exact graph (bench/knn_graph_builds.cpp with
// XSOFTMAX_KNN_DUMP=<prefix>: <prefix>.vectors.f32 and <prefix>.exact.i64).
//   g++ -std=c++17 -O2 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -I include -I /usr/local/cuda/include/cccl \
//     -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp \
//     bench/tools/knn_refine_driver.cpp -lopenblas -o /tmp/knn_refine_driver
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/knn_refine_driver <prefix> N d K lists nprobe fanout sample passes [old|-] [reverse]
// With [old] (N x d fp32, e.g. the KNN study's weights 50 steps earlier): the IVF graph is built from
// those, and the passes refresh it with the prefix's vectors -- a refresh against a rebuild. With
// [reverse] R > 0: each pass also takes up to R reverse neighbours per class (classes that have it
// among their first `fanout`) and their first `sample` neighbours as candidates (NN-descent's
// reverse half; the lists are built serially, in id order, before each pass).
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/selection/knn_graph.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

namespace xsoftmax::detail {  // the pass, kept here: measured, not adopted (bench/RESULTS.md)

/// Class c's refined row (see the file comment): from old row c (ids, -1 past its entries; rescored) and the two-hop candidates, its K best, best first (ties: smaller id), into
/// row c of new_ids / new_sims. `x`: the rows the similarities are inner products of (unit rows
/// under cosine), in id order.
struct refine_knn_row {
  matrix_view<const float> x;
  const index_t* old_ids;
  index_t k, fanout, sample;
  index_t* new_ids;
  float* new_sims;
  /// Optional reverse neighbours (NN-descent's other half): row c lists up to `rev_width` classes
  /// that have c among their first `fanout` neighbours (-1 past them); each is a candidate, and so
  /// are the first `sample` neighbours of each.
  const index_t* rev = nullptr;
  index_t rev_width = 0;

  /// Whether id m is among the heap's entries (a linear scan: K is small, and the scan runs only
  /// for a candidate that would enter).
  XSOFTMAX_HD static bool holds(const index_t* hi, index_t n, index_t m) {
    for (index_t i = 0; i < n; ++i)
      if (hi[i] == m) return true;
    return false;
  }

  XSOFTMAX_HD void operator()(index_t c) const {
    const index_t* row = old_ids + c * k;
    topk_heap heap{new_sims + c * k, new_ids + c * k, 0};
    const float* q = x.row(c);
    for (index_t j = 0; j < k; ++j)  // rescored: the rows may have moved since the graph was built
      if (row[j] >= 0) heap.offer(dot_row8(q, x.row(row[j]), x.cols), row[j], k);
    for (index_t a = 0; a < fanout && a < k; ++a) {
      const index_t r = row[a];
      if (r < 0) continue;
      for (index_t b = 0; b < sample && b < k; ++b) {
        const index_t m = old_ids[r * k + b];
        if (m < 0 || holds(heap.hi, heap.n, m)) continue;  // before the dot: skips a row's gather
        const float v = dot_row8(q, x.row(m), x.cols);
        heap.offer(v, m, k);
      }
    }
    for (index_t a = 0; a < rev_width; ++a) {
      const index_t r = rev[c * rev_width + a];
      if (r < 0) break;
      if (!holds(heap.hi, heap.n, r)) heap.offer(dot_row8(q, x.row(r), x.cols), r, k);
      for (index_t b = 0; b < sample && b < k; ++b) {
        const index_t m = old_ids[r * k + b];
        if (m < 0 || m == c || holds(heap.hi, heap.n, m)) continue;
        heap.offer(dot_row8(q, x.row(m), x.cols), m, k);
      }
    }
    heap.sort_best_first();
    for (index_t j = heap.n; j < k; ++j) new_ids[c * k + j] = -1, new_sims[c * k + j] = -INFINITY;
  }
};

/// `passes` refinement passes of the graph (ids, sims: N x k in the execution's memory, updated in
/// place; `scratch_ids` / `scratch_sims` hold the other copy, N x k each).
template <class Ex>
void refine_knn_graph(const Ex& ex, matrix_view<const float> x, index_t* ids, float* sims, index_t k, index_t fanout,
                      index_t sample, index_t passes, index_t* scratch_ids, float* scratch_sims,
                      index_t rev_width = 0) {
  const index_t n = x.rows;
  std::vector<index_t> rev(static_cast<std::size_t>(n * rev_width), -1), count(static_cast<std::size_t>(n), 0);
  for (index_t p = 0; p < passes; ++p) {
    if (rev_width > 0) {  // reverse lists of the current graph, classes in id order
      std::fill(rev.begin(), rev.end(), -1);
      std::fill(count.begin(), count.end(), 0);
      for (index_t c = 0; c < n; ++c)
        for (index_t j = 0; j < fanout && j < k; ++j) {
          const index_t r = ids[c * k + j];
          if (r >= 0 && count[r] < rev_width) rev[r * rev_width + count[r]++] = c;
        }
    }
    refine_knn_row step{x, ids, k, fanout, sample, scratch_ids, scratch_sims};
    step.rev = rev.data();
    step.rev_width = rev_width;
    parallel_for(ex, x.rows, step);
    thrust::copy(as_execution(ex).policy(), scratch_ids, scratch_ids + x.rows * k, ids);
    thrust::copy(as_execution(ex).policy(), scratch_sims, scratch_sims + x.rows * k, sims);
  }
}

}  // namespace xsoftmax::detail

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
  std::vector<index_t> ids = g.ids(), sid(ids.size());
  std::vector<float> sims = g.similarities(), ssim(sims.size());
  const xs::backend_resources<xs::omp> res{};
  const xs::detail::execution<xs::omp> ex{res};
  for (index_t p = 1; p <= passes; ++p) {
    const auto t1 = std::chrono::steady_clock::now();
    xs::detail::refine_knn_graph(ex, xs::matrix_view<const float>(w.data(), n, d), ids.data(), sims.data(), k, fanout,
                                 sample, 1, sid.data(), ssim.data(), reverse);
    const double ps = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    s += ps;
    std::printf("pass %lld (fanout %lld, sample %lld): %.3f s, total %.3f s, recall %.4f\n", static_cast<long long>(p),
                static_cast<long long>(fanout), static_cast<long long>(sample), ps, s,
                xs::knn_graph_recall(xs::knn_graph::from_lists(n, d, k, ids), exact));
    std::fflush(stdout);
  }
  return 0;
}
