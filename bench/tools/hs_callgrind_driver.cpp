// SPDX-License-Identifier: Apache-2.0
// callgrind driver of bench/RESULTS.md (stops 17 and 18): the HS before/after instruction counts.
// Build: g++ -std=c++17 -O2 -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include \
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/hs_callgrind_driver.cpp -lopenblas -o drv
// Run:   OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind ./drv [mode]
// Modes: (none)     stop 17: Huffman d = 256, softmax nodes then sigmoid nodes, 5 forward_backward
//        softmax    the first half of that alone (softmax-node Huffman, d = 256)
//        uniform    uniform_tree<2, 317> (N = 1e5), d = 256, 5 forward_backward
//        huff100    huffman_bench's train/xsoftmax: Huffman d = 100 sigmoid, 5 x (forward_backward + apply_sgd)
//        topk1/topk5 huffman_bench's topk/xsoftmax/k: 5 top-k calls on the same head
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
namespace xs = xsoftmax;
template <class Form, class Tree> void run(Tree tree, const std::vector<double>& freq, xs::index_t d) {
  const xs::index_t b = 1024;
  xs::hierarchical_softmax<Tree, xs::fp32, xs::serial, Form> head(tree, d);
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::discrete_distribution<xs::index_t> zipf(freq.begin(), freq.end());
  std::vector<float> h(b * d), gh(b * d);
  std::vector<xs::index_t> t(b);
  for (auto& x : h) x = nd(g);
  for (auto& x : t) x = zipf(g);
  typename decltype(head)::gradient_type gw;
  float s = 0;
  for (int i = 0; i < 5; ++i)
    s += head.forward_backward(xs::matrix_view<const float>(h.data(), b, d), xs::vector_view<const xs::index_t>(t.data(), b),
                               xs::matrix_view<float>(gh.data(), b, d), gw);
  std::printf("%g\n", s);
}
std::vector<double> harmonic(xs::index_t n, double scale) {
  std::vector<double> freq(n);
  for (xs::index_t c = 0; c < n; ++c) freq[c] = scale / (c + 1);
  return freq;
}
// huffman_bench's fixture: runtime_tree<> over 1e7 / (i + 1), d = 100, sigmoid nodes.
void huffman_bench_like(int k) {
  const xs::index_t n = 100000, d = 100, b = 1024;
  const std::vector<double> freq = harmonic(n, 1e7);
  const auto tree = xs::runtime_tree<>::huffman(freq, 2);
  using head_type = xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial, xs::sigmoid_nodes>;
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::vector<float> h(b * d), gh(b * d), w(tree.num_rows() / 2 * d);
  for (auto& x : h) x = nd(g);
  std::discrete_distribution<xs::index_t> zipf(freq.begin(), freq.end());
  std::vector<xs::index_t> t(b);
  for (auto& x : t) x = zipf(g);
  for (auto& x : w) x = 0.1f * nd(g);
  head_type head(tree, xs::matrix_view<float>(w.data(), tree.num_rows() / 2, d));
  double s = 0;
  if (k == 0) {
    head_type::gradient_type gw;
    for (int i = 0; i < 5; ++i) {
      s += head.forward_backward(xs::matrix_view<const float>(h.data(), b, d),
                                 xs::vector_view<const xs::index_t>(t.data(), b), xs::matrix_view<float>(gh.data(), b, d), gw);
      head.apply_sgd(gw, 0.05f);
    }
  } else {
    std::vector<xs::index_t> cls(b * k);
    std::vector<float> lp(b * k);
    for (int i = 0; i < 5; ++i) {
      head.topk(xs::matrix_view<const float>(h.data(), b, d), k, xs::matrix_view<xs::index_t>(cls.data(), b, k),
                xs::matrix_view<float>(lp.data(), b, k));
      for (xs::index_t j = 0; j < b * k; ++j) s += lp[j] + cls[j];
    }
  }
  std::printf("%.9g\n", s);
}
int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const std::vector<double> freq = harmonic(100000, 1.0);
  if (!std::strcmp(mode, "huff100")) return huffman_bench_like(0), 0;
  if (!std::strcmp(mode, "topk1")) return huffman_bench_like(1), 0;
  if (!std::strcmp(mode, "topk5")) return huffman_bench_like(5), 0;
  if (!std::strcmp(mode, "uniform")) return run<xs::softmax_nodes>(xs::uniform_tree<2, 317>(100000), freq, 256), 0;
  run<xs::softmax_nodes>(xs::runtime_tree<64>::huffman(freq, 2), freq, 256);
  if (!std::strcmp(mode, "softmax")) return 0;
  run<xs::sigmoid_nodes>(xs::runtime_tree<64>::huffman(freq, 2), freq, 256);
}
