// SPDX-License-Identifier: Apache-2.0
// callgrind driver of bench/RESULTS.md (stop 17): the HS before/after instruction counts.
// Build: g++ -std=c++17 -O2 -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include \
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/hs_callgrind_driver.cpp -lopenblas -o drv
// Run:   OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind ./drv
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
namespace xs = xsoftmax;
template <class Form> void run() {
  const xs::index_t n = 100000, d = 256, b = 1024;
  std::vector<double> freq(n);
  for (xs::index_t c = 0; c < n; ++c) freq[c] = 1.0 / (c + 1);
  auto tree = xs::runtime_tree<64>::huffman(freq, 2);
  xs::hierarchical_softmax<xs::runtime_tree<64>, xs::fp32, xs::serial, Form> head(tree, d);
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
int main() { run<xs::softmax_nodes>(); run<xs::sigmoid_nodes>(); }
