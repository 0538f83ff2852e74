// SPDX-License-Identifier: Apache-2.0
// Logit soft-capping (loss_options::softcap) on the full softmax (the selective and KNN heads' cases
// are in loss_terms_test.cpp, beside label smoothing's), and
// per-class weights (loss_options::class_weight) on the full, selective and hierarchical heads, also
// with label smoothing: float64 references of their definitions (PyTorch's formulas: cap tanh(z / cap)
// logits; F.cross_entropy(weight=..., label_smoothing=...)'s weighted losses and weighted mean) and
// central finite differences,
// every reduction; bad values rejected with typed errors naming them. Every backend of the build.

#include "selective/selection_support.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

loss_options capped(double cap, reduction r = reduction::mean, double eps = 0, double z = 0) {
  loss_options o;
  o.reduce = r;
  o.softcap = static_cast<float>(cap);
  o.label_smoothing = static_cast<float>(eps);
  o.z_loss = static_cast<float>(z);
  return o;
}

/// n class weights in [0, 2], some exactly 0.
test_vector<float> random_class_weights(test_rng& rng, index_t n) {
  test_vector<float> w(static_cast<std::size_t>(n));
  for (auto& x : w) x = rng.coin(0.15) ? 0.f : static_cast<float>(rng.uniform(0.1, 2.0));
  return w;
}

}  // namespace

TEST_CASE_TEMPLATE("softcap: full softmax matches cap tanh(z / cap) logits and finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(801);
  const index_t n = 31, d = 6, batch = 9;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    for (index_t chunk : {index_t(0), index_t(7)}) {
      head.set_chunk_size(chunk);
      // 1.5: most scores are capped hard (|z| reaches about 6 here); 30: the cap barely bends them.
      for (auto [cap, eps, z] : {std::tuple{1.5, 0.0, 0.0}, std::tuple{30.0, 0.0, 0.0}, std::tuple{2.0, 0.2, 1e-2}})
        for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
          const loss_options opt = capped(cap, r, eps, z);
          test_vector<float> grad_output;
          if (r == reduction::none) grad_output = random_grad_output(rng, batch);
          const std::string what = "cap " + std::to_string(cap) + ", eps " + std::to_string(eps) + ", bias " +
                                   std::to_string(bias) + ", chunk " + std::to_string(chunk) + ", " + reduction_name(r);
          check_forward(head, softcapped_reference(cap, eps, z), p.params(), hb, p.targets, opt, what);
          check_gradients(head, softcapped_reference(cap, eps, z), p.params(), hb, p.targets, opt, grad_output, what);
        }
    }
  }
}

TEST_CASE_TEMPLATE("class_weight: full, selective and hierarchical heads weigh each sample's loss and the mean", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(803);
  const index_t n = 24, d = 5, batch = 11;
  problem p = make_problem(rng, n, n, d, batch, true, 0.2);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const test_vector<float> cw = random_class_weights(rng, n);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), p.b.data());
  const auto list_of = [n](index_t t) { return mixed_candidates_of(t, n); };
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> selective(
      mixed_per_sample_candidates(p.targets, batch, n), mview(p.w, n, d), p.b.data());
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options o;
    o.reduce = r;
    o.class_weight = cvec(cw);
    o.z_loss = r == reduction::sum ? 1e-2f : 0.f;  // the z-loss is weighed with the sample
    test_vector<float> grad_output;
    if (r == reduction::none) grad_output = random_grad_output(rng, batch);
    const std::string what = std::string("weighted, ") + reduction_name(r);
    check_forward(full, smoothed_reference(0, o.z_loss), p.params(), hb, p.targets, o, "full " + what);
    check_gradients(full, smoothed_reference(0, o.z_loss), p.params(), hb, p.targets, o, grad_output, "full " + what);
    check_gradients(selective, smoothed_reference(0, o.z_loss, list_of), p.params(), hb, p.targets, o, grad_output,
                    "selective " + what);
  }

  using tree = xsoftmax::uniform_tree<2, 5>;
  const tree tr(n);
  const index_t rows = xsoftmax::hierarchical_softmax<tree>::weight_rows(tr);
  problem hp = make_problem(rng, rows, n, d, batch, true, 0.2);
  xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, B> hs(tr, mview(hp.w, rows, d), hp.b.data());
  const auto hhb = make_hidden<float>(hp.h, batch, d);
  for (reduction r : {reduction::none, reduction::mean}) {
    loss_options o;
    o.reduce = r;
    o.class_weight = cvec(cw);
    test_vector<float> grad_output;
    if (r == reduction::none) grad_output = random_grad_output(rng, batch);
    check_gradients(hs, hs_reference(tr.view()), hp.params(), hhb, hp.targets, o, grad_output,
                    std::string("hierarchical, weighted, ") + reduction_name(r));
  }

  // Every counted sample of weight 0: a mean of 0 and zero gradients (as the unweighted mean of no sample).
  test_vector<float> zeros(static_cast<std::size_t>(n), 0.f);
  loss_options o;
  o.class_weight = cvec(zeros);
  const auto out = run_forward_backward(full, hb, p.targets, o);
  CHECK(out.loss == 0.f);
  for (float g : out.grad_hidden) CHECK(g == 0.f);
}

TEST_CASE_TEMPLATE("softcap and class_weight: bad values and heads that do not define them are rejected", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(804);
  const index_t n = 16, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), capped(-1)),
                       doctest::Contains("options.softcap = -1 must be finite and >= 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)full.forward(hb.view(), cvec(p.targets), capped(INFINITY)), xsoftmax::invalid_argument);
  loss_options margin = capped(5);
  margin.margin = xsoftmax::margin_options::cosface();
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), margin),
                       doctest::Contains("must be 0 with a margin"), xsoftmax::invalid_argument);
  using tree = xsoftmax::uniform_tree<2, 4>;
  xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, B> hs(tree(n), d);
  CHECK_THROWS_WITH_AS((void)hs.forward(hb.view(), cvec(p.targets), capped(5)),
                       doctest::Contains("hierarchical_softmax does not define it"), xsoftmax::invalid_argument);

  test_vector<float> cw(static_cast<std::size_t>(n), 1.f);
  loss_options o;
  o.class_weight = xsoftmax::vector_view<const float>(cw.data(), n - 1);
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), o),
                       doctest::Contains("options.class_weight has 15 values but the head has 16 classes"),
                       xsoftmax::shape_error);
  o.class_weight = cvec(cw);
  cw[5] = -0.5f;
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), o),
                       doctest::Contains("options.class_weight[5] = -0.5 must be finite and >= 0"),
                       xsoftmax::invalid_argument);
  cw[5] = std::nanf("");
  CHECK_THROWS_AS((void)full.forward(hb.view(), cvec(p.targets), o), xsoftmax::invalid_argument);
  cw[5] = 1.f;
  CHECK(std::isfinite(full.forward(hb.view(), cvec(p.targets), o)));
}

TEST_CASE_TEMPLATE("class_weight with label smoothing: each class of the smoothing term weighed, as PyTorch's formula",
                   B, XSOFTMAX_TEST_BACKENDS) {
  // F.cross_entropy(weight=w, label_smoothing=eps): w_t ((1 - eps) (lse - s_t)) + eps / n sum_c w_c (lse - s_c),
  // the mean divided by the sum of w_t; with z-loss and soft-capping too. Every pass that smooths: the
  // full softmax (chunked and not, row blocks), a shared active set that gathers its columns and a
  // per-sample one (gather-dot).
  test_rng rng(805);
  const index_t n = 26, d = 5, batch = 12;
  problem p = make_problem(rng, n, n, d, batch, true, 0.2);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const test_vector<float> cw = random_class_weights(rng, n);
  const std::vector<double> cwd(cw.begin(), cw.end());
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), p.b.data());
  const auto list_of = [n](index_t t) { return mixed_candidates_of(t, n); };
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> per_sample(
      mixed_per_sample_candidates(p.targets, batch, n), mview(p.w, n, d), p.b.data());
  // A shared set of every third class and the targets: gathered, non-contiguous columns.
  std::vector<index_t> some;
  for (index_t c = 0; c < n; c += 3) some.push_back(c);
  const std::vector<index_t> set = with_targets(some, p.targets);
  xsoftmax::explicit_candidates shared_candidates;
  shared_candidates.set_shared(some);
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> shared(shared_candidates,
                                                                                      mview(p.w, n, d), p.b.data());
  const auto set_of = [set](index_t) { return set; };
  for (auto [eps, z, cap] : {std::tuple{0.1, 0.0, 0.0}, std::tuple{0.3, 1e-2, 0.0}, std::tuple{0.2, 0.0, 2.0}})
    for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
      loss_options o = capped(cap, r, eps, z);
      o.class_weight = cvec(cw);
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const std::string what = "eps " + std::to_string(eps) + ", z " + std::to_string(z) + ", cap " +
                               std::to_string(cap) + ", " + reduction_name(r);
      for (index_t chunk : {index_t(0), index_t(7)}) {
        full.set_chunk_size(chunk);
        const auto ref = softcapped_reference(cap, eps, z, {}, cwd);
        check_forward(full, ref, p.params(), hb, p.targets, o, "full, chunk " + std::to_string(chunk) + ", " + what);
        check_gradients(full, ref, p.params(), hb, p.targets, o, grad_output,
                        "full, chunk " + std::to_string(chunk) + ", " + what);
      }
      full.set_chunk_size(0);
      const auto per_sample_ref = softcapped_reference(cap, eps, z, list_of, cwd);
      check_forward(per_sample, per_sample_ref, p.params(), hb, p.targets, o, "per-sample, " + what);
      check_gradients(per_sample, per_sample_ref, p.params(), hb, p.targets, o, grad_output, "per-sample, " + what);
      const auto shared_ref = softcapped_reference(cap, eps, z, set_of, cwd);
      check_forward(shared, shared_ref, p.params(), hb, p.targets, o, "shared, " + what);
      check_gradients(shared, shared_ref, p.params(), hb, p.targets, o, grad_output, "shared, " + what);
    }

  // The weights matter: the result differs from the unweighted smoothing and from weighing the
  // whole sample by w_t (the formula without label smoothing applied to the smoothed loss).
  loss_options o = capped(0, reduction::sum, 0.3);
  const float unweighted = full.forward(hb.view(), cvec(p.targets), o);
  o.class_weight = cvec(cw);
  const float weighted = full.forward(hb.view(), cvec(p.targets), o);
  loss_options whole_sample = o;  // the reference weighs each sample's (unweighted) smoothed loss by w_t
  whole_sample.label_smoothing = 0.f;
  const double per_sample_weighted =
      reference_objective(smoothed_reference(0.3, 0), p.params(), hb.reference(p.targets), whole_sample);
  CHECK(std::abs(weighted - unweighted) > 1e-3 * std::abs(unweighted));
  CHECK(std::abs(weighted - per_sample_weighted) > 1e-3 * std::abs(per_sample_weighted));

  // Every counted sample of weight 0 with label smoothing: the mean and its gradients are 0.
  test_vector<float> zeros(static_cast<std::size_t>(n), 0.f);
  loss_options zero = capped(0, reduction::mean, 0.2);
  zero.class_weight = cvec(zeros);
  const auto out = run_forward_backward(full, hb, p.targets, zero);
  CHECK(out.loss == 0.f);
  for (float g : out.grad_hidden) CHECK(g == 0.f);
}
