// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Helpers of the selective / KNN softmax tests: float64 references of a softmax over a subset of
/// classes (with logit offsets), and bitwise comparison of two heads' outputs.

#include "support/head_checks.hpp"

#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace xsoftmax_test {

/// -log p(t | h) over the classes `classes(t)` (which must contain t) with logit offsets
/// `offset(t, c)`.
inline sample_loss_fn subset_reference(std::function<std::vector<index_t>(index_t)> classes,
                                       std::function<double(index_t, index_t)> offset = {}) {
  return [classes, offset](const ref_params& p, const double* h, index_t t) {
    const std::vector<index_t> set = classes(t);
    test_vector<double> s;
    double target = 0;
    bool found = false;
    for (index_t c : set) {
      const double v = p.score(c, h) + (offset ? offset(t, c) : 0.0);
      s.push_back(v);
      if (c == t) target = v, found = true;
    }
    REQUIRE(found);
    return logsumexp(s) - target;
  };
}

/// The same class list for every target.
inline sample_loss_fn shared_reference(const std::vector<index_t>& set) {
  return subset_reference([set](index_t) { return set; });
}

/// Sorted unique union of `a` and the targets that are not `ignore_index`.
template <class Targets = std::vector<index_t>>
std::vector<index_t> with_targets(std::vector<index_t> a, const Targets& targets, index_t ignore_index = -100) {
  for (index_t t : targets)
    if (t != ignore_index) a.push_back(t);
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

/// Bitwise equality of the outputs of two heads of different types.
template <class HeadA, class HeadB>
bool same_outputs_across(const head_outputs<HeadA>& a, const head_outputs<HeadB>& b) {
  return bitwise_equal(&a.loss, &b.loss, 1) && bitwise_equal(a.per_sample, b.per_sample) &&
         bitwise_equal(a.grad_hidden, b.grad_hidden) && a.grad.dim == b.grad.dim &&
         bitwise_equal(on_host(a.grad.rows), on_host(b.grad.rows)) &&
         bitwise_equal(on_host(a.grad.values), on_host(b.grad.values)) &&
         bitwise_equal(on_host(a.grad.bias_values), on_host(b.grad.bias_values));
}

/// A head over bf16/fp16 weights with gathered columns (selective, KNN) against the full softmax
/// over the same weights: bitwise on the host backends, where both widen the same rows the same way;
/// within `tol` (relative, against the largest magnitude of each output) on cuda, whose full softmax
/// runs its tensor-core path (hidden rows rounded to the storage type, dense_tuned.cuh) while
/// gathered columns take the generic fp32 kernels (`dense_softmax_tuning::applies`).
template <class HeadA, class HeadB>
void check_low_precision_outputs_across(const head_outputs<HeadA>& a, const head_outputs<HeadB>& b, double tol,
                                        const std::string& what) {
#if XSOFTMAX_TEST_HOST_BUILD
  (void)tol;
  CHECK_MESSAGE(same_outputs_across(a, b), what, ": not bitwise the full softmax's outputs");
#else
  const auto close = [&](const auto& x, const auto& y, const char* name) {
    const auto hx = on_host(x), hy = on_host(y);
    check_close(hx, hy, tol * std::max(largest_magnitude(hy), 1e-6), 0.0, what + ": " + name);
  };
  close(std::vector<float>{a.loss}, std::vector<float>{b.loss}, "loss");
  close(a.per_sample, b.per_sample, "per-sample losses");
  close(a.grad_hidden, b.grad_hidden, "grad_hidden");
  CHECK(a.grad.dim == b.grad.dim);
  CHECK_MESSAGE(bitwise_equal(on_host(a.grad.rows), on_host(b.grad.rows)), what, ": gradient rows differ");
  close(a.grad.values, b.grad.values, "weight gradient");
  close(a.grad.bias_values, b.grad.bias_values, "bias gradient");
#endif
}

/// The rows of a sparse gradient as a std::vector.
template <class Gradient>
std::vector<index_t> gradient_rows(const Gradient& g) {
  return std::vector<index_t>(g.rows.begin(), g.rows.end());
}

/// The per-sample candidate lists the loss-term and margin tests use (the gather-dot path): for
/// target t, the sorted unique {5t + 2, t + 9, 3t + 1, t} mod n; an ignored row gets {0}.
inline std::vector<index_t> mixed_candidates_of(index_t t, index_t n) {
  std::vector<index_t> c{(t * 5 + 2) % n, (t + 9) % n, (t * 3 + 1) % n, t};
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

/// An `explicit_candidates` selector holding `mixed_candidates_of` each of `targets` (rows [0, batch)).
template <class Targets>
xsoftmax::explicit_candidates mixed_per_sample_candidates(const Targets& targets, index_t batch, index_t n) {
  std::vector<index_t> offsets{0}, ids;
  for (index_t i = 0; i < batch; ++i) {
    const auto c = targets[i] < 0 ? std::vector<index_t>{0} : mixed_candidates_of(targets[i], n);
    ids.insert(ids.end(), c.begin(), c.end());
    offsets.push_back(static_cast<index_t>(ids.size()));
  }
  xsoftmax::explicit_candidates per_sample;
  per_sample.set_per_sample(offsets, ids);
  return per_sample;
}

}  // namespace xsoftmax_test
