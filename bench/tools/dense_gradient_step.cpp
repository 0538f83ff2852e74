// SPDX-License-Identifier: Apache-2.0
// One full-softmax training step of a bf16 (or, with `fp16`, an fp16) head (omp) into each form of
// its weight gradient (bench/RESULTS.md, stops 51 and 52): mode 0 the sparse fp32 gradient, 1 a
// dense gradient in the storage type (`dense_gradient<bf16 / fp16>`, rounded once per row block),
// 2 a dense fp32 gradient. N = 100000
// classes, d = 128, B = 1024 (the automatic host plan: 8 blocks of 128 rows); prints each of 4
// calls. Alternate the modes (and builds) in one run: the machine is shared.
//
// g++ -std=c++17 -O2 -fopenmp -DXSOFTMAX_HAS_CBLAS=1 -Iinclude -I/usr/local/cuda/include/cccl
//   -isystem /usr/local/cuda/include -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//   bench/tools/dense_gradient_step.cpp -lopenblas -o /tmp/dense_gradient_step
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/dense_gradient_step {0,1,2} [fp16]

#include <xsoftmax/full_softmax.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

template <class P>
int run(int mode) {
  const index_t N = 100000, d = 128, B = 1024;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> hidden(static_cast<std::size_t>(B * d));
  for (float& x : hidden) x = gauss(rng) * 0.35f;
  std::vector<index_t> t(static_cast<std::size_t>(B));
  for (index_t& x : t) x = static_cast<index_t>(rng() % N);
  using bf = typename P::storage_type;
  xs::full_softmax<P, xs::omp> head(N, d);
  std::vector<float> gh(static_cast<std::size_t>(B * d));
  typename xs::full_softmax<P, xs::omp>::gradient_type sparse;
  std::vector<bf> dense16(static_cast<std::size_t>(N * d));
  std::vector<float> dense32(static_cast<std::size_t>(N * d));
  const xs::matrix_view<const float> h(hidden.data(), B, d);
  const xs::vector_view<const index_t> tv(t.data(), B);
  const xs::matrix_view<float> ghv(gh.data(), B, d);
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (mode == 0) {
      head.forward_backward(h, tv, ghv, sparse);
    } else if (mode == 1) {
      head.forward_backward(h, tv, ghv, xs::dense_gradient<bf>{xs::matrix_view<bf>(dense16.data(), N, d)});
    } else {
      head.forward_backward(h, tv, ghv, xs::dense_gradient<float>{xs::matrix_view<float>(dense32.data(), N, d)});
    }
    std::printf("%s mode %d: %.1f ms\n", xs::element_name<bf>(), mode,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return 0;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  return argc > 2 && !std::strcmp(argv[2], "fp16") ? run<xs::fp16>(mode) : run<xs::bf16>(mode);
}
