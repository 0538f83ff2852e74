// SPDX-License-Identifier: Apache-2.0
// ArcFace and CosFace margins (loss_options::margin) on the full softmax and the selective / KNN /
// sampled heads: a float64 reference of the definition (normalised rows and weights, InsightFace's
// ArcFace with its fallback branch, CosFace), central finite differences of it for the hidden and
// weight gradients (through both normalisations), every reduction, with label smoothing and
// z-loss; every class active equals the full softmax bit for bit; bad options, a bias and the
// hierarchical softmax are rejected with typed errors naming the value. Every backend of the build.

#include "selective/selection_support.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
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
using xsoftmax::margin_kind;
using xsoftmax::margin_options;
using xsoftmax::reduction;

constexpr double pi = 3.14159265358979323846;

/// x / max(|x|, 1e-12), as torch.nn.functional.normalize.
std::vector<double> normalized(const double* x, index_t d) {
  double sq = 0;
  for (index_t p = 0; p < d; ++p) sq += x[p] * x[p];
  const double norm = std::max(std::sqrt(sq), 1e-12);
  std::vector<double> out(x, x + d);
  for (double& v : out) v /= norm;
  return out;
}

/// The target's margin logit: s phi(c) (InsightFace ArcFace, easy_margin = false) or s (c - m).
double target_logit(const margin_options& o, double c) {
  if (o.kind == margin_kind::cosface) return o.scale * (c - o.m);
  const double m = o.m;
  if (c <= std::cos(pi - m)) return o.scale * (c - std::sin(pi - m) * m);
  return o.scale * (c * std::cos(m) - std::sqrt(std::max(0.0, 1 - c * c)) * std::sin(m));
}

/// lse - (1 - eps) z_t - eps mean(z) + zl lse^2 over the margin logits z of the classes
/// `classes(t)` (all when empty): z_c = s cos theta_c, z_t = target_logit(cos theta_t).
sample_loss_fn margin_reference(margin_options o, double eps = 0, double zl = 0,
                                std::function<std::vector<index_t>(index_t)> classes = {}) {
  return [=](const ref_params& p, const double* h, index_t t) {
    std::vector<index_t> set;
    if (classes) set = classes(t);
    else
      for (index_t c = 0; c < p.rows; ++c) set.push_back(c);
    const std::vector<double> hn = normalized(h, p.dim);
    test_vector<double> z;
    double target = 0, sum = 0;
    for (index_t c : set) {
      const std::vector<double> wn = normalized(p.w.data() + c * p.dim, p.dim);
      double cosine = 0;
      for (index_t k = 0; k < p.dim; ++k) cosine += hn[k] * wn[k];
      z.push_back(c == t ? target_logit(o, cosine) : o.scale * cosine);
      sum += z.back();
      if (c == t) target = z.back();
    }
    const double lse = logsumexp(z);
    return lse - (1 - eps) * target - eps * sum / static_cast<double>(set.size()) + zl * lse * lse;
  };
}

loss_options with_margin(margin_options m, reduction r = reduction::mean, double eps = 0, double zl = 0) {
  loss_options o;
  o.reduce = r;
  o.margin = m;
  o.label_smoothing = static_cast<float>(eps);
  o.z_loss = static_cast<float>(zl);
  return o;
}

/// Puts sample 0 almost opposite its target's weight row, so that cos theta_t < cos(pi - m): the
/// ArcFace fallback branch is exercised.
void oppose_first_target(problem& p) {
  const index_t t = p.targets[0] < 0 ? (p.targets[0] = 0) : p.targets[0];
  for (index_t k = 0; k < p.dim; ++k)
    p.h[static_cast<size_t>(k)] = -p.w[static_cast<size_t>(t * p.dim + k)] + (k == 0 ? 0.05f : 0.f);
}

std::string describe(const margin_options& m) {
  return std::string(m.kind == margin_kind::arcface ? "arcface" : "cosface") + " s " + std::to_string(m.scale) +
         " m " + std::to_string(m.m);
}

}  // namespace

TEST_CASE_TEMPLATE("margin: full softmax with ArcFace / CosFace matches its definition and finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(801);
  const index_t n = 23, d = 6, batch = 9;
  problem p = make_problem(rng, n, n, d, batch, false, 0.2);
  oppose_first_target(p);
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  const ref_batch rb = hb.reference(p.targets);
  {  // the fallback branch is really taken by sample 0
    const auto hn = normalized(rb.h.data(), d);
    const auto wn = normalized(p.params().w.data() + p.targets[0] * d, d);
    double c = 0;
    for (index_t k = 0; k < d; ++k) c += hn[k] * wn[k];
    REQUIRE(c < std::cos(pi - 0.5));
  }
  for (index_t chunk : {index_t(0), index_t(7)}) {
    head.set_chunk_size(chunk);
    for (const margin_options m : {margin_options::arcface(12.f), margin_options::cosface(12.f)})
      for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
        const loss_options opt = with_margin(m, r);
        test_vector<float> grad_output;
        if (r == reduction::none) grad_output = random_grad_output(rng, batch);
        const std::string what = describe(m) + ", chunk " + std::to_string(chunk) + ", " + reduction_name(r);
        check_forward(head, margin_reference(m), p.params(), hb, p.targets, opt, what);
        check_gradients(head, margin_reference(m), p.params(), hb, p.targets, opt, grad_output, what);
      }
  }
  // With label smoothing and z-loss on the margin logits.
  for (const margin_options m : {margin_options::arcface(8.f, 0.3f), margin_options::cosface(10.f, 0.2f)}) {
    const loss_options opt = with_margin(m, reduction::mean, 0.1, 1e-3);
    const auto ref = margin_reference(m, 0.1, 1e-3);
    check_gradients(head, ref, p.params(), hb, p.targets, opt, {}, describe(m) + " with smoothing and z-loss");
  }
  // The papers' scale s = 64: the loss only (finite differences of such steep logits are poor).
  for (const margin_options m : {margin_options::arcface(), margin_options::cosface()})
    check_forward(head, margin_reference(m), p.params(), hb, p.targets, with_margin(m), describe(m));
}

TEST_CASE_TEMPLATE("margin: selective and KNN heads use the margin over each row's active set; all classes equals full",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(802);
  const index_t n = 29, d = 5, batch = 8;
  problem p = make_problem(rng, n, n, d, batch, false, 0.2);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const margin_options arc = margin_options::arcface(10.f, 0.4f), cos = margin_options::cosface(10.f);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  for (const margin_options m : {arc, cos}) {
    // Every class active: bit for bit the full softmax (shared path = the same dense softmax).
    const loss_options opt = with_margin(m, reduction::mean, 0.1, 1e-3);
    xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> all(
        xsoftmax::explicit_candidates::all_classes(n), mview(p.w, n, d));
    CHECK(same_outputs_across(run_forward_backward(all, hb, p.targets, opt),
                              run_forward_backward(full, hb, p.targets, opt)));
    xsoftmax::knn_options ko;
    ko.graph.k = n;
    xsoftmax::knn_softmax<xsoftmax::fp32, B> knn(mview(p.w, n, d), ko);
    CHECK(same_outputs_across(run_forward_backward(knn, hb, p.targets, opt),
                              run_forward_backward(full, hb, p.targets, opt)));
  }

  // A shared subset (gathered weight rows, chunks of 3) against the subset reference.
  const std::vector<index_t> shared = with_targets({1, 4, 5, 6, 11, 20, 27}, p.targets);
  xsoftmax::explicit_candidates shared_sel;
  shared_sel.set_shared(shared);
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> subset(shared_sel, mview(p.w, n, d));
  subset.set_chunk_size(3);
  // Per-sample candidates (gather-dot path).
  const auto list_of = [n](index_t t) { return mixed_candidates_of(t, n); };
  const xsoftmax::explicit_candidates per_sample = mixed_per_sample_candidates(p.targets, batch, n);
  xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> own(per_sample, mview(p.w, n, d));
  for (const margin_options m : {arc, cos})
    for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const std::string what = describe(m) + ", " + reduction_name(r);
      const loss_options o = with_margin(m, r);
      check_forward(subset, margin_reference(m, 0, 0, [&](index_t) { return shared; }), p.params(), hb, p.targets, o,
                    "shared subset, " + what);
      check_gradients(subset, margin_reference(m, 0, 0, [&](index_t) { return shared; }), p.params(), hb, p.targets,
                      o, grad_output, "shared subset, " + what);
      check_forward(own, margin_reference(m, 0, 0, list_of), p.params(), hb, p.targets, o, "per-sample, " + what);
      check_gradients(own, margin_reference(m, 0, 0, list_of), p.params(), hb, p.targets, o, grad_output,
                      "per-sample, " + what);
    }
  // Per-sample lists with label smoothing and z-loss on the margin logits.
  const loss_options terms = with_margin(arc, reduction::sum, 0.2, 5e-3);
  check_gradients(own, margin_reference(arc, 0.2, 5e-3, list_of), p.params(), hb, p.targets, terms, {},
                  "per-sample with smoothing and z-loss");
}

// The normalised classifier of the KNN study (issue 13): a cosine graph with K < N, so that each
// batch scores only its targets' neighbourhoods, with s cos theta logits (CosFace m = 0: no margin)
// and with either margin; the set is the union the head documents, checked from its own graph.
TEST_CASE_TEMPLATE("margin: a KNN head with K < N scores the margin logits over its targets' cosine neighbours", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(805);
  const index_t n = 41, d = 6, batch = 8, k = 4;
  problem p = make_problem(rng, n, n, d, batch, false, 0.2);
  xsoftmax::knn_options ko;
  ko.graph.k = k;
  ko.graph.metric = xsoftmax::similarity::cosine;
  xsoftmax::knn_softmax<xsoftmax::fp32, B> knn(mview(p.w, n, d), ko);
  std::vector<index_t> active;
  for (index_t t : p.targets) {
    if (t < 0) continue;
    active.push_back(t);
    for (index_t j = 0; j < k; ++j) active.push_back(knn.graph().neighbors(t)[j]);
  }
  active = with_targets(active, {});
  CHECK(static_cast<index_t>(active.size()) < n);  // a real subset
  const auto hb = make_hidden<float>(p.h, batch, d);
  const auto set = [&](index_t) { return active; };
  for (const margin_options m :
       {margin_options::cosface(16.f, 0.f), margin_options::cosface(16.f, 0.35f), margin_options::arcface(16.f, 0.5f)})
    for (reduction r : {reduction::none, reduction::mean}) {
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const std::string what = "knn k " + std::to_string(k) + ", " + describe(m) + ", " + reduction_name(r);
      const loss_options o = with_margin(m, r);
      check_forward(knn, margin_reference(m, 0, 0, set), p.params(), hb, p.targets, o, what);
      const auto out = check_gradients(knn, margin_reference(m, 0, 0, set), p.params(), hb, p.targets, o, grad_output, what);
      CHECK(gradient_rows(out.grad) == active);  // active rows only
    }
}

TEST_CASE_TEMPLATE("margin: sampled negatives run training steps; every class drawn equals full", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(803);
  const index_t n = 40, d = 6, batch = 10;
  problem p = make_problem(rng, n, n, d, batch, false, 0.1);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const loss_options opt = with_margin(margin_options::arcface(16.f));
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  xsoftmax::sampling_options all;
  all.num_sampled = n;
  using sampled_head = xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, B>;
  sampled_head every(xsoftmax::sampled_negatives::uniform(n, all), mview(p.w, n, d));
  CHECK(same_outputs_across(run_forward_backward(every, hb, p.targets, opt), run_forward_backward(full, hb, p.targets, opt)));

  xsoftmax::sampling_options few;
  few.num_sampled = 8;
  sampled_head head(xsoftmax::sampled_negatives::log_uniform(n, few), mview(p.w, n, d));
  for (int step = 0; step < 3; ++step, head.next_step()) {
    const auto out = run_forward_backward(head, hb, p.targets, opt);
    INFO("step ", step);
    CHECK(std::isfinite(out.loss));
    CHECK(out.loss > 0.f);
    for (float g : out.grad_hidden) REQUIRE(std::isfinite(g));
    for (float g : on_host(out.grad.values)) REQUIRE(std::isfinite(g));
  }
}

TEST_CASE_TEMPLATE("margin: a zero weight row has cosine 0 and finite gradients", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(804);
  const index_t n = 12, d = 4, batch = 5;
  problem p = make_problem(rng, n, n, d, batch, false);
  std::fill(p.w.begin() + 3 * d, p.w.begin() + 4 * d, 0.f);  // class 3: a zero row
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d));
  for (const margin_options m : {margin_options::arcface(8.f), margin_options::cosface(8.f)}) {
    check_forward(head, margin_reference(m), p.params(), hb, p.targets, with_margin(m, reduction::none), describe(m));
    const auto out = run_forward_backward(head, hb, p.targets, with_margin(m));
    for (float g : out.grad_hidden) REQUIRE(std::isfinite(g));
    for (float g : on_host(out.grad.values)) REQUIRE(std::isfinite(g));
  }
}

TEST_CASE_TEMPLATE("margin: bad values, a bias and the hierarchical softmax are rejected, naming the value", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(805);
  const index_t n = 16, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, true);
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  auto forward = [&](const auto& head, margin_options m) { return head.forward(hb.view(), cvec(p.targets), with_margin(m)); };
  CHECK_THROWS_WITH_AS((void)forward(full, margin_options::arcface(-1.f)),
                       doctest::Contains("options.margin.scale = -1 must be finite and > 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)forward(full, margin_options::cosface(0.f)),
                       doctest::Contains("options.margin.scale = 0 must be finite and > 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)forward(full, margin_options::arcface(std::nanf(""))), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)forward(full, margin_options::arcface(64.f, 1.6f)),
                       doctest::Contains("options.margin.m = 1.6 must be in [0, pi/2) for arcface"),
                       xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)forward(full, margin_options::arcface(64.f, -0.1f)),
                       doctest::Contains("options.margin.m = -0.1 must be in [0, pi/2)"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)forward(full, margin_options::cosface(64.f, -0.5f)),
                       doctest::Contains("options.margin.m = -0.5 must be finite and >= 0 for cosface"),
                       xsoftmax::invalid_argument);
  margin_options unknown;
  unknown.kind = static_cast<margin_kind>(7);
  CHECK_THROWS_WITH_AS((void)forward(full, unknown), doctest::Contains("options.margin.kind = 7 is not a margin_kind"),
                       xsoftmax::invalid_argument);

  xsoftmax::full_softmax<xsoftmax::fp32, B> biased(mview(p.w, n, d), p.b.data());
  CHECK_THROWS_WITH_AS((void)forward(biased, margin_options::cosface()),
                       doctest::Contains("options.margin.kind = cosface needs a head without a bias"),
                       xsoftmax::invalid_argument);
  CHECK(std::isfinite(forward(biased, margin_options{})));  // no margin: the bias is fine

  using tree = xsoftmax::uniform_tree<2, 4>;
  xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, B> hs(tree(n), d);
  CHECK_THROWS_WITH_AS((void)forward(hs, margin_options::arcface()),
                       doctest::Contains("options.margin.kind = arcface must be none: hierarchical_softmax does not "
                                         "define margins"),
                       xsoftmax::invalid_argument);
  CHECK(std::isfinite(forward(hs, margin_options{})));
  // The defaults of the papers.
  CHECK(margin_options::arcface().scale == 64.f);
  CHECK(margin_options::arcface().m == 0.5f);
  CHECK(margin_options::cosface().m == 0.35f);
}
