// SPDX-License-Identifier: Apache-2.0
// What resizing a fresh dense weight gradient costs the calling thread (the torch op's full
// softmax builds a fresh gradient per call; the head resizes its values, a thrust::host_vector that
// value-initialises): N x d = 100K x 256 floats, against malloc plus a write to each page (the
// first touch every fresh buffer pays, torch's too). Prints ms of each, 4 times (bench/RESULTS.md,
// "Stop 41": in the step itself perf finds the fill at 0.24 % -- not the lever).
//
// g++ -std=c++17 -O2 -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include \
//   bench/tools/dense_gradient_resize.cpp -o /tmp/dense_gradient_resize && /tmp/dense_gradient_resize
#include <thrust/host_vector.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

int main() {
  const std::size_t n = 100000ull * 256;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto v = std::make_shared<thrust::host_vector<float>>();
      v->resize(n);
      const auto t1 = std::chrono::steady_clock::now();
      std::printf("host_vector resize %.1f ms (%g)  ", std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  static_cast<double>((*v)[n / 2]));
    }
    const auto t2 = std::chrono::steady_clock::now();
    float* p = static_cast<float*>(std::malloc(n * sizeof(float)));
    for (std::size_t i = 0; i < n; i += 1024) p[i] = 1.f;
    const auto t3 = std::chrono::steady_clock::now();
    std::printf("malloc + a write a page %.1f ms (%g)\n", std::chrono::duration<double, std::milli>(t3 - t2).count(),
                static_cast<double>(p[n / 2]));
    std::free(p);
  }
}
