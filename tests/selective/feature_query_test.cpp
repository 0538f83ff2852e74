// SPDX-License-Identifier: Apache-2.0
// The feature-query selector: each sample's active set is its top-K classes by logit plus its
// target; the loss and gradients match the float64 reference over those sets; the IVF form with
// every list probed selects the same sets as the exact form; an index built for another head or
// another precision, and bad K / nprobe, raise typed errors naming the values.

#include "selective/selection_support.hpp"

#include <xsoftmax/selection/feature_query.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::feature_query_selector;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

template <class B>
using fq_head = xsoftmax::selective_softmax<feature_query_selector, xsoftmax::fp32, B>;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

xsoftmax::ivf_index ip_index(const test_vector<float>& w, index_t n, index_t d, index_t lists) {
  xsoftmax::ivf_index index;
  xsoftmax::ivf_options o;
  o.num_lists = lists;
  o.metric = xsoftmax::similarity::inner_product;
  index.build(cview(w, n, d), o);
  return index;
}

}  // namespace

TEST_CASE_TEMPLATE("feature query: exact top-K per sample; reference and finite differences", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(501);
  const index_t n = 50, d = 5, batch = 8, k = 4;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias);
    for (index_t i = 0; i < batch; ++i) p.targets[size_t(i)] = 5 * i + 1;  // distinct targets: the reference keys on them
    p.targets[2] = -100;
    fq_head<B> head(feature_query_selector(k), mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    xsoftmax::active_set_for<B> set;
    head.select(hb.view(), cvec(p.targets), set);
    REQUIRE(set.layout == xsoftmax::active_layout::per_sample);
    const auto set_ids = on_host(set.ids), set_offsets = on_host(set.offsets);
    // Each packed row: its top-k logits in double, plus its target.
    const ref_params params = p.params();
    std::map<index_t, std::vector<index_t>> set_of;
    index_t row = 0;
    for (index_t i = 0; i < batch; ++i) {
      const index_t t = p.targets[size_t(i)];
      if (t < 0) continue;
      std::vector<std::pair<double, index_t>> s;
      std::vector<double> h(p.h.begin() + i * d, p.h.begin() + (i + 1) * d);
      for (index_t c = 0; c < n; ++c) s.push_back({-params.score(c, h.data()), c});
      std::sort(s.begin(), s.end());
      std::vector<index_t> want{t};
      for (index_t j = 0; j < k; ++j) want.push_back(s[size_t(j)].second);
      want = with_targets(want, {});
      const std::vector<index_t> got(set_ids.begin() + set_offsets[size_t(row)],
                                     set_ids.begin() + set_offsets[size_t(row + 1)]);
      CHECK(got == want);
      set_of[t] = want;
      ++row;
    }
    const auto ref = subset_reference([&](index_t t) { return set_of.at(t); });
    for (reduction r : {reduction::none, reduction::sum}) {
      loss_options opt;
      opt.reduce = r;
      const std::string what = std::string("bias ") + (bias ? "yes" : "no") + ", reduction " + reduction_name(r);
      check_forward(head, ref, params, hb, p.targets, opt, what);
      check_gradients(head, ref, params, hb, p.targets, opt, {}, what);
    }
  }
}

TEST_CASE_TEMPLATE("feature query: IVF with every list probed selects what the exact form selects", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(502);
  const index_t n = 200, d = 6, batch = 10, k = 7, lists = 8;
  test_vector<float> w(static_cast<size_t>(n * d)), h(static_cast<size_t>(batch * d)), bias(static_cast<size_t>(n));
  for (auto& x : w) x = static_cast<float>(rng.integer(-3, 3));  // exact arithmetic: ties broken by id
  for (auto& x : h) x = static_cast<float>(rng.integer(-2, 2));
  for (auto& x : bias) x = static_cast<float>(rng.integer(-1, 1));
  const auto targets = random_targets(rng, batch, n);
  fq_head<B> exact(feature_query_selector(k), mview(w, n, d), bias.data());
  fq_head<B> approx(feature_query_selector(k, ip_index(w, n, d, lists), lists), mview(w, n, d), bias.data());
  const auto hb = make_hidden<float>(h, batch, d);
  xsoftmax::active_set_for<B> a, b;
  exact.select(hb.view(), cvec(targets), a);
  approx.select(hb.view(), cvec(targets), b);
  CHECK(on_host(a.offsets) == on_host(b.offsets));
  CHECK(on_host(a.ids) == on_host(b.ids));
  const auto oa = run_forward_backward(exact, hb, targets, {});
  const auto ob = run_forward_backward(approx, hb, targets, {});
  CHECK(same_outputs_across(oa, ob));
  // One probe: a smaller (or equal) candidate pool, every row still holds its target.
  fq_head<B> narrow(feature_query_selector(k, ip_index(w, n, d, lists), 1), mview(w, n, d), bias.data());
  xsoftmax::active_set_for<B> c;
  narrow.select(hb.view(), cvec(targets), c);
  CHECK(c.offsets.size() == size_t(batch + 1));
  CHECK(std::isfinite(narrow.forward(hb.view(), cvec(targets))));
}

TEST_CASE("feature query: rebuilds its index on schedule; bad K, nprobe and indexes raise typed errors") {
  test_rng rng(503);
  const index_t n = 30, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const auto hb = make_hidden<float>(p.h, batch, d);
  CHECK(message_of([] { feature_query_selector s(0); }).find("k = 0") != std::string::npos);
  fq_head<xsoftmax::serial> too_many(feature_query_selector(31), mview(p.w, n, d));
  CHECK_THROWS_AS((void)too_many.forward(hb.view(), cvec(p.targets)), xsoftmax::invalid_argument);
  CHECK(message_of([&] { (void)too_many.forward(hb.view(), cvec(p.targets)); })
            .find("k = 31 must be in [1, num_classes = 30]") != std::string::npos);
  CHECK(message_of([&] { feature_query_selector s(3, ip_index(p.w, n, d, 5), 6); }).find("nprobe = 6") !=
        std::string::npos);
  CHECK(message_of([&] { feature_query_selector s(3, xsoftmax::ivf_index{}, 1); }).find("empty") != std::string::npos);
  xsoftmax::ivf_index cos;
  cos.build(cview(p.w, n, d));
  CHECK(message_of([&] { feature_query_selector s(3, cos, 1); }).find("inner_product") != std::string::npos);
  // Index over 40 classes / over bf16 weights, used with a 30-class fp32 head.
  const auto w40 = random_floats(rng, 40 * d, 1.0);
  fq_head<xsoftmax::serial> other_n(feature_query_selector(3, ip_index(w40, 40, d, 4), 2), mview(p.w, n, d));
  CHECK_THROWS_AS((void)other_n.forward(hb.view(), cvec(p.targets)), xsoftmax::shape_error);
  CHECK(message_of([&] { (void)other_n.forward(hb.view(), cvec(p.targets)); }).find("num_classes = 40") !=
        std::string::npos);
  const auto w16 = convert<__nv_bfloat16>(p.w);
  xsoftmax::ivf_index idx16;
  xsoftmax::ivf_options o;
  o.num_lists = 4;
  o.metric = xsoftmax::similarity::inner_product;
  idx16.build(cview(w16, n, d), o);
  fq_head<xsoftmax::serial> other_p(feature_query_selector(3, idx16, 2), mview(p.w, n, d));
  CHECK(message_of([&] { (void)other_p.forward(hb.view(), cvec(p.targets)); })
            .find("built from bf16 weights but the head stores fp32 weights") != std::string::npos);
  // Rebuild schedule: every 2 steps the index follows the weights.
  fq_head<xsoftmax::serial> sched(feature_query_selector(3, ip_index(p.w, n, d, 4), 2, 2), mview(p.w, n, d));
  for (auto& x : p.w) x = -x;
  sched.next_step();  // step 1: not rebuilt, the index still holds the old (negated) weights
  CHECK(sched.selector().index().list_vectors()(0, 0) == -p.w[size_t(sched.selector().index().list_ids()[0] * d)]);
  sched.next_step();
  const auto& idx = sched.selector().index();
  CHECK(idx.list_vectors()(0, 0) == p.w[size_t(idx.list_ids()[0] * d)]);
}
