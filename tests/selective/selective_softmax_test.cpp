// SPDX-License-Identifier: Apache-2.0
// selective_softmax with explicit candidates: every class active equals full_softmax bit for bit;
// shared and per-sample candidate lists against the float64 reference and central finite
// differences; gradient rows are exactly the active rows; prediction verbs score every class;
// malformed candidates raise typed errors. Every backend of the build (serial and omp; cuda in the nvcc-built GPU tests).

#include "selective/selection_support.hpp"

#include <xsoftmax/detail/selection/scratch_active_set.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::explicit_candidates;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

constexpr reduction all_reductions[] = {reduction::none, reduction::mean, reduction::sum};

template <class B, class P = xsoftmax::fp32>
using explicit_head = xsoftmax::selective_softmax<explicit_candidates, P, B>;

template <class B>
explicit_head<B> view_head(problem& p, explicit_candidates sel) {
  return explicit_head<B>(std::move(sel), mview(p.w, p.rows, p.dim), p.has_bias() ? p.b.data() : nullptr);
}

}  // namespace

TEST_CASE_TEMPLATE("selective_softmax: every class active equals full_softmax bit for bit", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(101);
  const index_t n = 57, d = 8, batch = 13;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    p.targets[0] = -100;
    p.targets[1] = n - 1;
    auto sel = view_head<B>(p, explicit_candidates::all_classes(n));
    xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d, 1);
    for (index_t chunk : {index_t(0), index_t(7), index_t(1000)}) {
      sel.set_chunk_size(chunk);
      full.set_chunk_size(chunk);
      for (reduction r : all_reductions) {
        loss_options opt;
        opt.reduce = r;
        INFO("bias ", bias, ", chunk ", chunk, ", reduction ", reduction_name(r));
        const auto a = run_forward_backward(sel, hb, p.targets, opt);
        const auto f = run_forward_backward(full, hb, p.targets, opt);
        CHECK(same_outputs_across(a, f));
        test_vector<float> lp_a(static_cast<size_t>(batch)), lp_f(static_cast<size_t>(batch));
        auto valid = p.targets;
        for (auto& t : valid) t = t < 0 ? 3 : t;
        sel.log_prob(hb.view(), cvec(valid), mvec(lp_a));
        full.log_prob(hb.view(), cvec(valid), mvec(lp_f));
        CHECK(bitwise_equal(lp_a, lp_f));
      }
    }
  }
  // bf16 storage: both heads widen the same rows the same way (on the host; see the helper for cuda).
  problem p = make_problem(rng, n, n, d, batch, true);
  auto w16 = convert<__nv_bfloat16>(p.w);
  auto b16 = convert<__nv_bfloat16>(p.b);
  xsoftmax::selective_softmax<explicit_candidates, xsoftmax::bf16, B> sel(explicit_candidates::all_classes(n),
                                                                          mview(w16, n, d), b16.data());
  xsoftmax::full_softmax<xsoftmax::bf16, B> full(mview(w16, n, d), b16.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  check_low_precision_outputs_across(run_forward_backward(sel, hb, p.targets, {}),
                                     run_forward_backward(full, hb, p.targets, {}), 2e-2, "bf16 storage");
}

TEST_CASE_TEMPLATE("selective_softmax: shared candidates match the reference and finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(102);
  const index_t n = 41, d = 6, batch = 9;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    p.targets[2] = -100;
    // Candidates with duplicates, some overlapping targets, some contiguous runs and some gaps.
    std::vector<index_t> cand{5, 6, 7, 8, 30, 12, 40, 5, 0, 21, 22, p.targets[0]};
    explicit_candidates s;
    s.set_shared(cand);
    auto head = view_head<B>(p, s);
    const std::vector<index_t> active = with_targets(cand, p.targets);
    for (index_t chunk : {index_t(0), index_t(3), index_t(4)}) {
      head.set_chunk_size(chunk);
      for (reduction r : all_reductions) {
        loss_options opt;
        opt.reduce = r;
        test_vector<float> grad_output;
        if (r == reduction::none) grad_output = random_grad_output(rng, batch);
        if (r == reduction::mean) grad_output = {0.6f};
        const std::string what = std::string("shared, bias ") + (bias ? "yes" : "no") + ", chunk " +
                                 std::to_string(chunk) + ", reduction " + reduction_name(r);
        const auto hb = make_hidden<float>(p.h, batch, d, 2);
        check_forward(head, shared_reference(active), p.params(), hb, p.targets, opt, what);
        const auto out = check_gradients(head, shared_reference(active), p.params(), hb, p.targets, opt, grad_output, what);
        CHECK(gradient_rows(out.grad) == active);  // active rows only, ascending
      }
    }
    // bf16 hidden: the gradient is that of the loss at the values the head read.
    loss_options opt;
    opt.reduce = reduction::sum;
    check_gradients(head, shared_reference(active), p.params(), make_hidden<__nv_bfloat16>(p.h, batch, d), p.targets,
                    opt, {}, "bf16 hidden");
    // select() reports the same active set.
    xsoftmax::active_set_for<B> set;
    head.select(make_hidden<float>(p.h, batch, d).view(), cvec(p.targets), set);
    CHECK(set.layout == xsoftmax::active_layout::shared);
    CHECK(std::vector<index_t>(set.classes.begin(), set.classes.end()) == active);
  }
}

TEST_CASE_TEMPLATE("selective_softmax: per-sample candidates match the reference and finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(103);
  const index_t n = 37, d = 5, batch = 12;
  // Each sample's candidates depend on its target only (so the reference can rebuild them), with a
  // duplicate and, for some targets, the target itself.
  auto candidates_of = [n](index_t t) {
    std::vector<index_t> c{(t * 7 + 1) % n, (t * 3 + 5) % n, (t + 11) % n, (t * 7 + 1) % n};
    if (t % 3 == 0) c.push_back(t);
    return c;
  };
  auto reference_set = [&](index_t t) {
    auto c = candidates_of(t);
    c.push_back(t);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    return c;
  };
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    p.targets[4] = -100;
    p.targets[5] = p.targets[6];  // two samples share a target: their contributions are summed
    std::vector<index_t> offsets{0}, ids;
    for (index_t i = 0; i < batch; ++i) {
      const auto c = p.targets[i] < 0 ? std::vector<index_t>{1, 2} : candidates_of(p.targets[i]);
      ids.insert(ids.end(), c.begin(), c.end());
      offsets.push_back(static_cast<index_t>(ids.size()));
    }
    explicit_candidates s;
    s.set_per_sample(offsets, ids);
    auto head = view_head<B>(p, s);
    std::vector<index_t> expected_rows;
    for (index_t t : p.targets)
      if (t >= 0)
        for (index_t c : reference_set(t)) expected_rows.push_back(c);
    expected_rows = with_targets(expected_rows, {});
    for (reduction r : all_reductions) {
      loss_options opt;
      opt.reduce = r;
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const std::string what = std::string("per-sample, bias ") + (bias ? "yes" : "no") + ", reduction " +
                               reduction_name(r);
      const auto hb = make_hidden<float>(p.h, batch, d, 1);
      const auto ref = subset_reference(reference_set);
      check_forward(head, ref, p.params(), hb, p.targets, opt, what);
      const auto out = check_gradients(head, ref, p.params(), hb, p.targets, opt, grad_output, what);
      CHECK(gradient_rows(out.grad) == expected_rows);
    }
  }
}

TEST_CASE_TEMPLATE("selective_softmax: per-sample lists equal one shared list per row, row by row", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(104);
  const index_t n = 29, d = 7, batch = 6;
  problem p = make_problem(rng, n, n, d, batch, true);
  std::vector<index_t> offsets{0}, ids;
  std::vector<std::vector<index_t>> lists;
  for (index_t i = 0; i < batch; ++i) {
    std::vector<index_t> c;
    for (int j = 0; j < 5; ++j) c.push_back(rng.integer(0, n - 1));
    lists.push_back(c);
    ids.insert(ids.end(), c.begin(), c.end());
    offsets.push_back(static_cast<index_t>(ids.size()));
  }
  explicit_candidates s;
  s.set_per_sample(offsets, ids);
  auto head = view_head<B>(p, s);
  loss_options opt;
  opt.reduce = reduction::none;
  const auto hb = make_hidden<float>(p.h, batch, d);
  const auto all = run_forward_backward(head, hb, p.targets, opt);
  std::vector<double> gw(static_cast<size_t>(n * d), 0.0), gb(static_cast<size_t>(n), 0.0);
  for (index_t i = 0; i < batch; ++i) {
    explicit_candidates one;
    one.set_shared(lists[static_cast<size_t>(i)]);
    auto row_head = view_head<B>(p, one);
    test_vector<float> h(p.h.begin() + i * d, p.h.begin() + (i + 1) * d);
    const auto out = run_forward_backward(row_head, make_hidden<float>(h, 1, d), {p.targets[i]}, opt);
    CHECK(all.per_sample[static_cast<size_t>(i)] == doctest::Approx(out.per_sample[0]).epsilon(1e-6));
    test_vector<float> gh_row(all.grad_hidden.begin() + i * d, all.grad_hidden.begin() + (i + 1) * d);
    check_close(gh_row, out.grad_hidden, 1e-6, 1e-5, "grad_hidden of row " + std::to_string(i));
    const auto dg = scatter_gradient(out.grad, n, d, true);
    for (size_t k = 0; k < gw.size(); ++k) gw[k] += dg.w[k];
    for (size_t k = 0; k < gb.size(); ++k) gb[k] += dg.b[k];
  }
  const auto dg = scatter_gradient(all.grad, n, d, true);
  check_close(dg.w, gw, 1e-6, 1e-5, "weight gradient = sum of per-row gradients");
  check_close(dg.b, gb, 1e-6, 1e-5, "bias gradient = sum of per-row gradients");
}

TEST_CASE_TEMPLATE("selective_softmax: topk, log_distribution score every class; all ignored touches nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(105);
  const index_t n = 33, d = 6, batch = 5, k = 4;
  problem p = make_problem(rng, n, n, d, batch, true);
  explicit_candidates s;
  s.set_shared({1, 2, 3});
  auto head = view_head<B>(p, s);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> c1(static_cast<size_t>(batch * k)), c2(c1.size());
  test_vector<float> l1(c1.size()), l2(c1.size());
  head.topk(hb.view(), k, mview(c1, batch, k), mview(l1, batch, k));
  full.topk(hb.view(), k, mview(c2, batch, k), mview(l2, batch, k));
  CHECK(c1 == c2);
  CHECK(bitwise_equal(l1, l2));
  test_vector<float> d1(static_cast<size_t>(batch * 10)), d2(d1.size());
  head.log_distribution(hb.view(), 20, 30, mview(d1, batch, 10));
  full.log_distribution(hb.view(), 20, 30, mview(d2, batch, 10));
  CHECK(bitwise_equal(d1, d2));
  CHECK_THROWS_AS(head.topk(hb.view(), n + 1, mview(c1, batch, n + 1), mview(l1, batch, n + 1)),
                  xsoftmax::invalid_argument);

  test_vector<index_t> ignored(static_cast<size_t>(batch), -100);
  const auto out = run_forward_backward(head, hb, ignored, {});
  CHECK(out.loss == 0.f);
  CHECK(out.grad.num_rows() == 0);
  CHECK(std::all_of(out.grad_hidden.begin(), out.grad_hidden.end(), [](float x) { return x == 0.f; }));
}

TEST_CASE("selective_softmax: malformed candidates raise typed errors naming the value") {
  test_rng rng(106);
  const index_t n = 20, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> before = p.w;
  auto expect_message = [&](auto&& f, const std::string& needle) {
    try {
      f();
      FAIL("no exception");
    } catch (const std::exception& e) {
      INFO(std::string(e.what()));
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  explicit_candidates s;
  s.set_shared({3, 25});
  auto head = view_head<xsoftmax::serial>(p, s);
  CHECK_THROWS_AS(head.forward(hb.view(), cvec(p.targets)), xsoftmax::out_of_range);
  expect_message([&] { (void)head.forward(hb.view(), cvec(p.targets)); }, "= 25 is out of range [0, 20)");
  head.selector().set_shared({-1});
  CHECK_THROWS_AS(head.forward(hb.view(), cvec(p.targets)), xsoftmax::out_of_range);
  head.selector().set_per_sample({0, 1, 2}, {1, 2});  // 3 offsets for a batch of 3
  CHECK_THROWS_AS(head.forward(hb.view(), cvec(p.targets)), xsoftmax::shape_error);
  expect_message([&] { (void)head.forward(hb.view(), cvec(p.targets)); }, "have 3 offsets but the batch has 3 rows");
  head.selector().set_per_sample({0, 2, 1, 2}, {1, 2});
  CHECK_THROWS_AS(head.forward(hb.view(), cvec(p.targets)), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)explicit_candidates::all_classes(0), xsoftmax::invalid_argument);
  // Nothing was changed by the failed calls.
  CHECK(bitwise_equal(before, p.w));
}

namespace {
/// A selector written against the documented concept with the concrete set type (and no
/// `fills_scratch_sets`): a head hands it an `active_set_for<Backend>`, not its scratch set.
struct concrete_set_selector {
  explicit_candidates inner;
  template <class Ex, class T>
  void select(const Ex& ex, const xsoftmax::selection_request<T>& req,
              xsoftmax::active_set_for<typename Ex::backend>& out) const {
    inner.select(ex, req, out);
  }
};
}  // namespace

TEST_CASE_TEMPLATE("selective_softmax: a selector without fills_scratch_sets gets an active_set_for<B>, same outputs", B,
                   XSOFTMAX_TEST_BACKENDS) {
  static_assert(!xsoftmax::detail::selector_fills_scratch_sets<concrete_set_selector>);
  static_assert(xsoftmax::detail::selector_fills_scratch_sets<explicit_candidates>);
  static_assert(std::is_same_v<xsoftmax::detail::selection_set_for<concrete_set_selector, B>, xsoftmax::active_set_for<B>>);
  static_assert(std::is_same_v<xsoftmax::detail::selection_set_for<explicit_candidates, B>,
                               xsoftmax::detail::scratch_active_set<B>>);
  test_rng rng(107);
  const index_t n = 41, d = 6, batch = 9;
  problem p = make_problem(rng, n, n, d, batch, true, 0.2);
  p.targets[2] = -100;
  const auto hb = make_hidden<float>(p.h, batch, d);
  std::vector<index_t> offsets{0}, ids;
  for (index_t r = 0; r < batch; ++r) {
    for (index_t j = 0; j < 4; ++j) ids.push_back((r * 5 + j * 9) % n);
    offsets.push_back(static_cast<index_t>(ids.size()));
  }
  for (bool per_sample : {false, true}) {
    explicit_candidates s;
    if (per_sample) s.set_per_sample(offsets, ids);
    else s.set_shared({1, 4, 9, 16, 25, 36});
    const auto mine = view_head<B>(p, s);
    const xsoftmax::selective_softmax<concrete_set_selector, xsoftmax::fp32, B> theirs(
        concrete_set_selector{s}, mview(p.w, n, d), p.b.data());
    for (reduction r : all_reductions) {
      loss_options opt;
      opt.reduce = r;
      INFO("per sample ", per_sample, ", reduction ", reduction_name(r));
      CHECK(same_outputs_across(run_forward_backward(mine, hb, p.targets, opt),
                                run_forward_backward(theirs, hb, p.targets, opt)));
    }
  }
}
