// SPDX-License-Identifier: Apache-2.0
// The host HS step's sort of 1,024 rows by leaf rank (50K classes), the two ways Thrust's
// sequential backend can do it: stable_sort_by_key on 64-bit ranks with 64-bit row values (the
// device form), and one sort of 32-bit words packing rank and row (`sort_rows_by_packed_rank`,
// detail/hierarchical/run_plan.hpp). Prints us a sort of each (bench/RESULTS.md, "Stop 41").
//
// g++ -std=c++17 -O3 -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include \
//   bench/tools/leaf_rank_sort_rates.cpp -o /tmp/leaf_rank_sort_rates && /tmp/leaf_rank_sort_rates
#include <thrust/sort.h>
#include <thrust/system/cpp/execution_policy.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

int main() {
  const int n = 1024, reps = 20000, index_bits = 10;
  std::mt19937 g(1);
  std::vector<long> ranks(n);
  for (auto& x : ranks) x = static_cast<long>(g() % 50000);
  std::vector<long> keys(n), rows(n);
  std::vector<std::uint32_t> words(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    keys = ranks;
    std::iota(rows.begin(), rows.end(), 0L);
    thrust::stable_sort_by_key(thrust::cpp::par, keys.begin(), keys.end(), rows.begin());
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i < n; ++i) words[i] = static_cast<std::uint32_t>(ranks[i]) << index_bits | static_cast<std::uint32_t>(i);
    thrust::sort(thrust::cpp::par, words.begin(), words.end());
  }
  const auto t2 = std::chrono::steady_clock::now();
  const auto us = [&](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / reps; };
  std::printf("stable_sort_by_key, 64-bit ranks and rows: %.2f us; packed 32-bit words: %.2f us\n", us(t0, t1),
              us(t1, t2));
}
