// SPDX-License-Identifier: Apache-2.0
// Label smoothing and z-loss (loss_options::label_smoothing, z_loss) on the full softmax and the
// selective / KNN heads: float64 references of their definitions and central finite differences;
// every class active equals the full softmax bit for bit; the hierarchical softmax and bad values
// are rejected with typed errors. Every backend of the build.

#include "selective/selection_support.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

loss_options terms(double eps, double z, reduction r = reduction::mean) {
  loss_options o;
  o.reduce = r;
  o.label_smoothing = static_cast<float>(eps);
  o.z_loss = static_cast<float>(z);
  return o;
}

}  // namespace

TEST_CASE_TEMPLATE("loss terms: full softmax with label smoothing and z-loss matches its definition and finite differences",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(701);
  const index_t n = 31, d = 6, batch = 9;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    for (index_t chunk : {index_t(0), index_t(7)}) {
      head.set_chunk_size(chunk);
      for (auto [eps, z] : {std::pair{0.1, 0.0}, std::pair{0.0, 1e-2}, std::pair{0.3, 1e-3}, std::pair{1.0, 0.0}})
        for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
          const loss_options opt = terms(eps, z, r);
          test_vector<float> grad_output;
          if (r == reduction::none) grad_output = random_grad_output(rng, batch);
          const std::string what = "eps " + std::to_string(eps) + ", z " + std::to_string(z) + ", bias " +
                                   std::to_string(bias) + ", chunk " + std::to_string(chunk) + ", " + reduction_name(r);
          check_forward(head, smoothed_reference(eps, z), p.params(), hb, p.targets, opt, what);
          check_gradients(head, smoothed_reference(eps, z), p.params(), hb, p.targets, opt, grad_output, what);
        }
    }
  }
}

TEST_CASE_TEMPLATE("loss terms: selective and KNN heads smooth over each row's active set; all classes equals full",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(702);
  const index_t n = 29, d = 5, batch = 8;
  problem p = make_problem(rng, n, n, d, batch, true, 0.2);
  const auto hb = make_hidden<float>(p.h, batch, d);
  // Every class active: bit for bit the full softmax (shared path = the same dense softmax), with
  // smoothing and z-loss, and with soft-capped logits too.
  loss_options softcapped = terms(0.1, 0);
  softcapped.softcap = 1.75f;
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), p.b.data());
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> all(
      xsoftmax::explicit_candidates::all_classes(n), mview(p.w, n, d), p.b.data());
  xsoftmax::knn_options ko;
  ko.graph.k = n;
  xsoftmax::knn_softmax<xsoftmax::fp32, B> knn(mview(p.w, n, d), ko, p.b.data());
  for (const loss_options& o : {terms(0.2, 5e-3), softcapped}) {
    const auto want = run_forward_backward(full, hb, p.targets, o);
    CHECK(same_outputs_across(run_forward_backward(all, hb, p.targets, o), want));
    CHECK(same_outputs_across(run_forward_backward(knn, hb, p.targets, o), want));
  }

  // Per-sample candidates (gather-dot path): smoothing over the row's own list, with and without
  // soft-capped logits.
  const auto list_of = [n](index_t t) { return mixed_candidates_of(t, n); };
  const xsoftmax::explicit_candidates per_sample = mixed_per_sample_candidates(p.targets, batch, n);
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> head(per_sample, mview(p.w, n, d),
                                                                                     p.b.data());
  for (double cap : {0.0, 1.25})
    for (reduction r : {reduction::none, reduction::sum}) {
      loss_options o = terms(0.25, 1e-2, r);
      o.softcap = static_cast<float>(cap);
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const auto ref = softcapped_reference(cap, 0.25, 1e-2, list_of);
      const std::string what = "per-sample, cap " + std::to_string(cap) + ", " + reduction_name(r);
      check_forward(head, ref, p.params(), hb, p.targets, o, what);
      check_gradients(head, ref, p.params(), hb, p.targets, o, grad_output, what);
    }
}

TEST_CASE_TEMPLATE("loss terms: out-of-range values and the hierarchical softmax are rejected, naming the value", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(703);
  const index_t n = 16, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), terms(1.5, 0)),
                       doctest::Contains("options.label_smoothing = 1.5 must be in [0, 1]"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), terms(0, -1)),
                       doctest::Contains("options.z_loss = -1 must be finite and >= 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)full.forward(hb.view(), cvec(p.targets), terms(std::nan(""), 0)), xsoftmax::invalid_argument);
  using tree = xsoftmax::uniform_tree<2, 4>;
  xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, B> hs(tree(n), d);
  CHECK_THROWS_WITH_AS((void)hs.forward(hb.view(), cvec(p.targets), terms(0.1, 0)),
                       doctest::Contains("hierarchical_softmax does not define them"), xsoftmax::invalid_argument);
  CHECK(std::isfinite(hs.forward(hb.view(), cvec(p.targets), terms(0, 0))));
}
