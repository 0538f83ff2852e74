// SPDX-License-Identifier: Apache-2.0
// One full-softmax training step (forward_backward, the head's automatic plan) on the omp backend,
// in C++ alone: no Python, no optimiser, the weight gradient's buffer reused between steps, so that
// `perf record` sees only the step (bench/RESULTS.md, "Full softmax on the CPU: the backward from
// the kept exponentials"). N classes (default 1e5), d = 256, B = 1,024, as
// bench/full_softmax_vs_torch_cpu.py; prints each step and the best and mean after the first, with
// the rate of the three GEMMs' 6 B N d FLOPs. `fresh`: a new gradient object every step, allocated
// and freed inside the timed step (what the PyTorch package did before it reused its gradients).
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/full_softmax_step.cpp -lopenblas
//   -o /tmp/full_softmax_step
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/full_softmax_step [classes] [steps] [fresh]
#include <xsoftmax/full_softmax.hpp>

#include "step_timing.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  const index_t n = argc > 1 ? std::atol(argv[1]) : 100000, d = 256, b = 1024;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 1 || steps < 2) {
    std::fprintf(stderr, "usage: %s [classes >= 1] [steps >= 2] [fresh]\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(n * d));
  for (float& x : w) x = uniform(rng) / 16.f;  // about bench/full_softmax_vs_torch_cpu.py's scale
  xs::full_softmax<xs::fp32, xs::omp> head(xs::matrix_view<float>(w.data(), n, d));
  std::vector<float> h(static_cast<std::size_t>(b * d)), grad_h(h.size());
  for (float& x : h) x = uniform(rng) * 1.7f;
  std::vector<index_t> t(static_cast<std::size_t>(b));
  for (index_t& x : t) x = static_cast<index_t>(rng() % static_cast<unsigned>(n));
  const bool fresh = argc > 3 && std::strcmp(argv[3], "fresh") == 0;
  using gradient_type = xs::full_softmax<xs::fp32, xs::omp>::gradient_type;
  gradient_type kept;
  const step_times times = time_steps(steps, [&] {
    gradient_type per_step;
    return head.forward_backward(xs::matrix_view<const float>(h.data(), b, d),
                                 xs::vector_view<const index_t>(t.data(), b),
                                 xs::matrix_view<float>(grad_h.data(), b, d), fresh ? per_step : kept);
  });
  std::printf("N = %lld%s: best %.1f ms, mean %.1f ms after the first (%.1f GFLOP/s of the three GEMMs)\n",
              static_cast<long long>(n), fresh ? ", a fresh gradient each step" : "", times.best * 1e3, times.mean * 1e3,
              6.0 * b * n * d / times.best / 1e9);
}
