// SPDX-License-Identifier: Apache-2.0
// How much memory each sparse optimizer's state takes, measured against what its documentation
// states (`state_bytes(rows, dim, with_bias)`): the resident-set growth (Linux /proc/self/status
// VmRSS) of constructing the optimizer, whose constructor writes every state value, for a
// rows x dim layer with a bias, in fp32 and bf16 state. Then one step on a gradient touching 1 % of
// the rows, to show that a step allocates nothing of the layer's size. A plain program (no Google
// Benchmark: this measures bytes, not time); results in bench/RESULTS.md.
//
//   cmake --build build --target optimizer_state_memory && ./build/bench/optimizer_state_memory [rows] [dim]

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/optim/large_batch.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

/// The resident set size in bytes.
double rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return 0;
}

/// A gradient over every 100th row of a rows x dim layer (with bias), values 1e-3.
xs::sparse_gradient<xs::serial, float> one_percent(index_t rows, index_t dim) {
  xs::sparse_gradient<xs::serial, float> g;
  g.dim = dim;
  for (index_t r = 0; r < rows; r += 100) g.rows.push_back(r);
  g.values.assign(g.rows.size() * static_cast<std::size_t>(dim), 1e-3f);
  g.bias_values.assign(g.rows.size(), 1e-3f);
  return g;
}

template <class Optimizer>
void measure(const char* name, const char* state, index_t rows, index_t dim, std::vector<float>& w,
             std::vector<float>& b, const xs::sparse_gradient<xs::serial, float>& g) {
  const double before = rss_bytes();
  Optimizer opt(rows, dim, /*with_bias=*/true);
  const double built = rss_bytes();
  opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), g, 0.01f);
  const double stepped = rss_bytes();
  const double stated = static_cast<double>(Optimizer::state_bytes(rows, dim, true));
  std::printf("| %-15s | %-5s | %10.1f | %10.1f | %6.3f | %+8.2f |\n", name, state, stated / (1 << 20),
              (built - before) / (1 << 20), (built - before) / stated, (stepped - built) / (1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  const index_t rows = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  const index_t dim = argc > 2 ? std::atoll(argv[2]) : 128;
  std::vector<float> w(static_cast<std::size_t>(rows * dim), 0.f), b(static_cast<std::size_t>(rows), 0.f);
  const auto g = one_percent(rows, dim);
  std::printf("rows = %lld, dim = %lld (weights: %.1f MiB fp32), bias, serial backend; a step touches %zu rows\n\n",
              static_cast<long long>(rows), static_cast<long long>(dim), rows * dim * 4.0 / (1 << 20), g.rows.size());
  std::printf("| optimizer       | state | stated MiB | RSS growth MiB | ratio | step growth MiB |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  measure<xs::sparse_momentum<xs::serial, float>>("sparse_momentum", "fp32", rows, dim, w, b, g);
  measure<xs::sparse_momentum<xs::serial, __nv_bfloat16>>("sparse_momentum", "bf16", rows, dim, w, b, g);
  measure<xs::sparse_adagrad<xs::serial, float>>("sparse_adagrad", "fp32", rows, dim, w, b, g);
  measure<xs::sparse_adam<xs::serial, float>>("sparse_adam", "fp32", rows, dim, w, b, g);
  measure<xs::sparse_adam<xs::serial, __nv_bfloat16>>("sparse_adam", "bf16", rows, dim, w, b, g);
  measure<xs::sparse_lamb<xs::serial, float>>("sparse_lamb", "fp32", rows, dim, w, b, g);
  measure<xs::sparse_lars<xs::serial, float>>("sparse_lars", "fp32", rows, dim, w, b, g);
  return 0;
}
