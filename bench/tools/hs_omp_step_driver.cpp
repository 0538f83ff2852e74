// SPDX-License-Identifier: Apache-2.0
// One binary-Huffman hierarchical-softmax training step (forward_backward + apply_sgd) timed on
// the serial or omp backend: fastText's output layer (50,000 Zipf classes 1e7 / (i + 1), sigmoid
// nodes, d = 100, batch 1024). With bench/tools/omp_region_count.c it counts the parallel regions
// of a step (bench/RESULTS.md, "Binary Huffman HS against fastText's own C++").
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//   bench/tools/hs_omp_step_driver.cpp -lopenblas -o /tmp/hs_omp_step
// /tmp/hs_omp_step s|o [steps]      # s: serial, o: omp (OMP_NUM_THREADS threads); prints ms/step
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <omp.h>
namespace xs = xsoftmax;
using xs::index_t;
template <class B>
__attribute__((noinline)) float measured(xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes>& head,
  const std::vector<float>& h, const std::vector<index_t>& t, std::vector<float>& gh,
  typename xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes>::gradient_type& g, index_t b, index_t d) {
  float s = head.forward_backward(xs::matrix_view<const float>(h.data(), b, d), xs::vector_view<const index_t>(t.data(), b),
                                  xs::matrix_view<float>(gh.data(), b, d), g);
  head.apply_sgd(g, 0.05f);
  return s;
}
template <class B> void run(int steps) {
  const index_t n = 50000, d = 100, b = 1024;
  std::vector<double> c(n);
  for (index_t i = 0; i < n; ++i) c[i] = 1e7 / double(i + 1);
  auto tree = xs::runtime_tree<>::huffman(c, 2);
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes> head(tree, d);
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::discrete_distribution<index_t> zipf(c.begin(), c.end());
  std::vector<float> h(b * d), gh(b * d);
  std::vector<index_t> t(b);
  for (auto& x : h) x = nd(g);
  for (auto& x : t) x = zipf(g);
  typename decltype(head)::gradient_type gw;
  float s = measured<B>(head, h, t, gh, gw, b, d);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) s += measured<B>(head, h, t, gh, gw, b, d);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  std::printf("%s threads %d: %.3f ms/step (%.0f samples/s) loss %g\n", std::is_same_v<B, xs::omp> ? "omp" : "serial",
              std::is_same_v<B, xs::omp> ? omp_get_max_threads() : 1, ms, b / ms * 1e3, s);
}
int main(int argc, char** argv) {
  int steps = argc > 2 ? std::atoi(argv[2]) : 200;
  if (argc > 1 && argv[1][0] == 's') run<xs::serial>(steps); else run<xs::omp>(steps);
}
