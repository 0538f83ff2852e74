// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Sparse gradient accumulation without atomics: contributions (row key, value vector) from many
/// samples are stably sorted by key and each key's run summed in input order. The result does not
/// depend on the number of threads, so it is bit-for-bit repeatable.

#include <xsoftmax/detail/primitives/parallel_for.hpp>

#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <vector>

namespace xsoftmax::detail {

/// Sums `values` rows (n x dim) that share a key in `keys` (n). Writes the unique keys ascending to
/// `out_keys` and their sums to `out_values` (unique x dim).
template <class Policy>
void sparse_accumulate(const Policy& policy, const std::vector<index_t>& keys, const std::vector<float>& values,
                       index_t dim, std::vector<index_t>& out_keys, std::vector<float>& out_values) {
  const index_t n = static_cast<index_t>(keys.size());
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::vector<index_t> sorted = keys;
  thrust::sequence(policy, order.begin(), order.end());
  thrust::stable_sort_by_key(policy, sorted.begin(), sorted.end(), order.begin());
  std::vector<index_t> run_start;
  for (index_t i = 0; i < n; ++i)
    if (i == 0 || sorted[i] != sorted[i - 1]) run_start.push_back(i);
  const index_t runs = static_cast<index_t>(run_start.size());
  run_start.push_back(n);
  out_keys.resize(static_cast<std::size_t>(runs));
  out_values.assign(static_cast<std::size_t>(runs * dim), 0.f);
  const index_t* start = run_start.data();
  const index_t* ord = order.data();
  const index_t* sk = sorted.data();
  const float* v = values.data();
  index_t* ok = out_keys.data();
  float* ov = out_values.data();
  parallel_for(policy, runs, [=](index_t r) {
    ok[r] = sk[start[r]];
    float* o = ov + r * dim;
    for (index_t i = start[r]; i < start[r + 1]; ++i) {  // input order within a key: deterministic
      const float* src = v + ord[i] * dim;
      for (index_t j = 0; j < dim; ++j) o[j] += src[j];
    }
  });
}

}  // namespace xsoftmax::detail
