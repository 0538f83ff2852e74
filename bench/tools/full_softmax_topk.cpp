// SPDX-License-Identifier: Apache-2.0
// The full softmax's top-k beside its forward on the same rows (issue 26, target 4: the top-10
// within 1.25x the forward), omp backend, in C++ alone: `rounds` rounds of `steps` forward calls,
// `steps` top-k calls and `steps` forward_topk calls (the loss and the top-k from one pass over the
// scores), each round printing the best and mean of each and their ratios to the forward, so that
// they are compared under the same load. N classes (default 1e5), B rows (1,024), d (256), k (10),
// the weights and rows of full_softmax_step.cpp.
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/full_softmax_topk.cpp -lopenblas
//   -o /tmp/full_softmax_topk
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/full_softmax_topk [classes] [rows] [dim] [k] [steps] [rounds]
#include <xsoftmax/full_softmax.hpp>

#include "step_timing.hpp"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  const auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const index_t n = arg(1, 100000), b = arg(2, 1024), d = arg(3, 256), k = arg(4, 10);
  const int steps = static_cast<int>(arg(5, 6)), rounds = static_cast<int>(arg(6, 2));
  if (n < 1 || b < 1 || d < 1 || k < 1 || k > n || steps < 2 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [classes >= 1] [rows >= 1] [dim >= 1] [k in 1..classes] [steps >= 2] [rounds >= 1]\n",
                 argv[0]);
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(n * d));
  for (float& x : w) x = uniform(rng) / 16.f;  // as full_softmax_step.cpp
  const xs::full_softmax<xs::fp32, xs::omp> head(xs::matrix_view<float>(w.data(), n, d));
  std::vector<float> h(static_cast<std::size_t>(b * d));
  for (float& x : h) x = uniform(rng) * 1.7f;
  std::vector<index_t> t(static_cast<std::size_t>(b)), classes(static_cast<std::size_t>(b * k));
  for (index_t& x : t) x = static_cast<index_t>(rng() % static_cast<unsigned>(n));
  std::vector<float> log_probs(classes.size());
  const xs::matrix_view<const float> hv(h.data(), b, d);
  for (int round = 0; round < rounds; ++round) {
    const step_times forward = time_steps(steps, [&] { return head.forward(hv, xs::vector_view<const index_t>(t.data(), b)); });
    const step_times topk = time_steps(steps, [&] {
      head.topk(hv, k, xs::matrix_view<index_t>(classes.data(), b, k), xs::matrix_view<float>(log_probs.data(), b, k));
      return log_probs[0];
    });
    const step_times fused = time_steps(steps, [&] {
      return head.forward_topk(hv, xs::vector_view<const index_t>(t.data(), b), k,
                               xs::matrix_view<index_t>(classes.data(), b, k),
                               xs::matrix_view<float>(log_probs.data(), b, k));
    });
    std::printf("N = %lld, B = %lld, d = %lld, round %d: forward best %.1f ms (mean %.1f), top-%lld best %.1f ms (mean %.1f): "
                "%.2fx the forward; forward_topk best %.1f ms (mean %.1f): %.2fx the forward (forward + topk: %.2fx)\n",
                static_cast<long long>(n), static_cast<long long>(b), static_cast<long long>(d), round, forward.best * 1e3,
                forward.mean * 1e3, static_cast<long long>(k), topk.best * 1e3, topk.mean * 1e3, topk.best / forward.best,
                fused.best * 1e3, fused.mean * 1e3, fused.best / forward.best, (forward.best + topk.best) / forward.best);
  }
}
