// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Sparse gradient accumulation without atomics, on any backend: contributions (row key, value
/// vector) from many samples are stably sorted by key and each key's run summed in input order. The
/// result does not depend on the number of threads or on the device, so it is bit-for-bit
/// repeatable.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <thrust/copy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <vector>

namespace xsoftmax::detail {

/// Index i starts a run of equal keys in `sorted`.
struct run_start_at {
  const index_t* sorted;
  XSOFTMAX_HD bool operator()(index_t i) const { return i == 0 || sorted[i] != sorted[i - 1]; }
};

/// Sums the `n` rows of `values` (n x dim, in the execution's memory) that share a key in `keys`
/// (n). Resizes and fills `out_keys` with the unique keys ascending and `out_values` with their sums
/// (unique x dim); both are vectors in the execution's memory.
template <class Ex, class KeyVector, class ValueVector>
void sparse_accumulate(const Ex& ex_in, const index_t* keys, index_t n, const float* values, index_t dim,
                       KeyVector& out_keys, ValueVector& out_values) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_buffer = scratch_buffer<typename execution_type::backend, index_t>;  // each written before it is read
  index_buffer sorted(static_cast<std::size_t>(n), ex), order(static_cast<std::size_t>(n), ex),
      run_start(static_cast<std::size_t>(n + 1), ex);
  if (n > 0) thrust::copy(ex.policy(), keys, keys + n, sorted.begin());  // raw pointers: the policy says where
  thrust::sequence(ex.policy(), order.begin(), order.end());
  thrust::stable_sort_by_key(ex.policy(), sorted.begin(), sorted.end(), order.begin());
  const index_t* sk = raw(sorted);
  const thrust::counting_iterator<index_t> first(0);
  count_host_read();  // the number of keys sizes the outputs
  const index_t runs =
      static_cast<index_t>(thrust::copy_if(ex.policy(), first, first + n, run_start.begin(), run_start_at{sk}) -
                           run_start.begin());
  out_keys.resize(static_cast<std::size_t>(runs));
  out_values.resize(static_cast<std::size_t>(runs * dim));
  const index_t* start = raw(run_start);
  const index_t* ord = raw(order);
  index_t* ok = raw(out_keys);
  float* ov = raw(out_values);
  XSOFTMAX_PARALLEL_FOR(ex, runs, r, {
    const index_t begin = start[r], end = r + 1 < runs ? start[r + 1] : n;
    ok[r] = sk[begin];
    float* o = ov + r * dim;
    for (index_t j = 0; j < dim; ++j) o[j] = 0.f;
    for (index_t i = begin; i < end; ++i) {  // input order within a key: deterministic
      const float* src = values + ord[i] * dim;
      for (index_t j = 0; j < dim; ++j) o[j] += src[j];
    }
  });
}

/// The same over host vectors (host policies).
template <class Policy>
void sparse_accumulate(const Policy& policy, const std::vector<index_t>& keys, const std::vector<float>& values,
                       index_t dim, std::vector<index_t>& out_keys, std::vector<float>& out_values) {
  sparse_accumulate(policy, keys.data(), static_cast<index_t>(keys.size()), values.data(), dim, out_keys, out_values);
}

}  // namespace xsoftmax::detail
