// SPDX-License-Identifier: Apache-2.0
// Recall and build time of the KNN-graph builders (issue 29; bench/RESULTS.md "KNN graph builds"):
// the exact graph (the reference), then every approximate method and setting, each measured against
// it with knn_graph_recall, on the same class vectors:
//  * clustered: the KNN study's class centres (bench/synthetic_classes.hpp: clusters of 50,
//    spread 0.7, cosine about 0.67 within a cluster), the structure trained class weights take;
//  * random: independent uniform unit vectors, the hardest case for any index (no structure);
//  * file:PATH: N x d fp32 rows from a file, e.g. the KNN study's weights during training
//    (knn_accuracy_bench with XSOFTMAX_STUDY_DUMP_WEIGHTS).
// Usage: knn_graph_builds <clustered|random|file:PATH> [N=100000] [d=64] [K=50] [backend serial|omp]
//        [settings "method:lists:nprobe[:train_points[:passes]],..." where method is ivf or class; lists
//        0: the builder's default; train_points 0: k-means on min(N, 64 lists) rows; passes: the
//        neighbours-of-neighbours passes after the build, knn_refine_options::build_passes, 0: none]
// Prints one line per build and writes a JSON list to stdout's last line (prefix "json ").
// XSOFTMAX_KNN_DUMP=<prefix>: also writes the vectors (<prefix>.vectors.f32, N x d) and the exact
// graph (<prefix>.exact.i64, N x K) for FAISS beside it (bench/knn_graph_faiss.py).
// XSOFTMAX_KNN_EXACT=<prefix>: reads that exact graph instead of building it (same data, N, K).
// XSOFTMAX_KNN_SAMPLE=<q>: instead of the exact graph, the exact neighbours of q seeded random
// classes only (brute force over all N by GEMM: N = 1e6 in seconds, where the whole exact graph
// takes an hour here), and each method's recall over those q rows; the dump then holds the q
// rows' exact lists (<prefix>.exact.i64, q x K) and their ids (<prefix>.sample.i64).
//   OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ./build/bench/knn_graph_builds clustered
#include "synthetic_classes.hpp"

#include <xsoftmax/selection/knn_graph.hpp>

#include <xsoftmax/detail/host/gemm.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct setting {
  xs::knn_build_method method;
  index_t lists, nprobe, train, passes;
};

std::vector<setting> parse_settings(const std::string& text) {
  std::vector<setting> out;
  std::stringstream all(text);
  std::string item;
  while (std::getline(all, item, ',')) {
    std::vector<std::string> f;
    std::stringstream fields(item);
    for (std::string x; std::getline(fields, x, ':');) f.push_back(x);
    if (f.size() < 3 || f.size() > 5 || (f[0] != "class" && f[0] != "ivf")) {
      std::fprintf(stderr, "knn_graph_builds: a setting is method:lists:nprobe[:train_points[:passes]], got '%s'\n",
                   item.c_str());
      std::exit(2);
    }
    out.push_back({f[0] == "class" ? xs::knn_build_method::ivf_class_probes : xs::knn_build_method::ivf,
                   std::atol(f[1].c_str()), std::atol(f[2].c_str()), f.size() >= 4 ? std::atol(f[3].c_str()) : 0,
                   f.size() == 5 ? std::atol(f[4].c_str()) : 0});
  }
  return out;
}

/// The exact graph: built, or read from `XSOFTMAX_KNN_EXACT`'s <prefix>.exact.i64 (a dump of the
/// same data, N and K by an earlier run) to skip the exact build's half minute; then the "% of
/// exact" column is against the read time, and meaningless: take the exact time from the dumping run.
template <class B>
xs::knn_graph exact_graph(xs::matrix_view<const float> w, const xs::knn_build_options& o) {
  const char* prefix = std::getenv("XSOFTMAX_KNN_EXACT");
  if (!prefix || !*prefix) return xs::build_knn_graph<B>(w, o);
  const std::string path = std::string(prefix) + ".exact.i64";
  std::vector<index_t> ids(static_cast<std::size_t>(w.rows * o.k));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  const bool read = f && std::fread(ids.data(), sizeof(index_t), ids.size(), f) == ids.size() && std::fgetc(f) == EOF;
  if (f) std::fclose(f);
  if (!read) {
    std::fprintf(stderr, "knn_graph_builds: %s is not an N x K graph of this run (N = %lld, K = %lld)\n", path.c_str(),
                 static_cast<long long>(w.rows), static_cast<long long>(o.k));
    std::exit(1);
  }
  return xs::knn_graph::from_lists(w.rows, w.cols, o.k, std::move(ids));
}

/// The sampled reference: q seeded distinct rows, ascending, and each one's exact K nearest by
/// cosine over all N rows (ties to the smaller id, as the builders order them), q x K.
struct sampled_exact {
  std::vector<index_t> rows, ids;
};

sampled_exact exact_of_sample(xs::matrix_view<const float> w, index_t k, index_t q) {
  const index_t n = w.rows, d = w.cols;
  std::vector<float> unit(static_cast<std::size_t>(n * d));
  for (index_t r = 0; r < n; ++r) {
    double s = 0;
    for (index_t p = 0; p < d; ++p) s += static_cast<double>(w.row(r)[p]) * w.row(r)[p];
    const float inv = s > 0 ? static_cast<float>(1 / std::sqrt(s)) : 0.f;
    for (index_t p = 0; p < d; ++p) unit[static_cast<std::size_t>(r * d + p)] = w.row(r)[p] * inv;
  }
  sampled_exact out;
  std::vector<index_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), index_t(0));
  std::mt19937_64 rng(2029);
  std::shuffle(all.begin(), all.end(), rng);
  out.rows.assign(all.begin(), all.begin() + std::min(q, n));
  std::sort(out.rows.begin(), out.rows.end());
  q = static_cast<index_t>(out.rows.size());
  std::vector<float> queries(static_cast<std::size_t>(q * d)), s(static_cast<std::size_t>(q * n));
  for (index_t i = 0; i < q; ++i)
    std::copy_n(unit.data() + out.rows[static_cast<std::size_t>(i)] * d, d, queries.data() + i * d);
  xs::detail::host::gemm_args g;  // S = Q U^T
  g.op_b = xs::detail::host::op::transpose;
  g.m = q;
  g.n = n;
  g.k = d;
  g.a = queries.data();
  g.lda = d;
  g.b = unit.data();
  g.ldb = d;
  g.c = s.data();
  g.ldc = n;
  xs::detail::host::gemm(g);
  out.ids.resize(static_cast<std::size_t>(q * k));
  std::vector<index_t> order(static_cast<std::size_t>(n));
  for (index_t i = 0; i < q; ++i) {
    const float* row = s.data() + i * n;
    std::iota(order.begin(), order.end(), index_t(0));
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](index_t a, index_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::copy_n(order.begin(), k, out.ids.begin() + i * k);
  }
  return out;
}

/// Mean over the sampled rows of |approx row & exact row| / K.
double sampled_recall(const xs::knn_graph& g, const sampled_exact& e, index_t k) {
  double total = 0;
  for (std::size_t i = 0; i < e.rows.size(); ++i) {
    std::vector<index_t> a(g.neighbors(e.rows[i]), g.neighbors(e.rows[i]) + k);
    std::vector<index_t> x(e.ids.begin() + static_cast<std::ptrdiff_t>(i * k),
                           e.ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * k));
    std::sort(a.begin(), a.end());
    std::sort(x.begin(), x.end());
    std::vector<index_t> both;
    std::set_intersection(a.begin(), a.end(), x.begin(), x.end(), std::back_inserter(both));
    total += static_cast<double>(both.size()) / k;
  }
  return e.rows.empty() ? 1.0 : total / e.rows.size();
}

template <class B>
void run(const std::string& data, index_t n, index_t d, index_t k, const std::vector<setting>& settings) {
  synthetic_classes::engine rng(29);
  synthetic_classes::gaussian gauss;
  std::vector<float> w;
  if (data == "random") {
    w.resize(static_cast<std::size_t>(n * d));
    for (index_t i = 0; i < n; ++i) synthetic_classes::random_unit(w.data() + i * d, d, rng, gauss);
  } else if (data.rfind("file:", 0) == 0) {  // N x d fp32 rows, e.g. a training run's weights
    w.resize(static_cast<std::size_t>(n * d));
    std::FILE* f = std::fopen(data.c_str() + 5, "rb");
    const bool read = f && std::fread(w.data(), sizeof(float), w.size(), f) == w.size() && std::fgetc(f) == EOF;
    if (f) std::fclose(f);
    if (!read) {
      std::fprintf(stderr, "knn_graph_builds: %s does not hold %lld x %lld floats\n", data.c_str() + 5,
                   static_cast<long long>(n), static_cast<long long>(d));
      std::exit(1);
    }
  } else {
    w = synthetic_classes::clustered_centres(n, d, 50, 0.7, rng, gauss);
  }
  const xs::matrix_view<const float> view(w.data(), n, d);
  xs::knn_build_options exact_options;
  exact_options.k = k;
  const char* sample_env = std::getenv("XSOFTMAX_KNN_SAMPLE");
  const index_t sample = sample_env && *sample_env ? std::atol(sample_env) : 0;
  auto t0 = std::chrono::steady_clock::now();
  sampled_exact sampled;
  xs::knn_graph exact;
  if (sample > 0) sampled = exact_of_sample(view, k, sample);
  else exact = exact_graph<B>(view, exact_options);
  const double exact_s = seconds_since(t0);
  const auto recall_of = [&](const xs::knn_graph& g) {
    return sample > 0 ? sampled_recall(g, sampled, k) : xs::knn_graph_recall(g, exact);
  };
  const char* prefix = std::getenv("XSOFTMAX_KNN_DUMP");
  if (prefix && *prefix) {  // for bench/knn_graph_faiss.py
    const std::string p = prefix;
    std::FILE* f = std::fopen((p + ".vectors.f32").c_str(), "wb");
    std::FILE* g = std::fopen((p + ".exact.i64").c_str(), "wb");
    std::FILE* r = sample > 0 ? std::fopen((p + ".sample.i64").c_str(), "wb") : nullptr;
    if (!f || !g || (sample > 0 && !r)) {
      std::fprintf(stderr, "knn_graph_builds: cannot write %s.*\n", prefix);
      std::exit(1);
    }
    std::fwrite(w.data(), sizeof(float), w.size(), f);
    const std::vector<index_t>& ids = sample > 0 ? sampled.ids : exact.ids();
    std::fwrite(ids.data(), sizeof(index_t), ids.size(), g);
    if (r) std::fwrite(sampled.rows.data(), sizeof(index_t), sampled.rows.size(), r);
    std::fclose(f);
    std::fclose(g);
    if (r) std::fclose(r);
  }
  std::printf("%-10s N=%-8lld d=%-4lld K=%-4lld exact%-22s %8.3f s  recall 1\n", data.c_str(),
              static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(k),
              sample > 0 ? (" (" + std::to_string(sampled.rows.size()) + " rows)").c_str() : "", exact_s);
  std::string json = "[{\"data\":\"" + data + "\",\"n\":" + std::to_string(n) + ",\"method\":\"exact\",\"seconds\":" +
                     std::to_string(exact_s) + ",\"recall\":1,\"sampled_rows\":" +
                     std::to_string(sampled.rows.size()) + "}";
  for (const setting& s : settings) {
    xs::knn_build_options o;
    o.k = k;
    o.method = s.method;
    o.ivf.num_lists = s.lists;
    o.nprobe = s.nprobe;
    o.ivf.train_points = s.train;
    o.refine.build_passes = s.passes;
    t0 = std::chrono::steady_clock::now();
    const xs::knn_graph g = xs::build_knn_graph<B>(view, o);
    const double sec = seconds_since(t0);
    const double recall = recall_of(g);
    const char* name = s.method == xs::knn_build_method::ivf ? "ivf (list probes)" : "ivf_class_probes";
    std::printf("%-10s N=%-8lld d=%-4lld K=%-4lld %-17s lists %-5lld nprobe %-4lld train %-7lld passes %lld %8.3f s  "
                "recall %.4f  (%.1f %% of exact)\n",
                data.c_str(), static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(k), name,
                static_cast<long long>(s.lists), static_cast<long long>(s.nprobe), static_cast<long long>(s.train),
                static_cast<long long>(s.passes), sec, recall, 100 * sec / exact_s);
    std::fflush(stdout);
    json += ",{\"data\":\"" + data + "\",\"n\":" + std::to_string(n) + ",\"method\":\"" + name +
            "\",\"lists\":" + std::to_string(s.lists) + ",\"nprobe\":" + std::to_string(s.nprobe) +
            ",\"train_points\":" + std::to_string(s.train) + ",\"refine_passes\":" + std::to_string(s.passes) +
            ",\"seconds\":" + std::to_string(sec) + ",\"recall\":" + std::to_string(recall) + "}";
  }
  std::printf("json %s]\n", json.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "clustered";
  if (data != "clustered" && data != "random" && data.rfind("file:", 0) != 0) {
    std::fprintf(stderr, "usage: %s <clustered|random|file:PATH> [N] [d] [K] [serial|omp] [settings]\n", argv[0]);
    return 2;
  }
  const index_t n = argc > 2 ? std::atol(argv[2]) : 100000, d = argc > 3 ? std::atol(argv[3]) : 64,
                k = argc > 4 ? std::atol(argv[4]) : 50;
  const std::string backend = argc > 5 ? argv[5] : "omp";
  const auto settings = parse_settings(argc > 6 ? argv[6]
                                                : "ivf:0:8,ivf:0:32,class:0:4,class:0:8,class:0:16,class:0:32,"
                                                  "class:1000:16,class:1000:32,class:1000:64");
  if (backend == "serial") run<xs::serial>(data, n, d, k, settings);
  else run<xs::omp>(data, n, d, k, settings);
  return 0;
}
