// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Checks shared by the head tests: a random problem (weights, bias, hidden batch, targets), a
/// head's forward pass against the float64 reference, its gradients against central finite
/// differences of that reference, and running a head to collect everything it outputs.

#include "support/reference.hpp"

#include <xsoftmax/types.hpp>

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

namespace xsoftmax_test {

/// Tolerances of an fp32 head against the float64 reference on the small problems of these tests
/// (dim <= 16, |scores| <~ 5): every score is an fp32 dot product of <= 16 terms (relative error
/// ~16 * 2^-24 ~ 1e-6 of sum |h w|), and a log-sum-exp over <= 1000 classes adds a few ulps; losses
/// are O(1..10), so 2e-5 absolute + 2e-5 relative leaves a margin of ~10x while a wrong term
/// (a missed class, a bias left out, a wrong ignore) is off by >= 1e-2.
constexpr double loss_atol = 2e-5, loss_rtol = 2e-5;
/// Gradients are O(0.01..1); fp32 accumulates <= 1000 terms of products of such values: 3e-5
/// absolute + 1e-4 relative. The finite differences themselves are accurate to ~1e-10.
constexpr double grad_atol = 3e-5, grad_rtol = 1e-4;

/// Weights, optional bias, hidden batch and targets of one random problem, all in fp32.
struct problem {
  index_t rows = 0;        ///< weight rows
  index_t dim = 0;
  index_t batch = 0;
  index_t num_classes = 0;
  test_vector<float> w;    ///< rows x dim
  test_vector<float> b;    ///< rows entries, or empty
  test_vector<float> h;    ///< batch x dim
  test_vector<index_t> targets;

  [[nodiscard]] bool has_bias() const { return !b.empty(); }
  [[nodiscard]] ref_params params() const {
    ref_params p;
    p.rows = rows;
    p.dim = dim;
    p.w = to_doubles(w);
    p.b = to_doubles(b);
    return p;
  }
};

/// Weights uniform in [-1, 1] (scores of a few units over dim 8..16 hidden values in [-1, 1]: the
/// softmax is neither flat nor saturated), bias in [-1, 1].
inline problem make_problem(test_rng& rng, index_t rows, index_t num_classes, index_t dim, index_t batch,
                            bool bias, double ignore_fraction = 0.0) {
  problem p;
  p.rows = rows;
  p.dim = dim;
  p.batch = batch;
  p.num_classes = num_classes;
  p.w = random_floats(rng, rows * dim, 1.0);
  if (bias) p.b = random_floats(rng, rows, 1.0);
  p.h = random_floats(rng, batch * dim, 1.0);
  p.targets = random_targets(rng, batch, num_classes, ignore_fraction);
  return p;
}

/// A hidden batch of element type H (rows x dim stored with `stride`, padding filled with NaN so a
/// head that reads past `cols` is caught) and the exact double values the head sees.
template <class H>
struct hidden_batch {
  index_t rows = 0, dim = 0, stride = 0;
  test_vector<H> storage;
  [[nodiscard]] xsoftmax::matrix_view<const H> view() const { return {storage.data(), rows, dim, stride}; }
  [[nodiscard]] ref_batch reference(const test_vector<index_t>& targets) const {
    ref_batch b;
    b.rows = rows;
    b.dim = dim;
    b.targets = targets;
    b.h.resize(static_cast<size_t>(rows * dim));
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = 0; j < dim; ++j)
        b.h[static_cast<size_t>(i * dim + j)] = as_double(storage[static_cast<size_t>(i * stride + j)]);
    return b;
  }
};

template <class H>
hidden_batch<H> make_hidden(const test_vector<float>& dense, index_t rows, index_t dim, index_t padding = 0) {
  hidden_batch<H> hb;
  hb.rows = rows;
  hb.dim = dim;
  hb.stride = dim + padding;
  hb.storage.assign(static_cast<size_t>(rows * hb.stride),
                    xsoftmax::from_float<H>(std::numeric_limits<float>::quiet_NaN()));
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < dim; ++j)
      hb.storage[static_cast<size_t>(i * hb.stride + j)] = xsoftmax::from_float<H>(dense[static_cast<size_t>(i * dim + j)]);
  return hb;
}

/// Everything one `forward_backward` call outputs.
template <class Head>
struct head_outputs {
  float loss = 0;
  test_vector<float> per_sample;
  test_vector<float> grad_hidden;
  typename Head::gradient_type grad;
};

/// Runs `forward_backward` (reduction per `opt`, per-sample losses always requested).
template <class Head, class H>
head_outputs<Head> run_forward_backward(const Head& head, const hidden_batch<H>& hb,
                                        const test_vector<index_t>& targets, xsoftmax::loss_options opt,
                                        const test_vector<float>& grad_output = {}) {
  head_outputs<Head> out;
  out.per_sample.assign(static_cast<size_t>(hb.rows), std::numeric_limits<float>::quiet_NaN());
  out.grad_hidden.assign(static_cast<size_t>(hb.rows * hb.dim), std::numeric_limits<float>::quiet_NaN());
  out.loss = head.forward_backward(hb.view(), cvec(targets), mview(out.grad_hidden, hb.rows, hb.dim), out.grad, opt,
                                   mvec(out.per_sample), cvec(grad_output));
  return out;
}

template <class Head>
bool same_outputs(const head_outputs<Head>& a, const head_outputs<Head>& b) {
  return bitwise_equal(&a.loss, &b.loss, 1) && bitwise_equal(a.per_sample, b.per_sample) &&
         bitwise_equal(a.grad_hidden, b.grad_hidden) && same_gradient(a.grad, b.grad);
}

/// `forward` against the reference: the returned value for `opt.reduce`, and the per-sample losses.
template <class Head, class H>
void check_forward(const Head& head, const sample_loss_fn& ref, const ref_params& params, const hidden_batch<H>& hb,
                   const test_vector<index_t>& targets, xsoftmax::loss_options opt, const std::string& what) {
  const ref_batch rb = hb.reference(targets);
  test_vector<double> per_ref;
  double reduced = 0;
  reference_objective(ref, params, rb, opt, {}, &per_ref, &reduced);
  test_vector<float> per(static_cast<size_t>(hb.rows), std::numeric_limits<float>::quiet_NaN());
  const float loss = head.forward(hb.view(), cvec(targets), opt, mvec(per));
  check_close(loss, reduced, loss_atol, loss_rtol, what + ": forward value");
  check_close(per, per_ref, loss_atol, loss_rtol, what + ": per-sample losses");
  if (opt.reduce != xsoftmax::reduction::none) {  // per_sample is optional for mean / sum
    const float again = head.forward(hb.view(), cvec(targets), opt);
    CHECK_MESSAGE(bitwise_equal(&again, &loss, 1), what, ": forward without per_sample gives ", again, " vs ", loss);
  }
}

/// `forward_backward` against the reference and central finite differences of it: the loss, the
/// per-sample losses, grad_hidden, the sparse weight gradient scattered to dense rows (untouched rows
/// must have a zero finite difference) and the bias gradient. Then `backward` must equal
/// `forward_backward` bit for bit. Returns the gradient for further checks.
template <class Head, class H>
head_outputs<Head> check_gradients(const Head& head, const sample_loss_fn& ref, const ref_params& params,
                                   const hidden_batch<H>& hb, const test_vector<index_t>& targets,
                                   xsoftmax::loss_options opt, const test_vector<float>& grad_output,
                                   const std::string& what) {
  const ref_batch rb = hb.reference(targets);
  test_vector<double> per_ref;
  double reduced = 0;
  reference_objective(ref, params, rb, opt, grad_output, &per_ref, &reduced);
  const fd_gradients fd = finite_differences(ref, params, rb, opt, grad_output);

  head_outputs<Head> out = run_forward_backward(head, hb, targets, opt, grad_output);
  check_close(out.loss, reduced, loss_atol, loss_rtol, what + ": forward_backward value");
  check_close(out.per_sample, per_ref, loss_atol, loss_rtol, what + ": forward_backward per-sample losses");
  check_close(out.grad_hidden, fd.h, grad_atol, grad_rtol, what + ": grad_hidden vs finite differences");
  const dense_gradient dg = scatter_gradient(out.grad, params.rows, params.dim, !params.b.empty());
  check_close(dg.w, fd.w, grad_atol, grad_rtol, what + ": weight gradient vs finite differences");
  check_close(dg.b, fd.b, grad_atol, grad_rtol, what + ": bias gradient vs finite differences");

  // backward alone: the same gradients, bit for bit.
  test_vector<float> gh(static_cast<size_t>(hb.rows * hb.dim), 7.f);
  typename Head::gradient_type g;
  head.backward(hb.view(), cvec(targets), mview(gh, hb.rows, hb.dim), g, opt, cvec(grad_output));
  CHECK_MESSAGE(bitwise_equal(gh, out.grad_hidden), what, ": backward's grad_hidden differs from forward_backward's");
  CHECK_MESSAGE(same_gradient(g, out.grad), what, ": backward's weight gradient differs from forward_backward's");
  return out;
}

/// Per-sample upstream gradients for reduction none (some negative, none zero).
inline test_vector<float> random_grad_output(test_rng& rng, index_t n) {
  test_vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = static_cast<float>(rng.uniform(0.25, 1.5) * (rng.coin(0.3) ? -1 : 1));
  return g;
}

inline const char* reduction_name(xsoftmax::reduction r) {
  return r == xsoftmax::reduction::none ? "none" : r == xsoftmax::reduction::mean ? "mean" : "sum";
}

}  // namespace xsoftmax_test

namespace xsoftmax_test {

/// A head's top-k of one row (`cls`, `lps`: k entries) against the reference distribution of that
/// row (`ref`: N log-probabilities): distinct valid classes, log-probabilities that are the classes'
/// own and non-increasing, and the k largest of the reference up to near-ties (where two reference
/// values are within fp32 evaluation error, either order is right).
inline void check_topk_row(const double* ref, index_t n, const index_t* cls, const float* lps, index_t k,
                           const std::string& what) {
  test_vector<double> sorted(ref, ref + n);
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  test_vector<char> seen(static_cast<size_t>(n), 0);
  for (index_t j = 0; j < k; ++j) {
    INFO(what, ": rank ", j, " of k = ", k);
    const index_t c = cls[j];
    REQUIRE(c >= 0);
    REQUIRE(c < n);
    CHECK(seen[static_cast<size_t>(c)] == 0);
    seen[static_cast<size_t>(c)] = 1;
    CHECK(std::abs(lps[j] - ref[c]) <= 2e-5 * (1 + std::abs(ref[c])));
    CHECK(std::abs(ref[c] - sorted[static_cast<size_t>(j)]) <= 2e-5 * (1 + std::abs(ref[c])));
    if (j > 0) CHECK(lps[j] <= lps[j - 1]);
  }
}

}  // namespace xsoftmax_test
