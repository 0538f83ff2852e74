// SPDX-License-Identifier: Apache-2.0
// The selective heads' training step on the host (omp backend): per-sample candidate lists
// (explicit_candidates, the per-sample pass: an entry's gradient contribution, nnz x d floats, per
// step) and sampled negatives (a shared set), each timed over `steps` steps after a first. Used for
// the A/B of the step's buffers as scratch (no value-initialisation, memory kept mapped between
// steps) against backend vectors (bench/RESULTS.md, stop 48): build it against each include/.
//
// g++ -std=c++17 -O3 -DNDEBUG -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/selective_step.cpp -lopenblas
//   -o /tmp/selective_step
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/selective_step [classes] [rows] [dim] [per_row] [sampled] [steps]
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include "step_timing.hpp"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  const auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const index_t n = arg(1, 100000), b = arg(2, 1024), d = arg(3, 256), per_row = arg(4, 100), m = arg(5, 8192);
  const int steps = static_cast<int>(arg(6, 8));
  if (n < 2 || b < 1 || d < 1 || per_row < 1 || per_row > n || m < 1 || m > n || steps < 2) {
    std::fprintf(stderr, "usage: %s [classes >= 2] [rows >= 1] [dim >= 1] [per_row in 1..classes] "
                 "[sampled in 1..classes] [steps >= 2]\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(n * d)), h(static_cast<std::size_t>(b * d)), gh(h.size());
  for (float& x : w) x = uniform(rng) / 16.f;
  for (float& x : h) x = uniform(rng) * 1.7f;
  std::vector<index_t> t(static_cast<std::size_t>(b)), offsets{0}, ids;
  for (index_t& c : t) c = static_cast<index_t>(rng() % static_cast<unsigned>(n));
  for (index_t r = 0; r < b; ++r) {
    for (index_t j = 0; j < per_row; ++j) ids.push_back(static_cast<index_t>(rng() % static_cast<unsigned>(n)));
    offsets.push_back(static_cast<index_t>(ids.size()));
  }
  const xs::matrix_view<const float> hv(h.data(), b, d);
  const xs::vector_view<const index_t> tv(t.data(), b);
  const xs::matrix_view<float> ghv(gh.data(), b, d);

  xs::explicit_candidates lists;
  lists.set_per_sample(offsets, ids);
  const xs::selective_softmax<xs::explicit_candidates, xs::fp32, xs::omp> per_sample(lists, xs::matrix_view<float>(w.data(), n, d));
  xs::selective_softmax<xs::explicit_candidates, xs::fp32, xs::omp>::gradient_type g1;
  std::printf("per-sample lists: N = %ld, B = %ld, d = %ld, %ld classes a row\n", static_cast<long>(n),
              static_cast<long>(b), static_cast<long>(d), static_cast<long>(per_row));
  const step_times a = time_steps(steps, [&] { return per_sample.forward_backward(hv, tv, ghv, g1); });

  xs::sampling_options so;
  so.num_sampled = m;
  const xs::selective_softmax<xs::sampled_negatives, xs::fp32, xs::omp> sampled(
      xs::sampled_negatives::log_uniform(n, so), xs::matrix_view<float>(w.data(), n, d));
  xs::selective_softmax<xs::sampled_negatives, xs::fp32, xs::omp>::gradient_type g2;
  std::printf("sampled: %ld negatives (log-uniform)\n", static_cast<long>(m));
  const step_times s = time_steps(steps, [&] { return sampled.forward_backward(hv, tv, ghv, g2); });
  std::printf("per-sample step: best %.2f ms, mean %.2f ms; sampled step: best %.2f ms, mean %.2f ms\n", a.best * 1e3,
              a.mean * 1e3, s.best * 1e3, s.mean * 1e3);
}
