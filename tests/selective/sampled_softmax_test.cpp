// SPDX-License-Identifier: Apache-2.0
// selective_softmax with sampled negatives (TensorFlow's sampled_softmax_loss): drawing every class
// without replacement equals full_softmax bit for bit; one draw matches the float64 reference of
// the log-Q-corrected softmax with accidental hits removed, and its finite differences; the
// gradient averaged over many draws approaches the full softmax's as the number of negatives
// grows (consistent, not unbiased); draws are reproducible per (seed, step); bad options raise
// typed errors.

#include "selective/selection_support.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;
using xsoftmax::sampled_negatives;
using xsoftmax::sampling_options;

template <class B>
using sampled_head = xsoftmax::selective_softmax<sampled_negatives, xsoftmax::fp32, B>;

sampling_options opts(index_t m, bool unique, unsigned long long seed = 7) {
  sampling_options o;
  o.num_sampled = m;
  o.unique = unique;
  o.seed = seed;
  return o;
}

/// Relative L2 distance of `a` from `b`.
template <class A, class B>
double rel_error(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE_TEMPLATE("sampled softmax: drawing every class without replacement equals full_softmax bit for bit", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(201);
  const index_t n = 45, d = 7, batch = 10;
  std::vector<long long> counts(static_cast<size_t>(n));
  for (auto& c : counts) c = rng.integer(1, 100);
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    for (int kind = 0; kind < 3; ++kind) {
      const sampling_options o = opts(n, true);
      sampled_negatives s = kind == 0   ? sampled_negatives::uniform(n, o)
                            : kind == 1 ? sampled_negatives::log_uniform(n, o)
                                        : sampled_negatives::from_counts(counts, o, 0.75);
      sampled_head<B> head(s, mview(p.w, n, d), bias ? p.b.data() : nullptr);
      for (reduction r : {reduction::none, reduction::mean}) {
        loss_options opt;
        opt.reduce = r;
        INFO("distribution ", kind, ", bias ", bias, ", reduction ", reduction_name(r));
        CHECK(same_outputs_across(run_forward_backward(head, hb, p.targets, opt),
                                  run_forward_backward(full, hb, p.targets, opt)));
        head.next_step();
      }
    }
  }
}

TEST_CASE_TEMPLATE("sampled softmax: one draw matches the log-Q corrected reference and finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(202);
  const index_t n = 40, d = 5, batch = 12;
  for (bool unique : {true, false}) {
    problem p = make_problem(rng, n, n, d, batch, true, 0.15);
    const index_t m = 20;  // half the classes: targets are often drawn too (accidental hits)
    sampled_negatives s = unique ? sampled_negatives::uniform(n, opts(m, true)) : sampled_negatives::log_uniform(n, opts(m, false));
    s.set_step(3);
    std::vector<index_t> neg;
    std::vector<float> neg_off;
    s.negatives(neg, neg_off);
    // Q(c), computed here from the definitions: uniform unique m / N; log-uniform with replacement m p(c).
    auto q = [&](index_t c) {
      if (unique) return static_cast<double>(m) / n;
      return m * std::log((c + 2.0) / (c + 1.0)) / std::log(n + 1.0);
    };
    // The sampler's negative offsets are log k - log Q(c) with positive integer multiplicities k summing to m.
    double total = 0;
    for (size_t j = 0; j < neg.size(); ++j) {
      const double k = std::exp(neg_off[j] + std::log(q(neg[j])));
      CHECK(k == doctest::Approx(std::round(k)).epsilon(1e-4));
      CHECK(std::round(k) >= 1);
      if (unique) CHECK(std::round(k) == 1);
      total += std::round(k);
    }
    CHECK(total == m);
    std::map<index_t, double> neg_offset;
    for (size_t j = 0; j < neg.size(); ++j) neg_offset[neg[j]] = neg_off[j];
    bool hit = false;
    for (index_t t : p.targets) hit = hit || neg_offset.count(t);
    CHECK(hit);  // the draw exercises accidental-hit removal
    const auto ref = subset_reference(
        [&](index_t t) {
          std::vector<index_t> set = neg;
          if (!neg_offset.count(t)) set.push_back(t);
          return set;
        },
        [&](index_t t, index_t c) { return c == t ? -std::log(q(t)) : neg_offset.at(c); });
    sampled_head<B> head(s, mview(p.w, n, d), p.b.data());
    for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
      loss_options opt;
      opt.reduce = r;
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      const std::string what = std::string(unique ? "uniform unique" : "log-uniform with replacement") +
                               ", reduction " + reduction_name(r);
      const auto hb = make_hidden<float>(p.h, batch, d);
      check_forward(head, ref, p.params(), hb, p.targets, opt, what);
      const auto out = check_gradients(head, ref, p.params(), hb, p.targets, opt, grad_output, what);
      CHECK(gradient_rows(out.grad) == with_targets(neg, p.targets));
    }
  }
}

TEST_CASE("sampled softmax: the gradient averaged over draws approaches the full softmax's as m grows") {
  // Consistent, not unbiased: the error of the mean gradient over many draws falls with the number of
  // negatives m (the bias of the log-Q-corrected estimator shrinks, and so does its variance).
  test_rng rng(203);
  const index_t n = 120, d = 6, batch = 8, draws = 200;
  problem p = make_problem(rng, n, n, d, batch, false);
  for (auto& w : p.w) w *= 1.5f;  // a peaked softmax: the sampled estimate is visibly biased for small m
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> full(mview(p.w, n, d));
  const auto exact = run_forward_backward(full, hb, p.targets, {});
  const auto exact_w = scatter_gradient(exact.grad, n, d, false).w;
  const auto exact_h = to_doubles(exact.grad_hidden);
  for (bool unique : {false, true}) {
    std::vector<double> err_w, err_h;
    for (index_t m : {index_t(4), index_t(16), index_t(64)}) {
      sampling_options o = opts(m, unique, 99);
      sampled_head<xsoftmax::serial> head(unique ? sampled_negatives::uniform(n, o) : sampled_negatives::log_uniform(n, o),
                                          mview(p.w, n, d));
      std::vector<double> mean_w(static_cast<size_t>(n * d), 0.0), mean_h(static_cast<size_t>(batch * d), 0.0);
      for (index_t k = 0; k < draws; ++k) {
        const auto out = run_forward_backward(head, hb, p.targets, {});
        const auto g = scatter_gradient(out.grad, n, d, false);
        for (size_t i = 0; i < mean_w.size(); ++i) mean_w[i] += g.w[i] / draws;
        for (size_t i = 0; i < mean_h.size(); ++i) mean_h[i] += out.grad_hidden[i] / static_cast<double>(draws);
        head.next_step();
      }
      err_w.push_back(rel_error(mean_w, exact_w));
      err_h.push_back(rel_error(mean_h, exact_h));
    }
    const std::string kind = unique ? "uniform unique" : "log-uniform with replacement";
    INFO(kind, ": weight-gradient errors ", err_w[0], " ",
         err_w[1], " ", err_w[2], "; hidden-gradient errors ", err_h[0], " ", err_h[1], " ", err_h[2]);
    CHECK(err_w[0] > err_w[1]);
    CHECK(err_w[1] > err_w[2]);
    CHECK(err_h[0] > err_h[1]);
    CHECK(err_h[1] > err_h[2]);
    CHECK(err_w[2] < 0.5 * err_w[0]);
  }
}

TEST_CASE("sampled softmax: draws are reproducible per (seed, step); next_step moves on") {
  const index_t n = 1000;
  for (bool unique : {true, false}) {
    auto s = sampled_negatives::log_uniform(n, opts(50, unique, 5));
    std::vector<index_t> a, b, c;
    std::vector<float> oa, ob, oc;
    s.negatives(a, oa);
    s.negatives(b, ob);
    CHECK(a == b);
    CHECK(oa == ob);
    s.next_step();
    CHECK(s.step() == 1);
    s.negatives(c, oc);
    CHECK(a != c);
    if (unique) CHECK(a.size() == 50);
    auto other_seed = sampled_negatives::log_uniform(n, opts(50, unique, 6));
    other_seed.negatives(c, oc);
    CHECK(a != c);
    // Log-uniform favours small class ids.
    index_t small = 0;
    for (index_t x : a) small += x < n / 10 ? 1 : 0;
    CHECK(small > static_cast<index_t>(a.size()) / 2);
  }
  // A zero count is never drawn.
  std::vector<double> counts{0, 5, 0, 1, 2, 0, 9};
  auto s = sampled_negatives::from_counts(counts, opts(3, false));
  for (int k = 0; k < 20; ++k, s.next_step()) {
    std::vector<index_t> a;
    std::vector<float> o;
    s.negatives(a, o);
    for (index_t x : a) CHECK(counts[static_cast<size_t>(x)] > 0);
  }
}

TEST_CASE("sampled softmax: bad options raise typed errors naming the value") {
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  CHECK_THROWS_AS((void)sampled_negatives::uniform(10, opts(0, true)), xsoftmax::invalid_argument);
  CHECK(message_of([] { (void)sampled_negatives::uniform(10, opts(11, true)); }).find("num_sampled = 11") !=
        std::string::npos);
  CHECK_THROWS_AS((void)sampled_negatives::log_uniform(0, opts(1, true)), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)sampled_negatives::from_counts(std::vector<int>{1, -2, 3}, opts(1, true)), xsoftmax::invalid_argument);
  CHECK(message_of([] { (void)sampled_negatives::from_counts(std::vector<int>{1, -2, 3}, opts(1, true)); })
            .find("counts[1] = -2") != std::string::npos);
  CHECK_THROWS_AS((void)sampled_negatives::from_counts(std::vector<int>{0, 0}, opts(1, true)), xsoftmax::invalid_argument);
  CHECK_THROWS_AS((void)sampled_negatives::from_counts(std::vector<int>{0, 4, 0, 1}, opts(3, true)),
                  xsoftmax::invalid_argument);
  // A sampler for 30 classes used with a 20-class head.
  test_rng rng(204);
  problem p = make_problem(rng, 20, 20, 4, 3, false);
  sampled_head<xsoftmax::serial> head(sampled_negatives::uniform(30, opts(5, true)), mview(p.w, 20, 4));
  const auto hb = make_hidden<float>(p.h, 3, 4);
  CHECK_THROWS_AS((void)head.forward(hb.view(), cvec(p.targets)), xsoftmax::shape_error);
  CHECK(message_of([&] { (void)head.forward(hb.view(), cvec(p.targets)); })
            .find("built for num_classes = 30 but the head has num_classes = 20") != std::string::npos);
}
