// SPDX-License-Identifier: Apache-2.0
// One full-softmax training step (fp32 head, omp) with and without gradient filtering
// (`loss_options::gradient_filter`, bench/RESULTS.md, stop 52): N = 100000 classes, d = 128,
// B = 1024 (the automatic host plan: blocks of 128 rows keeping every score), on two kinds of data:
//  * uniform: random weights of scale 1 / sqrt(d) and hidden rows of scale 0.35, a near-uniform
//    softmax (p ~ 1 / N): at 2^-12 only the targets' entries pass;
//  * topics: the classes in topics of 64 consecutive classes, each weight row its topic's random
//    unit vector plus noise, each hidden row 40 times its target's topic vector plus noise: each
//    row's probability spread over its topic's 64 classes (about 1/64 each), the rest far below --
//    the shape of a trained model's softmax, where a block's rows keep the union of their topics.
// Prints each of 4 calls with the loss. Alternate the modes in one run: the machine is shared.
//
// g++ -std=c++17 -O2 -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//   bench/tools/gradient_filter_step.cpp -lopenblas -o /tmp/gradient_filter_step
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/gradient_filter_step {uniform,topics} {0,0.000244140625}

#include <xsoftmax/full_softmax.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

int main(int argc, char** argv) {
  const index_t N = 100000, d = 128, B = 1024, topic_size = 64;
  const bool topics = argc > 1 && !std::strcmp(argv[1], "topics");
  const float filter = argc > 2 ? static_cast<float>(std::atof(argv[2])) : 0.f;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(N * d)), hidden(static_cast<std::size_t>(B * d));
  std::vector<index_t> t(static_cast<std::size_t>(B));
  for (index_t& x : t) x = static_cast<index_t>(rng() % N);
  const float unit = 1.f / std::sqrt(static_cast<float>(d));
  if (!topics) {
    std::uniform_real_distribution<float> u(-unit, unit);
    for (float& x : w) x = u(rng);
    for (float& x : hidden) x = gauss(rng) * 0.35f;
  } else {
    const index_t n_topics = (N + topic_size - 1) / topic_size;
    std::vector<float> topic(static_cast<std::size_t>(n_topics * d));
    for (float& x : topic) x = gauss(rng) * unit;  // about unit length
    for (index_t c = 0; c < N; ++c)
      for (index_t p = 0; p < d; ++p)
        w[static_cast<std::size_t>(c * d + p)] = topic[static_cast<std::size_t>(c / topic_size * d + p)] + 0.1f * unit * gauss(rng);
    for (index_t r = 0; r < B; ++r)
      for (index_t p = 0; p < d; ++p)
        hidden[static_cast<std::size_t>(r * d + p)] =
            40.f * topic[static_cast<std::size_t>(t[static_cast<std::size_t>(r)] / topic_size * d + p)] + 0.1f * gauss(rng);
  }
  xs::full_softmax<xs::fp32, xs::omp> head(xs::matrix_view<float>(w.data(), N, d));
  std::vector<float> gh(static_cast<std::size_t>(B * d));
  xs::full_softmax<xs::fp32, xs::omp>::gradient_type grad;
  xs::loss_options options;
  options.gradient_filter = filter;
  const xs::matrix_view<const float> h(hidden.data(), B, d);
  const xs::vector_view<const index_t> tv(t.data(), B);
  const xs::matrix_view<float> ghv(gh.data(), B, d);
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    const float loss = head.forward_backward(h, tv, ghv, grad, options);
    std::printf("%s, filter %g: %.1f ms  loss %.4f\n", topics ? "topics" : "uniform", double(filter),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
                double(loss));
  }
  return 0;
}
