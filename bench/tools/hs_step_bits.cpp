// SPDX-License-Identifier: Apache-2.0
// Bitwise fingerprint of binary-Huffman hierarchical-softmax training (sigmoid nodes): 4 steps of
// forward_backward + apply_sgd + forward on Zipf targets, for 4 shapes with and without bias; prints
// an FNV hash of every loss, hidden gradient and sparse gradient (rows, values, bias values) per
// shape. Two builds of it against two include/ trees (or serial vs omp at any thread count) print
// the same hashes when the step's results are the same bits (bench/RESULTS.md, "Binary Huffman HS
// training on omp: every level in two passes, ...").
//
// g++ -std=c++17 -O2 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -I<include> -I/usr/local/cuda/include/cccl
//   -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//   bench/tools/hs_step_bits.cpp -lopenblas -o /tmp/hs_step_bits
// /tmp/hs_step_bits s          # serial;  OMP_NUM_THREADS=2 /tmp/hs_step_bits o   # omp
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>
namespace xs = xsoftmax;
using xs::index_t;
static unsigned long long mix(unsigned long long h, const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p; for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull; return h; }
template <class B> void run(index_t n, index_t d, index_t b, bool bias) {
  std::vector<double> c(n);
  for (index_t i = 0; i < n; ++i) c[i] = 1e7 / double(i + 1);
  auto tree = xs::runtime_tree<>::huffman(c, 2);
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes> head(tree, d, bias);
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::discrete_distribution<index_t> zipf(c.begin(), c.end());
  std::vector<float> h(b * d), gh(b * d), per(b);
  std::vector<index_t> t(b);
  typename decltype(head)::gradient_type gw;
  unsigned long long hs = 1469598103934665603ull;
  for (int step = 0; step < 4; ++step) {
    for (auto& x : h) x = nd(g);
    for (auto& x : t) x = zipf(g);
    float s = head.forward_backward(xs::matrix_view<const float>(h.data(), b, d), xs::vector_view<const index_t>(t.data(), b),
                                    xs::matrix_view<float>(gh.data(), b, d), gw);
    hs = mix(hs, &s, 4); hs = mix(hs, gh.data(), gh.size() * 4);
    std::vector<float> v(gw.values.begin(), gw.values.end()); std::vector<index_t> r(gw.rows.begin(), gw.rows.end());
    std::vector<float> bv(gw.bias_values.begin(), gw.bias_values.end());
    hs = mix(hs, v.data(), v.size() * 4); hs = mix(hs, r.data(), r.size() * sizeof(index_t)); hs = mix(hs, bv.data(), bv.size() * 4);
    head.apply_sgd(gw, 0.05f);
    float f = head.forward(xs::matrix_view<const float>(h.data(), b, d), xs::vector_view<const index_t>(t.data(), b));
    hs = mix(hs, &f, 4);
  }
  std::printf("n %ld d %ld b %ld bias %d: %016llx\n", (long)n, (long)d, (long)b, bias, hs);
}
int main(int argc, char** argv) {
  bool omp = argc > 1 && argv[1][0] == 'o';
  for (auto [n, d, b] : {std::tuple<index_t, index_t, index_t>{50000, 100, 1024}, {300, 17, 700}, {20, 5, 3}, {5000, 64, 2000}})
    for (bool bias : {false, true}) { if (omp) run<xs::omp>(n, d, b, bias); else run<xs::serial>(n, d, b, bias); }
}
