// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// k-ary Huffman coding as a parent array, for `runtime_tree::huffman`.
///
/// Two-queue algorithm: sorting the leaves once (a radix sort) lets every merge run in O(k),
/// because merged nodes are created in non-decreasing weight order and so form a second sorted
/// queue (a FIFO). No heap and no per-node allocation: three flat arrays for N = 1e6 classes.
///
/// k-ary padding: a full k-ary tree has n leaves with (n - 1) mod (k - 1) == 0, so up to k - 2
/// zero-weight dummy leaves are added. They sort before every real leaf (ties go to the dummies),
/// so all of them land in the first merge, which still takes >= 2 real leaves; dropping them leaves
/// that one node with fewer than k children and every other node with exactly k.

#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>

#include <thrust/sort.h>
#include <thrust/system/cpp/execution_policy.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// Sort key of a non-negative weight: unsigned order of keys = numeric order of weights.
[[nodiscard]] inline std::uint64_t weight_key(std::uint64_t w) { return w; }
[[nodiscard]] inline std::uint64_t weight_key(double w) {
  static_assert(sizeof(double) == sizeof(std::uint64_t), "xsoftmax: double must be 64-bit IEEE");
  const double folded = w + 0.0;  // -0.0 + 0.0 == +0.0: one key for both zeros
  std::uint64_t bits = 0;
  std::memcpy(&bits, &folded, sizeof bits);
  return bits;
}
/// Inverse of `weight_key`.
template <class Weight>
[[nodiscard]] Weight key_weight(std::uint64_t key) {
  if constexpr (std::is_same_v<Weight, double>) {
    double w = 0;
    std::memcpy(&w, &key, sizeof w);
    return w;
  } else {
    return key;
  }
}

/// Huffman tree over `counts.size()` classes as a parent array: nodes 0..N-1 are the classes,
/// nodes N.. the internal nodes in creation order, the last one the root (parent -1). For N == 1
/// the root has the single class as its only child. Ties are broken deterministically: equal
/// weights go by class id, and a leaf goes before an equally heavy merged node. Throws
/// `invalid_argument` for an empty `counts`, `arity < 2`, a negative count or a sum of integer
/// counts that overflows 64 bits, and `non_finite_error` (an `invalid_argument`) for a NaN or
/// infinite count; every message names the index and the value.
template <class Count>
[[nodiscard]] std::vector<index_t> huffman_parents(const std::vector<Count>& counts, int arity,
                                                   const char* who) {
  static_assert(std::is_arithmetic_v<Count> && !std::is_same_v<Count, bool>,
                "xsoftmax: runtime_tree::huffman: counts must be a vector of an arithmetic type");
  // Integer counts are summed exactly; floating counts in double.
  using weight_t = std::conditional_t<std::is_integral_v<Count>, std::uint64_t, double>;
  using std::size_t;

  const auto n = static_cast<index_t>(counts.size());
  expects(n >= 1, who, "counts is empty: a tree needs at least one class");
  expects(arity >= 2, who, "arity = ", arity, " must be >= 2");

  weight_t total = 0;
  for (index_t i = 0; i < n; ++i) {
    const Count x = counts[static_cast<size_t>(i)];
    if constexpr (std::is_floating_point_v<Count>) {
      expects<non_finite_error>(std::isfinite(x), who, "counts[", i, "] = ", x, " is not finite");
    }
    if constexpr (std::is_signed_v<Count>) {
      expects(x >= 0, who, "counts[", i, "] = ", x, " is negative; counts must be >= 0");
    }
    if constexpr (std::is_integral_v<Count>) {
      const auto w = static_cast<weight_t>(x);
      expects(total <= std::numeric_limits<weight_t>::max() - w, who, "counts[", i, "] = ", x,
              " makes the sum of counts overflow 64 bits");
      total += w;
    } else {
      total += static_cast<weight_t>(x);
    }
  }
  if constexpr (std::is_floating_point_v<Count>) {
    expects<non_finite_error>(std::isfinite(total), who, "the sum of counts = ", total,
                              " is not finite");
  }

  if (n == 1) return {1, -1};

  // Sort classes by (weight, class id). The weights become 64-bit keys whose unsigned order is
  // their numeric order (for non-negative doubles the IEEE bit pattern is monotone once -0.0 is
  // folded into +0.0), so Thrust's sequential stable sort takes its radix path: about 4x faster
  // than a comparison sort at N = 1e6, and stability keeps equal weights in class order.
  std::vector<std::uint64_t> key(static_cast<size_t>(n));
  std::vector<index_t> order(static_cast<size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    key[static_cast<size_t>(i)] = weight_key(static_cast<weight_t>(counts[static_cast<size_t>(i)]));
    order[static_cast<size_t>(i)] = i;
  }
  thrust::stable_sort_by_key(thrust::cpp::par, key.data(), key.data() + n, order.data());
  const auto sorted_weight = [&](index_t i) {
    return key_weight<weight_t>(key[static_cast<size_t>(i)]);
  };

  // A node never needs more than n children, and clamping keeps the padding below n for any
  // arity (arity = 1e9 would otherwise mean 1e9 dummies for the same flat tree).
  const index_t k = std::min<index_t>(arity, n);
  const index_t pad = ((k - 1) - (n - 1) % (k - 1)) % (k - 1);
  const index_t items = n + pad;
  const index_t merges = (items - 1) / (k - 1);

  std::vector<index_t> parent(static_cast<size_t>(n + merges), -1);
  std::vector<weight_t> merged(static_cast<size_t>(merges));
  index_t a = 0;  // next item of the leaf queue: dummies [0, pad), then sorted leaves
  index_t b = 0;  // next item of the merged queue: merged nodes [0, j)
  const auto leaf_weight = [&](index_t i) {
    return i < pad ? weight_t(0) : sorted_weight(i - pad);
  };
  for (index_t j = 0; j < merges; ++j) {
    weight_t sum = 0;
    for (index_t taken = 0; taken < k; ++taken) {
      const bool from_leaves =
          a < items && (b == j || leaf_weight(a) <= merged[static_cast<size_t>(b)]);
      if (from_leaves) {
        if (a >= pad) {
          parent[static_cast<size_t>(order[static_cast<size_t>(a - pad)])] = n + j;
          sum += sorted_weight(a - pad);
        }
        ++a;
      } else {
        parent[static_cast<size_t>(n + b)] = n + j;
        sum += merged[static_cast<size_t>(b)];
        ++b;
      }
    }
    merged[static_cast<size_t>(j)] = sum;
  }
  return parent;  // the last merged node kept its parent -1: it is the root
}

}  // namespace xsoftmax::detail
