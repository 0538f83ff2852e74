// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `parallel_for(policy, n, f)`: f(i) for i in [0, n) on the policy's threads, through Thrust.

#include <xsoftmax/config.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

namespace xsoftmax::detail {

template <class Policy, class F>
void parallel_for(const Policy& policy, index_t n, F f) {
  if (n <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(n), f);
}

}  // namespace xsoftmax::detail
