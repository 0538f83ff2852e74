// SPDX-License-Identifier: Apache-2.0
// One hierarchical-softmax training step (forward_backward) over a two-level uniform tree of
// softmax nodes (uniform_tree<2, 317>: 317 x 317 >= 1e5; every node a dense softmax through the
// GEMMs) on the omp backend, in C++ alone, the full softmax's shape (d = 256, B = 1,024; N default
// 1e5, at most 100,489): whether a change to the dense softmax moved the hierarchical softmax's
// step too (bench/RESULTS.md, "Full softmax on the CPU: the backward from the kept exponentials").
// Prints each step and the best and mean after the first.
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/hs_uniform_step.cpp -lopenblas
//   -o /tmp/hs_uniform_step
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/hs_uniform_step [classes] [steps]
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include "step_timing.hpp"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  const index_t n = argc > 1 ? std::atol(argv[1]) : 100000, d = 256, b = 1024;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 1 || n > 317 * 317 || steps < 2) {
    std::fprintf(stderr, "usage: %s [classes in 1..100489] [steps >= 2]\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  using tree = xs::uniform_tree<2, 317>;
  using head_type = xs::hierarchical_softmax<tree, xs::fp32, xs::omp>;
  head_type head(tree(n), d);
  std::vector<float> h(static_cast<std::size_t>(b * d)), grad_h(h.size());
  for (float& x : h) x = uniform(rng) * 1.7f;
  std::vector<index_t> t(static_cast<std::size_t>(b));
  for (index_t& x : t) x = static_cast<index_t>(rng() % static_cast<unsigned>(n));
  head_type::gradient_type grad;
  const step_times times = time_steps(steps, [&] {
    return head.forward_backward(xs::matrix_view<const float>(h.data(), b, d),
                                 xs::vector_view<const index_t>(t.data(), b),
                                 xs::matrix_view<float>(grad_h.data(), b, d), grad);
  });
  std::printf("N = %lld: best %.1f ms, mean %.1f ms after the first\n", static_cast<long long>(n), times.best * 1e3,
              times.mean * 1e3);
}
