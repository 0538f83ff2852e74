// SPDX-License-Identifier: Apache-2.0
// Recall and build time of the KNN-graph builders (issue 29; bench/RESULTS.md "KNN graph builds"):
// the exact graph (the reference), then every approximate method and setting, each measured against
// it with knn_graph_recall, on the same class vectors:
//  * clustered: the KNN study's class centres (bench/synthetic_classes.hpp: clusters of 50,
//    spread 0.7, cosine about 0.67 within a cluster), the structure trained class weights take;
//  * random: independent uniform unit vectors, the hardest case for any index (no structure).
// Usage: knn_graph_builds <clustered|random> [N=100000] [d=64] [K=50] [backend serial|omp]
//        [settings "method:lists:nprobe[:train_points],..." where method is ivf or class; lists 0: the
//        builder's default; train_points 0: k-means on min(N, 64 lists) rows]
// Prints one line per build and writes a JSON list to stdout's last line (prefix "json ").
// XSOFTMAX_KNN_DUMP=<prefix>: also writes the vectors (<prefix>.vectors.f32, N x d) and the exact
// graph (<prefix>.exact.i64, N x K) for FAISS beside it (bench/knn_graph_faiss.py).
// XSOFTMAX_KNN_EXACT=<prefix>: reads that exact graph instead of building it (same data, N, K).
//   OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ./build/bench/knn_graph_builds clustered
#include "synthetic_classes.hpp"

#include <xsoftmax/selection/knn_graph.hpp>

#include <chrono>
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
  index_t lists, nprobe, train;
};

std::vector<setting> parse_settings(const std::string& text) {
  std::vector<setting> out;
  std::stringstream all(text);
  std::string item;
  while (std::getline(all, item, ',')) {
    std::vector<std::string> f;
    std::stringstream fields(item);
    for (std::string x; std::getline(fields, x, ':');) f.push_back(x);
    if (f.size() < 3 || f.size() > 4 || (f[0] != "class" && f[0] != "ivf")) {
      std::fprintf(stderr, "knn_graph_builds: a setting is method:lists:nprobe[:train_points], got '%s'\n",
                   item.c_str());
      std::exit(2);
    }
    out.push_back({f[0] == "class" ? xs::knn_build_method::ivf_class_probes : xs::knn_build_method::ivf,
                   std::atol(f[1].c_str()), std::atol(f[2].c_str()), f.size() == 4 ? std::atol(f[3].c_str()) : 0});
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

template <class B>
void run(const std::string& data, index_t n, index_t d, index_t k, const std::vector<setting>& settings) {
  synthetic_classes::engine rng(29);
  synthetic_classes::gaussian gauss;
  std::vector<float> w;
  if (data == "random") {
    w.resize(static_cast<std::size_t>(n * d));
    for (index_t i = 0; i < n; ++i) synthetic_classes::random_unit(w.data() + i * d, d, rng, gauss);
  } else {
    w = synthetic_classes::clustered_centres(n, d, 50, 0.7, rng, gauss);
  }
  const xs::matrix_view<const float> view(w.data(), n, d);
  xs::knn_build_options exact_options;
  exact_options.k = k;
  auto t0 = std::chrono::steady_clock::now();
  const xs::knn_graph exact = exact_graph<B>(view, exact_options);
  const double exact_s = seconds_since(t0);
  const char* prefix = std::getenv("XSOFTMAX_KNN_DUMP");
  if (prefix && *prefix) {  // for bench/knn_graph_faiss.py
    const std::string p = prefix;
    std::FILE* f = std::fopen((p + ".vectors.f32").c_str(), "wb");
    std::FILE* g = std::fopen((p + ".exact.i64").c_str(), "wb");
    if (!f || !g) {
      std::fprintf(stderr, "knn_graph_builds: cannot write %s.*\n", prefix);
      std::exit(1);
    }
    std::fwrite(w.data(), sizeof(float), w.size(), f);
    std::fwrite(exact.ids().data(), sizeof(index_t), exact.ids().size(), g);
    std::fclose(f);
    std::fclose(g);
  }
  std::printf("%-10s N=%-8lld d=%-4lld K=%-4lld exact                      %8.3f s  recall 1\n", data.c_str(),
              static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(k), exact_s);
  std::string json = "[{\"data\":\"" + data + "\",\"n\":" + std::to_string(n) + ",\"method\":\"exact\",\"seconds\":" +
                     std::to_string(exact_s) + ",\"recall\":1}";
  for (const setting& s : settings) {
    xs::knn_build_options o;
    o.k = k;
    o.method = s.method;
    o.ivf.num_lists = s.lists;
    o.nprobe = s.nprobe;
    o.ivf.train_points = s.train;
    t0 = std::chrono::steady_clock::now();
    const xs::knn_graph g = xs::build_knn_graph<B>(view, o);
    const double sec = seconds_since(t0);
    const double recall = xs::knn_graph_recall(g, exact);
    const char* name = s.method == xs::knn_build_method::ivf ? "ivf (list probes)" : "ivf_class_probes";
    std::printf("%-10s N=%-8lld d=%-4lld K=%-4lld %-17s lists %-5lld nprobe %-4lld train %-7lld %8.3f s  recall %.4f  "
                "(%.1f %% of exact)\n",
                data.c_str(), static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(k), name,
                static_cast<long long>(s.lists), static_cast<long long>(s.nprobe), static_cast<long long>(s.train), sec,
                recall, 100 * sec / exact_s);
    std::fflush(stdout);
    json += ",{\"data\":\"" + data + "\",\"n\":" + std::to_string(n) + ",\"method\":\"" + name +
            "\",\"lists\":" + std::to_string(s.lists) + ",\"nprobe\":" + std::to_string(s.nprobe) +
            ",\"train_points\":" + std::to_string(s.train) +
            ",\"seconds\":" + std::to_string(sec) + ",\"recall\":" + std::to_string(recall) + "}";
  }
  std::printf("json %s]\n", json.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "clustered";
  if (data != "clustered" && data != "random") {
    std::fprintf(stderr, "usage: %s <clustered|random> [N] [d] [K] [serial|omp] [settings]\n", argv[0]);
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
