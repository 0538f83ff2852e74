// SPDX-License-Identifier: Apache-2.0
// The full softmax's three GEMMs at one block-and-chunk shape of the host's automatic plan (B rows
// of a block against a c-column chunk, d = 256), each as one threaded OpenBLAS call and as the
// OpenMP split `gemm_parallel` could use: scores split by columns, the hidden gradient by C's rows
// (stop 34's split) or by k (stop 44's, the parts added after), the weight gradient by C's rows.
// GFLOP/s, mean of 5 calls, 4 rounds; the k split's sum assumes 2 threads (bench/RESULTS.md, "Full softmax on the CPU: the backward from
// the kept exponentials").
//
// g++ -O2 -fopenmp -isystem /usr/include/x86_64-linux-gnu/openblas-openmp bench/tools/gemm_chunk_rates.cpp
//   -lopenblas -o /tmp/gemm_chunk_rates
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/gemm_chunk_rates [B = 256] [c = 16384]
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Mean seconds of 5 calls of f.
template <class F>
double timed(F&& f) {
  constexpr int calls = 5;
  const double start = now();
  for (int i = 0; i < calls; ++i) f();
  return (now() - start) / calls;
}

/// [begin, end) of part t of n over this OpenMP team.
void my_part(int n, int& begin, int& end) {
  const int t = omp_get_thread_num(), parts = omp_get_num_threads();
  begin = n * t / parts;
  end = n * (t + 1) / parts;
}

}  // namespace

int main(int argc, char** argv) {
  const int b = argc > 1 ? std::atoi(argv[1]) : 256, c = argc > 2 ? std::atoi(argv[2]) : 16384, d = 256;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  // H: b x d rows, W: c x d weight chunk, S: b x c scores (or their gradient G)
  std::vector<float> h(static_cast<std::size_t>(b) * d), w(static_cast<std::size_t>(c) * d),
      s(static_cast<std::size_t>(b) * c), grad_h(h.size()), grad_w(w.size()), part(2 * h.size());
  for (float& x : h) x = normal(rng);
  for (float& x : w) x = normal(rng);
  for (float& x : s) x = normal(rng) * 1e-3f;
  const double flop = 2.0 * b * c * d;
  auto rate = [flop](double seconds) { return flop / seconds / 1e9; };
  for (int round = 0; round < 4; ++round) {
    // scores S = H W^T
    const double scores_blas = timed([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, c, d, 1, h.data(), d, w.data(), d, 0, s.data(), c);
    });
    const double scores_columns = timed([&] {
#pragma omp parallel
      {
        int c0, c1;
        my_part(c, c0, c1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, c1 - c0, d, 1, h.data(), d, w.data() + c0 * d, d, 0,
                    s.data() + c0, c);
      }
    });
    // hidden gradient grad_h += G W: by C's rows, or by k (parts added after)
    const double grad_h_rows = timed([&] {
#pragma omp parallel
      {
        int r0, r1;
        my_part(b, r0, r1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, d, c, 1, s.data() + r0 * c, c, w.data(), d, 1,
                    grad_h.data() + r0 * d, d);
      }
    });
    const double grad_h_k = timed([&] {
#pragma omp parallel
      {
        int k0, k1;
        my_part(c, k0, k1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, d, k1 - k0, 1, s.data() + k0, c, w.data() + k0 * d, d,
                    0, part.data() + omp_get_thread_num() * h.size(), d);
#pragma omp barrier
#pragma omp for
        for (int e = 0; e < b * d; ++e) grad_h[e] += part[e] + part[h.size() + e];  // two threads
      }
    });
    // weight gradient grad_w += G^T H: one threaded call, or by C's rows (the chunk's classes)
    const double grad_w_blas = timed([&] {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, d, b, 1, s.data(), c, h.data(), d, 1, grad_w.data(), d);
    });
    const double grad_w_rows = timed([&] {
#pragma omp parallel
      {
        int c0, c1;
        my_part(c, c0, c1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, d, b, 1, s.data() + c0, c, h.data(), d, 1,
                    grad_w.data() + c0 * d, d);
      }
    });
    std::printf("scores one call %.1f, by columns %.1f | grad_h by rows %.1f, by k %.1f | grad_w one call %.1f, "
                "by rows %.1f GFLOP/s\n",
                rate(scores_blas), rate(scores_columns), rate(grad_h_rows), rate(grad_h_k), rate(grad_w_blas),
                rate(grad_w_rows));
  }
}
