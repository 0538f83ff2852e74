// SPDX-License-Identifier: Apache-2.0
// The `_async` verbs on the host backends: each one equals its blocking verb bit for bit. They are
// separate paths (the head's run_async_ / topk_async_ / log_distribution_async_, as on cuda, against
// run_ / topk_ / log_distribution_), so a queue-only form that goes wrong on every backend fails
// here, without a GPU: a hierarchical softmax that reduced the loss of backward_async into a null
// pointer crashed the first GPU run and crashes this test on the host. The full softmax's
// forward_async also equals the float64 reference on its own (so the test does not rest on the
// blocking verb being right); a loss view that is not one element throws shape_error and changes
// nothing. The cuda backend's async path is tested in
// tests/cuda/async_cuda_test.cu.

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if XSOFTMAX_TEST_HOST_BUILD  // the host backends' semantics (outputs complete on return)

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

template <class B>
using fs32 = xsoftmax::full_softmax<xsoftmax::fp32, B>;

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE_TEMPLATE("async: full_softmax's _async verbs equal the blocking verbs bit for bit", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(71);
  const index_t n = 41, d = 8, batch = 13;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.25);
    p.targets[2] = -100;  // at least one ignored sample
    fs32<B> head(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    head.set_chunk_size(9);  // a ragged last chunk
    const auto hb = make_hidden<float>(p.h, batch, d, 2);
    test_vector<float> grad_output = random_floats(rng, batch, 1.0);
    for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
      loss_options opt;
      opt.reduce = r;
      const std::string what = std::string(bias ? "bias, " : "no bias, ") + "reduction " + reduction_name(r);
      const test_vector<float> up = r == reduction::none ? grad_output : test_vector<float>{0.5f};

      // forward
      test_vector<float> per_a(static_cast<size_t>(batch), nan_f), per_b(static_cast<size_t>(batch), nan_f);
      const float loss_a = head.forward(hb.view(), cvec(p.targets), opt, mvec(per_a));
      test_vector<float> loss_b(1, nan_f);
      head.forward_async(hb.view(), cvec(p.targets), mvec(loss_b), opt, mvec(per_b));
      CHECK_MESSAGE(bitwise_equal(&loss_a, loss_b.data(), 1), what, ": forward_async loss ", loss_b[0], " vs ", loss_a);
      CHECK_MESSAGE(bitwise_equal(per_a, per_b), what, ": forward_async per-sample losses");
      // Independently of the blocking verb: the async outputs against the float64 reference.
      {
        ref_params rp;
        rp.rows = n;
        rp.dim = d;
        rp.w = to_doubles(p.w);
        if (bias) rp.b = to_doubles(p.b);
        double total = 0;
        index_t counted = 0;
        for (index_t i = 0; i < batch; ++i) {
          const index_t t = p.targets[static_cast<size_t>(i)];
          const double want = t == -100 ? 0.0 : full_sample_loss(rp, to_doubles(p.h).data() + i * d, t);
          CHECK_MESSAGE(per_b[static_cast<size_t>(i)] == doctest::Approx(want).epsilon(1e-5), what,
                        ": forward_async per-sample loss ", i);
          if (t != -100) total += want, ++counted;
        }
        const double want_loss = r == reduction::mean ? total / static_cast<double>(counted) : total;
        CHECK_MESSAGE(loss_b[0] == doctest::Approx(want_loss).epsilon(1e-5), what, ": forward_async loss vs float64");
      }

      // forward_backward
      const auto fb = run_forward_backward(head, hb, p.targets, opt, up);
      head_outputs<fs32<B>> fa;
      fa.per_sample.assign(static_cast<size_t>(batch), nan_f);
      fa.grad_hidden.assign(static_cast<size_t>(batch * d), nan_f);
      test_vector<float> loss_c(1, nan_f);
      head.forward_backward_async(hb.view(), cvec(p.targets), mview(fa.grad_hidden, batch, d), fa.grad,
                                  mvec(loss_c), opt, mvec(fa.per_sample), cvec(up));
      fa.loss = loss_c[0];
      CHECK_MESSAGE(same_outputs(fa, fb), what, ": forward_backward_async differs from forward_backward");

      // backward
      typename fs32<B>::gradient_type g_a, g_b;
      test_vector<float> gh_a(static_cast<size_t>(batch * d), nan_f), gh_b(static_cast<size_t>(batch * d), nan_f);
      head.backward(hb.view(), cvec(p.targets), mview(gh_a, batch, d), g_a, opt, cvec(up));
      head.backward_async(hb.view(), cvec(p.targets), mview(gh_b, batch, d), g_b, opt, cvec(up));
      CHECK_MESSAGE(bitwise_equal(gh_a, gh_b), what, ": backward_async grad_hidden");
      CHECK_MESSAGE(same_gradient(g_a, g_b), what, ": backward_async weight gradient");
    }

    // log_prob (every target a class)
    test_vector<index_t> valid = p.targets;
    for (auto& t : valid) t = t < 0 ? 0 : t;
    test_vector<float> lp_a(static_cast<size_t>(batch), nan_f), lp_b(static_cast<size_t>(batch), nan_f);
    head.log_prob(hb.view(), cvec(valid), mvec(lp_a));
    head.log_prob_async(hb.view(), cvec(valid), mvec(lp_b));
    CHECK(bitwise_equal(lp_a, lp_b));

    // topk
    const index_t k = 4;
    test_vector<index_t> cls_a(static_cast<size_t>(batch * k), -7), cls_b(static_cast<size_t>(batch * k), -7);
    test_vector<float> tp_a(static_cast<size_t>(batch * k), nan_f), tp_b(static_cast<size_t>(batch * k), nan_f);
    head.topk(hb.view(), k, mview(cls_a, batch, k), mview(tp_a, batch, k));
    head.topk_async(hb.view(), k, mview(cls_b, batch, k), mview(tp_b, batch, k));
    CHECK(bitwise_equal(cls_a, cls_b));
    CHECK(bitwise_equal(tp_a, tp_b));

    // log_distribution of a class range
    const index_t lo = 5, hi = 30, m = hi - lo;
    test_vector<float> ld_a(static_cast<size_t>(batch * m), nan_f), ld_b(static_cast<size_t>(batch * m), nan_f);
    head.log_distribution(hb.view(), lo, hi, mview(ld_a, batch, m));
    head.log_distribution_async(hb.view(), lo, hi, mview(ld_b, batch, m));
    CHECK(bitwise_equal(ld_a, ld_b));
  }
}

TEST_CASE_TEMPLATE("async: hierarchical_softmax's _async verbs equal the blocking verbs bit for bit", B,
                   XSOFTMAX_TEST_BACKENDS) {
  using tree_t = xsoftmax::uniform_tree<2, 8>;
  using head_t = xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B>;
  test_rng rng(72);
  const tree_t tree(50);
  const index_t n = tree.num_classes(), rows = head_t::weight_rows(tree), d = 6, batch = 19;
  problem p = make_problem(rng, rows, n, d, batch, true, 0.2);
  head_t head(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  const test_vector<float> per_sample_up = random_floats(rng, batch, 1.0);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const std::string what = std::string("HS, reduction ") + reduction_name(r);
    const test_vector<float> up = r == reduction::none ? per_sample_up : test_vector<float>{1.5f};
    test_vector<float> per_a(static_cast<size_t>(batch), nan_f), per_b(static_cast<size_t>(batch), nan_f);
    test_vector<float> loss_b(1, nan_f);
    const float loss_a = head.forward(hb.view(), cvec(p.targets), opt, mvec(per_a));
    head.forward_async(hb.view(), cvec(p.targets), mvec(loss_b), opt, mvec(per_b));
    CHECK_MESSAGE(bitwise_equal(&loss_a, loss_b.data(), 1), what, ": forward_async loss ", loss_b[0], " vs ", loss_a);
    CHECK_MESSAGE(bitwise_equal(per_a, per_b), what, ": forward_async per-sample losses");

    const auto fb = run_forward_backward(head, hb, p.targets, opt, up);
    head_outputs<head_t> fa;
    fa.per_sample.assign(static_cast<size_t>(batch), nan_f);
    fa.grad_hidden.assign(static_cast<size_t>(batch * d), nan_f);
    head.forward_backward_async(hb.view(), cvec(p.targets), mview(fa.grad_hidden, batch, d), fa.grad, mvec(loss_b),
                                opt, mvec(fa.per_sample), cvec(up));
    fa.loss = loss_b[0];
    CHECK_MESSAGE(same_outputs(fa, fb), what, ": forward_backward_async differs from forward_backward");

    typename head_t::gradient_type g_b;
    test_vector<float> gh_b(static_cast<size_t>(batch * d), nan_f);
    head.backward_async(hb.view(), cvec(p.targets), mview(gh_b, batch, d), g_b, opt, cvec(up));
    CHECK_MESSAGE(bitwise_equal(gh_b, fb.grad_hidden), what, ": backward_async grad_hidden");
    CHECK_MESSAGE(same_gradient(g_b, fb.grad), what, ": backward_async weight gradient");
  }
  test_vector<index_t> valid = p.targets;
  for (auto& t : valid) t = t < 0 ? 0 : t;
  test_vector<float> lp_a(static_cast<size_t>(batch), nan_f), lp_b(static_cast<size_t>(batch), nan_f);
  head.log_prob(hb.view(), cvec(valid), mvec(lp_a));
  head.log_prob_async(hb.view(), cvec(valid), mvec(lp_b));
  CHECK(bitwise_equal(lp_a, lp_b));
  const index_t k = 3;
  test_vector<index_t> cls_a(static_cast<size_t>(batch * k)), cls_b(static_cast<size_t>(batch * k));
  test_vector<float> tp_a(static_cast<size_t>(batch * k)), tp_b(static_cast<size_t>(batch * k));
  head.topk(hb.view(), k, mview(cls_a, batch, k), mview(tp_a, batch, k));
  head.topk_async(hb.view(), k, mview(cls_b, batch, k), mview(tp_b, batch, k));
  CHECK(cls_a == cls_b);
  CHECK(bitwise_equal(tp_a, tp_b));
  test_vector<float> ld_a(static_cast<size_t>(batch * n), nan_f), ld_b(static_cast<size_t>(batch * n), nan_f);
  head.log_distribution(hb.view(), 0, n, mview(ld_a, batch, n));
  head.log_distribution_async(hb.view(), 0, n, mview(ld_b, batch, n));
  CHECK(bitwise_equal(ld_a, ld_b));
  // A loss view of the wrong size is rejected before anything runs.
  test_vector<float> two(2, nan_f);
  CHECK_THROWS_AS(head.forward_async(hb.view(), cvec(p.targets), mvec(two)), xsoftmax::shape_error);
}

TEST_CASE_TEMPLATE("async: a loss view that is not one element throws shape_error and changes nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(72);
  const index_t n = 10, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, true);
  const fs32<B> head(mview(p.w, n, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> two(2, nan_f), per(static_cast<size_t>(batch), nan_f), gh(static_cast<size_t>(batch * d), nan_f);
  typename fs32<B>::gradient_type g;
  CHECK_THROWS_AS(head.forward_async(hb.view(), cvec(p.targets), xsoftmax::vector_view<float>{}, {}, mvec(per)),
                  xsoftmax::shape_error);
  CHECK_THROWS_AS(head.forward_async(hb.view(), cvec(p.targets), mvec(two), {}, mvec(per)), xsoftmax::shape_error);
  CHECK_THROWS_AS(head.forward_backward_async(hb.view(), cvec(p.targets), mview(gh, batch, d), g, mvec(two)),
                  xsoftmax::shape_error);
  CHECK_THROWS_WITH(head.forward_async(hb.view(), cvec(p.targets), mvec(two)),
                    "xsoftmax: full_softmax::forward_async: loss has 2 entries; it receives the reduced loss (1)");
  CHECK(std::isnan(two[0]));
  CHECK(std::isnan(two[1]));
  CHECK(std::isnan(per[0]));
  CHECK(std::isnan(gh[0]));
  CHECK(g.num_rows() == 0);
}

TEST_CASE_TEMPLATE("async: on the host backends the _async verbs throw the blocking verbs' data errors", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(73);
  const index_t n = 10, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const fs32<B> head(mview(p.w, n, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> bad = p.targets;
  bad[1] = n;  // out of range
  test_vector<float> loss(1, nan_f);
  std::string blocking, async;
  try {
    (void)head.forward(hb.view(), cvec(bad));
  } catch (const xsoftmax::out_of_range& e) {
    blocking = e.what();
  }
  try {
    head.forward_async(hb.view(), cvec(bad), mvec(loss));
  } catch (const xsoftmax::out_of_range& e) {
    async = e.what();
  }
  CHECK(!blocking.empty());
  CHECK(async == blocking);
  CHECK(std::isnan(loss[0]));
}

#endif  // XSOFTMAX_TEST_HOST_BUILD
