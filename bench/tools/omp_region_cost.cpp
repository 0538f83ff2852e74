// SPDX-License-Identifier: Apache-2.0
// What opening and closing an empty OpenMP parallel region costs (bench/RESULTS.md, "Stop 40: the
// 2-thread HS step"): 100,000 empty regions, three times, microseconds a region.
//
// g++ -O2 -fopenmp bench/tools/omp_region_cost.cpp -o /tmp/omp_region_cost
// OMP_NUM_THREADS=2 OMP_WAIT_POLICY=active /tmp/omp_region_cost
#include <chrono>
#include <cstdio>
int main() {
  volatile int sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100000; ++i) {
#pragma omp parallel
      { sink = sink + 0; }
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1e5;
    std::printf("%.3f us a region\n", us);
  }
}
