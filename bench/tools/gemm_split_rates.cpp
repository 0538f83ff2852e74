// SPDX-License-Identifier: Apache-2.0
// The full softmax's three GEMM shapes on the host, one OpenBLAS call (threaded by OpenBLAS)
// against the rows of C split over OpenMP threads, each tile a single-thread call (what
// `gemm_parallel` does on the omp backend for long-k GEMMs; bench/RESULTS.md, "Full softmax on the
// CPU: blocks that keep every score ..."). GFLOP/s, best of 5, alternating; d = 256.
//   H: B x d, W: c x d, G: B x c;  scores = H W^T,  grad_h = G W,  grad_w = G^T H
// Mode `bits`: how many elements of C differ bitwise between one threaded call, the row split and
// one single-thread call (why the split is limited to GEMMs OpenBLAS threads anyway).
//
// g++ -O2 -fopenmp -isystem /usr/include/x86_64-linux-gnu/openblas-openmp
//   bench/tools/gemm_split_rates.cpp -lopenblas -o /tmp/gemm_split_rates
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/gemm_split_rates [bits]
#include <cblas.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <cstring>

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
/// Mode `bits`: elements of C that differ between the three ways of computing it.
int bits_main() {
  // OpenMP builds of OpenBLAS set OpenMP's thread count in openblas_set_num_threads: restore it.
  const int threads = omp_get_max_threads();
  std::mt19937 g(1); std::normal_distribution<float> nd;
  int shapes[][3] = {{700,9,12},{700,700,12},{1024,8192,256},{256,256,8192},{200,25,12},{64,64,64},{1024,256,8192}};
  for (auto& s : shapes) {
    int m = s[0], n = s[1], k = s[2];
    std::vector<float> A((size_t)m*k), B((size_t)k*n), C1((size_t)m*n), C2((size_t)m*n);
    for (auto& x : A) x = nd(g);
    for (auto& x : B) x = nd(g);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, A.data(), k, B.data(), n, 0, C1.data(), n);
    #pragma omp parallel
    { int t = omp_get_thread_num(), T = omp_get_num_threads(); int r0 = m*t/T, r1 = m*(t+1)/T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1-r0, n, k, 1, A.data()+(size_t)r0*k, k, B.data(), n, 0, C2.data()+(size_t)r0*n, n); }
    int diff = 0; for (size_t i = 0; i < C1.size(); ++i) diff += memcmp(&C1[i], &C2[i], 4) != 0;
    std::vector<float> C3((size_t)m*n);
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, A.data(), k, B.data(), n, 0, C3.data(), n);
    int diff3 = 0; for (size_t i = 0; i < C1.size(); ++i) diff3 += memcmp(&C1[i], &C3[i], 4) != 0;
    int diff23 = 0; for (size_t i = 0; i < C1.size(); ++i) diff23 += memcmp(&C2[i], &C3[i], 4) != 0;
    openblas_set_num_threads(threads);
    printf("m %d n %d k %d: 2thr-one vs split %d, 2thr vs 1thr-one %d, split vs 1thr-one %d (of %zu)\n", m, n, k, diff, diff3, diff23, C1.size());
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "bits") == 0) return bits_main();
  const int d = 256;
  std::mt19937 g(1); std::normal_distribution<float> nd;
  struct shape { const char* name; int b, c; };
  for (int b : {1024, 256}) for (int c : {8192, 32768}) {
    std::vector<float> G((size_t)b * c), W((size_t)c * d), H((size_t)b * d), GH((size_t)b * d), GW((size_t)c * d), S((size_t)b*c);
    for (auto& x : G) x = nd(g);
    for (auto& x : W) x = nd(g);
    for (auto& x : H) x = nd(g);
    double flop = 2.0 * b * c * d;
    auto one = [&](int which) {
      if (which == 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, c, d, 1, H.data(), d, W.data(), d, 0, S.data(), c);
      if (which == 1) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, d, c, 1, G.data(), c, W.data(), d, 0, GH.data(), d);
      if (which == 2) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, d, b, 1, G.data(), c, H.data(), d, 0, GW.data(), d);
    };
    auto split = [&](int which) {
      #pragma omp parallel
      {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        if (which == 0) { int r0 = b * t / T, r1 = b * (t + 1) / T;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, c, d, 1, H.data() + (size_t)r0 * d, d, W.data(), d, 0, S.data() + (size_t)r0 * c, c); }
        if (which == 1) { int r0 = b * t / T, r1 = b * (t + 1) / T;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, d, c, 1, G.data() + (size_t)r0 * c, c, W.data(), d, 0, GH.data() + (size_t)r0 * d, d); }
        if (which == 2) { int r0 = c * t / T, r1 = c * (t + 1) / T;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, d, b, 1, G.data() + r0, c, H.data(), d, 0, GW.data() + (size_t)r0 * d, d); }
      }
    };
    printf("B %4d c %5d:", b, c);
    for (int w = 0; w < 3; ++w) {
      double to = 1e9, ts = 1e9;
      one(w); split(w);
      for (int r = 0; r < 5; ++r) { double t0 = now(); one(w); to = std::min(to, now() - t0); t0 = now(); split(w); ts = std::min(ts, now() - t0); }
      printf("  %s one %6.1f split %6.1f", w == 0 ? "scores" : w == 1 ? "grad_h" : "grad_w", flop / to / 1e9, flop / ts / 1e9);
    }
    printf("\n");
  }
}
