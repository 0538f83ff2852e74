// SPDX-License-Identifier: Apache-2.0
// knn_softmax (Alibaba's KNN softmax): with graph K = N it equals full_softmax bit for bit; with a
// small K its active set is the union of the targets' neighbours and its loss and gradients match
// the float64 reference of the softmax over that set and its finite differences; the graph is
// rebuilt from the current weights every `rebuild_every` steps, or refreshed from its last lists
// between rebuilds on the schedule of `refreshes_between_rebuilds`; a graph built for another head
// (N, dim or precision) and bad K raise typed errors naming the values.

#include "selective/selection_support.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::knn_graph;
using xsoftmax::knn_options;
using xsoftmax::loss_options;
using xsoftmax::reduction;

knn_options options_with_k(index_t k, xsoftmax::similarity m = xsoftmax::similarity::cosine, index_t rebuild = 0) {
  knn_options o;
  o.graph.k = k;
  o.graph.metric = m;
  o.rebuild_every = rebuild;
  return o;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE_TEMPLATE("knn softmax: K = N equals full_softmax bit for bit", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(401);
  const index_t n = 48, d = 7, batch = 11;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    for (auto m : {xsoftmax::similarity::cosine, xsoftmax::similarity::inner_product}) {
      xsoftmax::knn_softmax<xsoftmax::fp32, B> knn(mview(p.w, n, d), options_with_k(n, m), bias ? p.b.data() : nullptr);
      xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), bias ? p.b.data() : nullptr);
      for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
        loss_options opt;
        opt.reduce = r;
        INFO("bias ", bias, ", reduction ", reduction_name(r));
        const auto hb = make_hidden<float>(p.h, batch, d, 1);
        CHECK(same_outputs_across(run_forward_backward(knn, hb, p.targets, opt),
                                  run_forward_backward(full, hb, p.targets, opt)));
      }
    }
  }
  // bf16 storage, owned weights: the same rows read the same way (on the host; see the helper for cuda).
  problem p = make_problem(rng, n, n, d, batch, false);
  xsoftmax::init_options init;
  init.seed = 3;
  xsoftmax::knn_softmax<xsoftmax::bf16, B> knn(n, d, options_with_k(n), false, init);
  xsoftmax::full_softmax<xsoftmax::bf16, B> full(knn.weights());
  const auto hb = make_hidden<float>(p.h, batch, d);
  check_low_precision_outputs_across(run_forward_backward(knn, hb, p.targets, {}),
                                     run_forward_backward(full, hb, p.targets, {}), 2e-2, "bf16 storage");
  CHECK(std::string(knn.graph().element()) == "bf16");
}

TEST_CASE_TEMPLATE("knn softmax: the active set is the union of the targets' neighbours; reference and gradients", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(402);
  const index_t n = 60, d = 5, batch = 9, k = 6;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    for (index_t used : {index_t(0), index_t(3)}) {
      knn_options o = options_with_k(k);
      o.neighbors_used = used;
      xsoftmax::knn_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d), o, bias ? p.b.data() : nullptr);
      const auto& g = head.graph();
      std::vector<index_t> active;
      for (index_t t : p.targets) {
        if (t < 0) continue;
        active.push_back(t);
        for (index_t j = 0; j < (used ? used : k); ++j) active.push_back(g.neighbors(t)[j]);
      }
      active = with_targets(active, {});
      CHECK(static_cast<index_t>(active.size()) < n);  // a real subset
      xsoftmax::active_set_for<B> set;
      const auto hb = make_hidden<float>(p.h, batch, d, 2);
      head.select(hb.view(), cvec(p.targets), set);
      CHECK(std::vector<index_t>(set.classes.begin(), set.classes.end()) == active);
      for (reduction r : {reduction::none, reduction::mean}) {
        loss_options opt;
        opt.reduce = r;
        test_vector<float> grad_output;
        if (r == reduction::none) grad_output = random_grad_output(rng, batch);
        const std::string what = std::string("bias ") + (bias ? "yes" : "no") + ", neighbours used " +
                                 std::to_string(used) + ", reduction " + reduction_name(r);
        check_forward(head, shared_reference(active), p.params(), hb, p.targets, opt, what);
        const auto out = check_gradients(head, shared_reference(active), p.params(), hb, p.targets, opt, grad_output, what);
        CHECK(gradient_rows(out.grad) == active);  // active rows only
      }
    }
  }
}

TEST_CASE("knn softmax: the graph is rebuilt from the current weights every rebuild_every steps") {
  test_rng rng(403);
  const index_t n = 70, d = 6, batch = 16, k = 5, every = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial> head(mview(p.w, n, d), options_with_k(k, xsoftmax::similarity::cosine, every));
  CHECK(head.graph().builds() == 1);
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> gh(static_cast<size_t>(batch * d));
  xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial>::gradient_type g;
  for (index_t step = 1; step <= 7; ++step) {
    head.forward_backward(hb.view(), cvec(p.targets), mview(gh, batch, d), g);
    head.apply_sgd(g, 2.0f);  // large steps: the neighbourhoods change
    head.next_step();
    CHECK(head.selector().steps() == step);
    CHECK(head.graph().builds() == 1 + step / every);
    if (step % every == 0) {
      xsoftmax::knn_build_options o;
      o.k = k;
      CHECK(head.graph().ids() == xsoftmax::build_knn_graph(cview(p.w, n, d), o).ids());
    }
  }
  head.rebuild_graph();
  CHECK(head.graph().builds() == 4);
}

TEST_CASE("knn softmax: refreshes between rebuilds follow their schedule and equal the builder's refresh") {
  test_rng rng(405);
  const index_t n = 80, d = 6, batch = 16, k = 6;
  problem p = make_problem(rng, n, n, d, batch, false);
  knn_options o = options_with_k(k, xsoftmax::similarity::cosine, 1);
  o.refreshes_between_rebuilds = 2;
  o.graph.refine.fanout = 3;  // a narrow pass: a refresh differs from a rebuild
  o.graph.refine.sample = 2;
  o.graph.refine.reverse = 1;
  xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial> head(mview(p.w, n, d), o);
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> gh(static_cast<size_t>(batch * d));
  xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial>::gradient_type g;
  index_t refreshes_unlike_rebuilds = 0;
  for (index_t step = 1; step <= 6; ++step) {
    head.forward_backward(hb.view(), cvec(p.targets), mview(gh, batch, d), g);
    head.apply_sgd(g, 4.0f);  // large steps: the neighbourhoods change
    knn_graph before = head.graph();
    head.next_step();
    const bool rebuilt = step % 3 == 0;  // refresh, refresh, rebuild, ...
    INFO("step ", step);
    CHECK(head.selector().refreshes_since_build() == (rebuilt ? 0 : step % 3));
    CHECK(head.graph().builds() == 1 + step);
    const knn_graph rebuild = xsoftmax::build_knn_graph(cview(p.w, n, d), o.graph);
    xsoftmax::knn_graph_builder(o.graph).refresh(cview(p.w, n, d), before);
    CHECK(head.graph().ids() == (rebuilt ? rebuild.ids() : before.ids()));
    if (!rebuilt && before.ids() != rebuild.ids()) ++refreshes_unlike_rebuilds;
  }
  CHECK(refreshes_unlike_rebuilds > 0);  // so the schedule is seen
  head.refresh_graph();
  CHECK(head.selector().refreshes_since_build() == 1);
  head.rebuild_graph();
  CHECK(head.selector().refreshes_since_build() == 0);
  knn_options bad = o;
  bad.refreshes_between_rebuilds = -1;
  CHECK_THROWS_WITH_AS(xsoftmax::knn_selector{bad}, doctest::Contains("refreshes_between_rebuilds = -1"),
                       xsoftmax::invalid_argument);
}

TEST_CASE("knn softmax: bad K and a graph built for another head raise typed errors naming the values") {
  test_rng rng(404);
  const index_t n = 20, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  using head32 = xsoftmax::knn_softmax<xsoftmax::fp32, xsoftmax::serial>;
  CHECK_THROWS_AS(head32(mview(p.w, n, d), options_with_k(0)), xsoftmax::invalid_argument);
  CHECK(message_of([&] { head32 h(mview(p.w, n, d), options_with_k(0)); }).find("k = 0") != std::string::npos);
  CHECK_THROWS_AS(head32(mview(p.w, n, d), options_with_k(n + 1)), xsoftmax::invalid_argument);
  CHECK(message_of([&] { head32 h(mview(p.w, n, d), options_with_k(n + 1)); })
            .find("k = 21 must be in [1, num_classes = 20]") != std::string::npos);
  knn_options o = options_with_k(3);
  o.neighbors_used = 4;
  CHECK(message_of([&] { head32 h(mview(p.w, n, d), o); }).find("neighbors_used = 4") != std::string::npos);

  // A graph for 25 classes, or for width 5, used with a 20 x 4 head.
  const auto hb = make_hidden<float>(p.h, batch, d);
  using sel_head = xsoftmax::selective_softmax<xsoftmax::knn_selector, xsoftmax::fp32, xsoftmax::serial>;
  const auto w25 = random_floats(rng, 25 * d, 1.0);
  xsoftmax::knn_build_options bo;
  bo.k = 3;
  sel_head other_n(xsoftmax::knn_selector(xsoftmax::build_knn_graph(cview(w25, 25, d), bo), options_with_k(3)),
                   mview(p.w, n, d));
  CHECK_THROWS_AS((void)other_n.forward(hb.view(), cvec(p.targets)), xsoftmax::shape_error);
  CHECK(message_of([&] { (void)other_n.forward(hb.view(), cvec(p.targets)); })
            .find("built for num_classes = 25, dim = 4 but the head has num_classes = 20, dim = 4") != std::string::npos);
  const auto w5 = random_floats(rng, n * 5, 1.0);
  sel_head other_d(xsoftmax::knn_selector(xsoftmax::build_knn_graph(cview(w5, n, 5), bo), options_with_k(3)),
                   mview(p.w, n, d));
  CHECK(message_of([&] { (void)other_d.forward(hb.view(), cvec(p.targets)); }).find("dim = 5") != std::string::npos);
  // A graph built from bf16 weights used with an fp32 head.
  const auto w16 = convert<__nv_bfloat16>(p.w);
  sel_head other_p(xsoftmax::knn_selector(xsoftmax::build_knn_graph(cview(w16, n, d), bo), options_with_k(3)),
                   mview(p.w, n, d));
  CHECK_THROWS_AS((void)other_p.forward(hb.view(), cvec(p.targets)), xsoftmax::invalid_argument);
  CHECK(message_of([&] { (void)other_p.forward(hb.view(), cvec(p.targets)); })
            .find("built from bf16 weights but the head stores fp32 weights") != std::string::npos);
  // An empty graph.
  sel_head empty(xsoftmax::knn_selector(options_with_k(3)), mview(p.w, n, d));
  CHECK(message_of([&] { (void)empty.forward(hb.view(), cvec(p.targets)); }).find("graph is empty") != std::string::npos);
  // Caller-given lists carry no precision: accepted by any head of the right shape.
  std::vector<index_t> lists(static_cast<size_t>(n * 2));
  for (index_t c = 0; c < n; ++c) lists[size_t(2 * c)] = c, lists[size_t(2 * c + 1)] = (c + 1) % n;
  sel_head given(xsoftmax::knn_selector(xsoftmax::knn_graph::from_lists(n, d, 2, lists), options_with_k(2)),
                 mview(p.w, n, d));
  CHECK(std::isfinite(given.forward(hb.view(), cvec(p.targets))));
  // Empty neighbour slots (-1) add nothing to the set: the same outputs as the class itself in those
  // slots (the set holds every target anyway), and select() lists the targets and real neighbours.
  std::vector<index_t> holes(lists), selves(lists);
  for (index_t c = 0; c < n; c += 3) holes[size_t(2 * c + 1)] = -1, selves[size_t(2 * c + 1)] = c;
  const sel_head with_holes(xsoftmax::knn_selector(xsoftmax::knn_graph::from_lists(n, d, 2, holes), options_with_k(2)),
                            mview(p.w, n, d));
  const sel_head with_selves(xsoftmax::knn_selector(xsoftmax::knn_graph::from_lists(n, d, 2, selves), options_with_k(2)),
                             mview(p.w, n, d));
  CHECK(same_outputs_across(run_forward_backward(with_holes, hb, p.targets, {}),
                            run_forward_backward(with_selves, hb, p.targets, {})));
  xsoftmax::active_set set;
  with_holes.select(hb.view(), cvec(p.targets), set);
  std::vector<index_t> expected;
  for (index_t t : p.targets) {
    if (t < 0) continue;
    for (index_t j = 0; j < 2; ++j) {
      const index_t c = holes[size_t(2 * t + j)];
      expected.push_back(c >= 0 ? c : t);
    }
    expected.push_back(t);
  }
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  CHECK(std::vector<index_t>(set.classes.begin(), set.classes.end()) == expected);
}
