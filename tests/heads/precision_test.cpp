// SPDX-License-Identifier: Apache-2.0
// bf16 / fp16 weight storage against fp32, with the tolerances derived below.
//
// Rounding a weight w to a storage type with p significand bits (round to nearest even) changes it by
// at most u * |w|, u = 2^-p the unit roundoff: bf16 has p = 8 (7 stored bits), so u = 2^-8; fp16 has
// p = 11, so u = 2^-11, for normal values; below 2^-14 fp16 is subnormal and the error is at most
// half its spacing, 2^-25. Arithmetic is fp32 in every head. Hence three comparisons:
//  1. the bf16/fp16 head against the fp32 head given the *same rounded weights*: both compute in fp32
//     from the same values, so they agree to fp32 evaluation error (1e-6 absolute + 1e-5 relative,
//     rounding error of a few hundred fp32 operations); a head that accumulated in its storage type
//     would be off by ~u = 4e-3;
//  2. the same head against the float64 reference on the rounded weights (and its gradients against
//     finite differences): it is an exact softmax over the weights it stores;
//  3. against the fp32 head on the *unrounded* weights, within a bound computed from the data: with
//     e(x) the rounding error bound of x, each score s_c = h . w_c + b_c moves by at most
//     D_c = sum_p |h_p| e(w_cp) + e(b_c); a log-sum-exp moves by at most max_c D_c and the target's
//     score by D_t, so a softmax's -log p moves by at most 2 max_c D_c (summed over the levels of an
//     HS path, with the max over each node's block). Probabilities move by a factor within
//     exp(+-2 max D), which bounds the gradients' change (see `full_gradient_bounds`).

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

template <class Precision, class Backend>
struct combo {
  using precision = Precision;
  using backend = Backend;
  using storage = typename Precision::storage_type;
};

/// Bound on |round(x) - x| for the storage type T (see the file comment).
template <class T>
double rounding_error_bound(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return std::ldexp(std::abs(x), -8);
  else return std::max(std::ldexp(std::abs(x), -11), std::ldexp(1.0, -25));
}

/// D[i * rows + c]: bound on how much row c's score for sample i moves when weights and bias are
/// rounded to T.
template <class T>
test_vector<double> score_error_bounds(const problem& p) {
  test_vector<double> bound(static_cast<size_t>(p.batch * p.rows));
  for (index_t i = 0; i < p.batch; ++i)
    for (index_t c = 0; c < p.rows; ++c) {
      double s = p.has_bias() ? rounding_error_bound<T>(p.b[static_cast<size_t>(c)]) : 0.0;
      for (index_t j = 0; j < p.dim; ++j)
        s += std::abs(p.h[static_cast<size_t>(i * p.dim + j)]) *
             rounding_error_bound<T>(p.w[static_cast<size_t>(c * p.dim + j)]);
      bound[static_cast<size_t>(i * p.rows + c)] = s;
    }
  return bound;
}

/// The problem with weights and bias rounded through T (the values a T head stores).
template <class T>
problem rounded(problem p) {
  p.w = rounded_through<T>(p.w);
  p.b = rounded_through<T>(p.b);
  return p;
}

}  // namespace

TEST_CASE_TEMPLATE("precision: full_softmax with bf16 / fp16 weights against fp32", C,
                   combo<xsoftmax::bf16, xsoftmax::serial>, combo<xsoftmax::fp16, xsoftmax::serial>,
                   combo<xsoftmax::bf16, xsoftmax::omp>, combo<xsoftmax::fp16, xsoftmax::omp>) {
  using B = typename C::backend;
  using T = typename C::storage;
  test_rng rng(301);
  const index_t n = 70, d = 12, batch = 16;
  problem p = make_problem(rng, n, n, d, batch, true, 0.1);
  const problem pr = rounded<T>(p);
  auto wt = convert<T>(p.w), bt = convert<T>(p.b);
  xsoftmax::full_softmax<typename C::precision, B> low(mview(wt, n, d), bt.data());
  problem pr_mutable = pr, p_mutable = p;
  xsoftmax::full_softmax<xsoftmax::fp32, B> same(mview(pr_mutable.w, n, d), pr_mutable.b.data());
  xsoftmax::full_softmax<xsoftmax::fp32, B> exact(mview(p_mutable.w, n, d), p_mutable.b.data());
  low.set_chunk_size(16);
  same.set_chunk_size(16);
  exact.set_chunk_size(16);
  const auto hb = make_hidden<float>(p.h, batch, d);

  // 1. Against fp32 on the same rounded weights.
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const auto a = run_forward_backward(low, hb, p.targets, opt), b = run_forward_backward(same, hb, p.targets, opt);
    const std::string what = std::string(xsoftmax::element_name<T>()) + " vs fp32 on rounded weights, reduction " +
                             reduction_name(r);
    check_close(a.loss, b.loss, 1e-6, 1e-5, what + ": loss");
    check_close(a.per_sample, b.per_sample, 1e-6, 1e-5, what + ": per-sample");
    check_close(a.grad_hidden, b.grad_hidden, 1e-6, 1e-5, what + ": grad_hidden");
    CHECK(a.grad.rows == b.grad.rows);
    check_close(a.grad.values, b.grad.values, 1e-6, 1e-5, what + ": weight gradient");
    check_close(a.grad.bias_values, b.grad.bias_values, 1e-6, 1e-5, what + ": bias gradient");
  }
  // 2. Against the float64 reference on the rounded weights; gradients against finite differences.
  loss_options sum;
  sum.reduce = reduction::sum;
  check_forward(low, full_reference(), pr.params(), hb, p.targets, sum, "reference on rounded weights");
  check_gradients(low, full_reference(), pr.params(), hb, p.targets, sum, {}, "reference on rounded weights");
  // Hidden in the storage type too.
  check_forward(low, full_reference(), pr.params(), make_hidden<T>(p.h, batch, d), p.targets, sum,
                "hidden in the storage type");

  // 3. Against fp32 on the unrounded weights, within the derived bounds.
  const auto D = score_error_bounds<T>(p);
  const auto a = run_forward_backward(low, hb, p.targets, sum), b = run_forward_backward(exact, hb, p.targets, sum);
  double max_diff = 0;
  test_vector<double> delta(static_cast<size_t>(batch), 0.0);  // max_c D_ic per sample
  for (index_t i = 0; i < batch; ++i) {
    for (index_t c = 0; c < n; ++c) delta[static_cast<size_t>(i)] = std::max(delta[static_cast<size_t>(i)], D[static_cast<size_t>(i * n + c)]);
    const double diff = std::abs(a.per_sample[static_cast<size_t>(i)] - b.per_sample[static_cast<size_t>(i)]);
    max_diff = std::max(max_diff, diff);
    INFO("sample ", i, ": |loss difference| ", diff, ", bound ", 2 * delta[static_cast<size_t>(i)]);
    CHECK(diff <= 2 * delta[static_cast<size_t>(i)] + 1e-5);
  }
  CHECK(max_diff > 0);  // the rounding is visible: the comparison is not vacuous
  // Gradients (reduction sum: upstream 1 for each counted sample):
  //  grad_h_i = sum_c (p_ic - y_ic) w_c changes by at most
  //    (exp(2 D_i) - 1) * max_c |w_cj| + 2 * max_c e(w_cj)      (sum_c |dp_ic| <= exp(2 D_i) - 1,
  //                                                              sum_c |p_ic - y_ic| <= 2);
  //  grad_w_c = sum_i (p_ic - y_ic) h_i changes by at most sum_i (exp(2 D_i) - 1) |h_ij|; the bias
  //  gradient likewise with |h_ij| -> 1.
  for (index_t i = 0; i < batch; ++i) {
    if (p.targets[static_cast<size_t>(i)] < 0) continue;
    const double grow = std::expm1(2 * delta[static_cast<size_t>(i)]);
    for (index_t j = 0; j < d; ++j) {
      double wmax = 0, emax = 0;
      for (index_t c = 0; c < n; ++c) {
        wmax = std::max(wmax, static_cast<double>(std::abs(p.w[static_cast<size_t>(c * d + j)])) * 1.01);
        emax = std::max(emax, rounding_error_bound<T>(p.w[static_cast<size_t>(c * d + j)]));
      }
      const size_t at = static_cast<size_t>(i * d + j);
      CHECK(std::abs(a.grad_hidden[at] - b.grad_hidden[at]) <= grow * wmax + 2 * emax + 1e-5);
    }
  }
  for (index_t c = 0; c < n; ++c) {
    double bias_bound = 1e-5;
    for (index_t j = 0; j < d; ++j) {
      double bound = 1e-5;
      for (index_t i = 0; i < batch; ++i)
        if (p.targets[static_cast<size_t>(i)] >= 0)
          bound += std::expm1(2 * delta[static_cast<size_t>(i)]) * std::abs(p.h[static_cast<size_t>(i * d + j)]);
      const size_t at = static_cast<size_t>(c * d + j);
      CHECK(std::abs(a.grad.values[at] - b.grad.values[at]) <= bound);
    }
    for (index_t i = 0; i < batch; ++i)
      if (p.targets[static_cast<size_t>(i)] >= 0) bias_bound += std::expm1(2 * delta[static_cast<size_t>(i)]);
    CHECK(std::abs(a.grad.bias_values[static_cast<size_t>(c)] - b.grad.bias_values[static_cast<size_t>(c)]) <= bias_bound);
  }
}

TEST_CASE_TEMPLATE("precision: hierarchical_softmax with bf16 / fp16 weights against fp32", C,
                   combo<xsoftmax::bf16, xsoftmax::serial>, combo<xsoftmax::fp16, xsoftmax::omp>) {
  using B = typename C::backend;
  using T = typename C::storage;
  using tree_t = xsoftmax::uniform_tree<3, 5>;
  const tree_t tree(90);
  test_rng rng(302);
  const index_t rows = tree.num_rows(), d = 10, batch = 40;
  problem p = make_problem(rng, rows, 90, d, batch, true, 0.1);
  const problem pr = rounded<T>(p);
  auto wt = convert<T>(p.w), bt = convert<T>(p.b);
  problem pr_mutable = pr, p_mutable = p;
  xsoftmax::hierarchical_softmax<tree_t, typename C::precision, B> low(tree, mview(wt, rows, d), bt.data());
  xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> same(tree, mview(pr_mutable.w, rows, d),
                                                                 pr_mutable.b.data());
  xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> exact(tree, mview(p_mutable.w, rows, d),
                                                                  p_mutable.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  for (index_t min_run : {index_t(1), index_t(1) << 40}) {
    low.set_gemm_min_run(min_run);
    same.set_gemm_min_run(min_run);
    exact.set_gemm_min_run(min_run);
    const std::string path = min_run == 1 ? "GEMM path" : "gather-dot path";
    loss_options opt;
    opt.reduce = reduction::sum;
    // 1. Same rounded weights.
    const auto a = run_forward_backward(low, hb, p.targets, opt), b = run_forward_backward(same, hb, p.targets, opt);
    check_close(a.per_sample, b.per_sample, 1e-6, 1e-5, path + ": per-sample vs fp32 on rounded weights");
    check_close(a.grad_hidden, b.grad_hidden, 1e-6, 1e-5, path + ": grad_hidden vs fp32 on rounded weights");
    CHECK(a.grad.rows == b.grad.rows);
    check_close(a.grad.values, b.grad.values, 1e-6, 1e-5, path + ": weight gradient vs fp32 on rounded weights");
    check_close(a.grad.bias_values, b.grad.bias_values, 1e-6, 1e-5, path + ": bias gradient vs fp32 on rounded weights");
    // 2. Reference on the rounded weights.
    check_gradients(low, hs_reference(tree.view()), pr.params(), hb, p.targets, opt, {}, path + ": reference");
    check_forward(low, hs_reference(tree.view()), pr.params(), make_hidden<T>(p.h, batch, d), p.targets, opt,
                  path + ": hidden in the storage type");
    // 3. Unrounded weights: sum over the path's levels of 2 max_{j in block} D_ij.
    const auto D = score_error_bounds<T>(p);
    const auto e = run_forward_backward(exact, hb, p.targets, opt);
    double max_diff = 0;
    for (index_t i = 0; i < batch; ++i) {
      const index_t t = p.targets[static_cast<size_t>(i)];
      if (t < 0) continue;
      double bound = 1e-5;
      for (int l = 0; l < tree.depth(t); ++l) {
        const auto s = tree.step(t, l);
        double m = 0;
        for (index_t j = 0; j < s.block_size; ++j) m = std::max(m, D[static_cast<size_t>(i * rows + s.block_begin + j)]);
        bound += 2 * m;
      }
      const double diff = std::abs(a.per_sample[static_cast<size_t>(i)] - e.per_sample[static_cast<size_t>(i)]);
      max_diff = std::max(max_diff, diff);
      INFO(path, ": sample ", i, " |loss difference| ", diff, " bound ", bound);
      CHECK(diff <= bound);
    }
    CHECK(max_diff > 0);
  }
}

TEST_CASE_TEMPLATE("precision: sigmoid-node HS with bf16 / fp16 weights matches the reference on rounded weights", C,
                   combo<xsoftmax::bf16, xsoftmax::omp>, combo<xsoftmax::fp16, xsoftmax::serial>) {
  using B = typename C::backend;
  using T = typename C::storage;
  test_rng rng(303);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 50), 2);
  const index_t rows = tree.num_rows() / 2, d = 8, batch = 20;
  problem p = make_problem(rng, rows, 50, d, batch, true, 0.1);
  const problem pr = rounded<T>(p);
  auto wt = convert<T>(p.w), bt = convert<T>(p.b);
  xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, typename C::precision, B, xsoftmax::sigmoid_nodes> low(
      tree, mview(wt, rows, d), bt.data());
  loss_options opt;
  opt.reduce = reduction::mean;
  check_gradients(low, hs_reference(tree.view(), true), pr.params(), make_hidden<float>(p.h, batch, d), p.targets, opt,
                  {}, "sigmoid nodes, rounded weights");
}

TEST_CASE_TEMPLATE("precision: apply_sgd on bf16 / fp16 weights rounds w - lr * g once", C,
                   combo<xsoftmax::bf16, xsoftmax::serial>, combo<xsoftmax::fp16, xsoftmax::omp>) {
  using B = typename C::backend;
  using T = typename C::storage;
  test_rng rng(304);
  using tree_t = xsoftmax::uniform_tree<2, 6>;
  const tree_t tree(30);
  const index_t rows = tree.num_rows(), d = 6, batch = 4;
  problem p = make_problem(rng, rows, 30, d, batch, true);
  auto wt = convert<T>(p.w), bt = convert<T>(p.b);
  const auto w0 = wt, b0 = bt;
  xsoftmax::hierarchical_softmax<tree_t, typename C::precision, B> head(tree, mview(wt, rows, d), bt.data());
  typename decltype(head)::gradient_type g;
  test_vector<float> gh(static_cast<size_t>(batch * d));
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(gh, batch, d), g);
  const float lr = 0.5f;
  head.apply_sgd(g, lr);
  test_vector<char> updated(static_cast<size_t>(rows), 0);
  index_t changed = 0;
  for (index_t i = 0; i < g.num_rows(); ++i) {
    const index_t r = g.rows[static_cast<size_t>(i)];
    updated[static_cast<size_t>(r)] = 1;
    for (index_t j = 0; j < d; ++j) {
      const size_t at = static_cast<size_t>(r * d + j);
      const T expect = xsoftmax::from_float<T>(xsoftmax::to_float(w0[at]) - lr * g.values[static_cast<size_t>(i * d + j)]);
      CHECK(bitwise_equal(&wt[at], &expect, 1));
      changed += !bitwise_equal(&wt[at], &w0[at], 1);
    }
    const T expect_b = xsoftmax::from_float<T>(xsoftmax::to_float(b0[static_cast<size_t>(r)]) -
                                               lr * g.bias_values[static_cast<size_t>(i)]);
    CHECK(bitwise_equal(&bt[static_cast<size_t>(r)], &expect_b, 1));
  }
  CHECK(changed > 0);
  for (index_t r = 0; r < rows; ++r)
    if (!updated[static_cast<size_t>(r)]) {
      CHECK(bitwise_equal(wt.data() + r * d, w0.data() + r * d, static_cast<size_t>(d)));
      CHECK(bitwise_equal(&bt[static_cast<size_t>(r)], &b0[static_cast<size_t>(r)], 1));
    }
}

TEST_CASE("precision: storage conversions round to nearest even") {
  // bf16 keeps 8 significand bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and rounds to even (1);
  // 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  CHECK(xsoftmax::to_float(xsoftmax::from_float<__nv_bfloat16>(1.f + std::ldexp(1.f, -8))) == 1.f);
  CHECK(xsoftmax::to_float(xsoftmax::from_float<__nv_bfloat16>(1.f + 3 * std::ldexp(1.f, -8))) ==
        1.f + std::ldexp(1.f, -6));
  // fp16 keeps 11: the same one level finer.
  CHECK(xsoftmax::to_float(xsoftmax::from_float<__half>(1.f + std::ldexp(1.f, -11))) == 1.f);
  CHECK(xsoftmax::to_float(xsoftmax::from_float<__half>(1.f + 3 * std::ldexp(1.f, -11))) == 1.f + std::ldexp(1.f, -9));
  // The relative error bounds used above hold on random values.
  test_rng rng(305);
  for (int i = 0; i < 2000; ++i) {
    const float x = static_cast<float>(rng.uniform(-4, 4));
    CHECK(std::abs(xsoftmax::to_float(xsoftmax::from_float<__nv_bfloat16>(x)) - x) <= rounding_error_bound<__nv_bfloat16>(x));
    CHECK(std::abs(xsoftmax::to_float(xsoftmax::from_float<__half>(x)) - x) <= rounding_error_bound<__half>(x));
  }
  CHECK(xsoftmax::to_float(2.5) == 2.5f);
  CHECK(std::string(xsoftmax::element_name<__nv_bfloat16>()) == "bf16");
  CHECK(std::string(xsoftmax::element_name<__half>()) == "fp16");
}
