// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Sums of squares in a fixed order, for the trust ratios of the large-batch optimizers: the n
/// terms go to P = ceil(n / block) partial sums, partial b summing terms b, b + P, b + 2P, ...
/// sequentially in double (interleaved, so that neighbouring GPU threads read neighbouring
/// values), and the partial sums are summed again the same way until one is left. The order of
/// every addition depends on n and the block only — not on the thread count, the backend or the
/// scheduling — so a norm, and the step it scales, is bitwise repeatable. (A `thrust::reduce` would
/// not promise that: its omp system splits the range by the thread count, its cuda system by the
/// launch configuration.) Cost: n terms read once, P partial sums written, one value read back.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

namespace xsoftmax::detail {

/// Two sums carried together (one pass computes both norms a trust ratio needs).
struct sum_pair {
  double first = 0;
  double second = 0;
};

inline constexpr index_t sum_block = 2048;

/// Partial sum b of P: the terms b, b + P, ... below n; `term(e)` returns a `sum_pair`.
template <class Term>
struct block_of_terms {
  Term term;
  index_t n, partials;
  XSOFTMAX_HD sum_pair operator()(index_t b) const {
    sum_pair s;
    for (index_t e = b; e < n; e += partials) {
      const sum_pair t = term(e);
      s.first += t.first;
      s.second += t.second;
    }
    return s;
  }
};

/// The identity term over an array of partial sums (the later levels of the tree).
struct partial_term {
  const sum_pair* partial;
  XSOFTMAX_HD sum_pair operator()(index_t e) const { return partial[e]; }
};

/// Sum over e in [0, n) of `term(e)`, in the fixed blocked order above; (0, 0) for n = 0. The
/// first level sums `first_block` terms per thread (fewer where one term is a whole row), the
/// later ones `sum_block`.
template <class Backend, class Term>
[[nodiscard]] sum_pair blocked_sum(const execution<Backend>& ex, index_t n, Term term,
                                   index_t first_block = sum_block) {
  if (n <= 0) return {};
  using vector = backend_vector<Backend, sum_pair>;
  index_t blocks = (n + first_block - 1) / first_block;
  vector partial(static_cast<std::size_t>(blocks));
  const thrust::counting_iterator<index_t> first(0);
  thrust::transform(ex.policy(), first, first + blocks, partial.begin(), block_of_terms<Term>{term, n, blocks});
  while (blocks > 1) {
    const index_t next = (blocks + sum_block - 1) / sum_block;
    vector folded(static_cast<std::size_t>(next));
    thrust::transform(ex.policy(), first, first + next, folded.begin(),
                      block_of_terms<partial_term>{partial_term{raw(partial)}, blocks, next});
    partial.swap(folded);
    blocks = next;
  }
  return backend_ops<Backend>::read(ex.res, raw(partial));
}

}  // namespace xsoftmax::detail
