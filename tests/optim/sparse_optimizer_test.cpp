// SPDX-License-Identifier: Apache-2.0
// Sparse optimizers (momentum / Nesterov, Adagrad, Adam and AdamW in the lazy form) against a dense
// float64 reference restricted to the touched rows, over steps that touch some rows and not others;
// bitwise repeatability; untouched rows and their state never change; a bad gradient changes
// nothing; learning-rate schedules against their formulas. Every backend of the build.

#include "support/test_memory.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/optim/schedules.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::read_back;
using xsoftmax_test::test_vector;

/// One step's sparse gradient on the host: unique rows (some rows untouched), values, bias values.
struct host_gradient {
  std::vector<index_t> rows;
  std::vector<float> values, bias_values;
};

host_gradient random_gradient(std::mt19937& g, index_t rows, index_t dim, bool bias) {
  host_gradient h;
  for (index_t r = 0; r < rows; ++r)
    if (g() % 3 != 0) h.rows.push_back(r);  // about two thirds of the rows
  std::shuffle(h.rows.begin(), h.rows.end(), g);  // any order: the optimizer must not care
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < h.rows.size() * static_cast<std::size_t>(dim); ++i) h.values.push_back(nd(g));
  if (bias)
    for (std::size_t i = 0; i < h.rows.size(); ++i) h.bias_values.push_back(nd(g));
  return h;
}

template <class B>
xs::sparse_gradient<B, float> to_backend(const host_gradient& h, index_t dim) {
  xs::sparse_gradient<B, float> g;
  g.dim = dim;
  g.rows.assign(h.rows.begin(), h.rows.end());
  g.values.assign(h.values.begin(), h.values.end());
  g.bias_values.assign(h.bias_values.begin(), h.bias_values.end());
  return g;
}

/// The float64 reference of one rule: one element, state `s`, its row's update count `t`.
struct reference_rule {
  std::string kind;
  double mu = 0.9, wd = 0, eps = 1e-8, b1 = 0.9, b2 = 0.999;
  bool nesterov = false, decoupled = true;
  int slots = 1;

  void apply(double& w, double g, double* s, long t, double lr) const {
    if (kind == "momentum") {
      const double d = g + wd * w;
      s[0] = mu * s[0] + d;
      w -= lr * (nesterov ? d + mu * s[0] : s[0]);
    } else if (kind == "adagrad") {
      const double d = g + wd * w;
      s[0] += d * d;
      w -= lr * d / (std::sqrt(s[0]) + eps);
    } else {
      if (decoupled) w -= lr * wd * w;
      else g += wd * w;
      s[0] = b1 * s[0] + (1 - b1) * g;
      s[1] = b2 * s[1] + (1 - b2) * g * g;
      const double mh = s[0] / (1 - std::pow(b1, t)), vh = s[1] / (1 - std::pow(b2, t));
      w -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

/// Runs `steps` random steps through `opt` and through the reference; checks weights, bias and
/// state after every step, and that untouched rows stay bitwise the same.
template <class B, class Rule>
void check_against_reference(Rule rule, const reference_rule& ref, std::uint32_t seed) {
  const index_t rows = 23, dim = 9, steps = 7;
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<float> w0(static_cast<std::size_t>(rows * dim)), b0(static_cast<std::size_t>(rows));
  for (auto& x : w0) x = nd(g);
  for (auto& x : b0) x = nd(g);
  test_vector<float> w(w0.begin(), w0.end()), b(b0.begin(), b0.end());
  xs::sparse_optimizer<Rule, B> opt(rows, dim, true, rule);
  std::vector<double> rw(w0.begin(), w0.end()), rb(b0.begin(), b0.end());
  std::vector<double> rs(static_cast<std::size_t>(rows * dim * ref.slots), 0.0), rbs(static_cast<std::size_t>(rows * ref.slots), 0.0);
  std::vector<long> count(static_cast<std::size_t>(rows), 0);
  for (index_t step = 0; step < steps; ++step) {
    const float lr = 0.05f * static_cast<float>(step + 1);
    const host_gradient hg = random_gradient(g, rows, dim, true);
    const auto before = read_back(w.data(), rows * dim);
    opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), to_backend<B>(hg, dim), lr);
    for (std::size_t i = 0; i < hg.rows.size(); ++i) {
      const index_t r = hg.rows[i];
      const long t = ++count[r];
      for (index_t j = 0; j < dim; ++j)
        ref.apply(rw[r * dim + j], hg.values[i * dim + j], &rs[(r * dim + j) * ref.slots], t, lr);
      ref.apply(rb[r], hg.bias_values[i], &rbs[r * ref.slots], t, lr);
    }
    const auto after = read_back(w.data(), rows * dim);
    const auto bias_after = read_back(b.data(), rows);
    const std::set<index_t> touched(hg.rows.begin(), hg.rows.end());
    for (index_t r = 0; r < rows; ++r) {
      for (index_t j = 0; j < dim; ++j) {
        const std::size_t e = static_cast<std::size_t>(r * dim + j);
        INFO("step ", step, ", row ", r, ", column ", j);
        if (!touched.count(r)) CHECK(after[e] == before[e]);  // bitwise: never read nor written
        CHECK(after[e] == doctest::Approx(rw[e]).epsilon(2e-5).scale(1.0));
      }
      CHECK(bias_after[r] == doctest::Approx(rb[r]).epsilon(2e-5).scale(1.0));
    }
  }
  const auto state = read_back(opt.state(), rows * dim * ref.slots);
  for (std::size_t e = 0; e < state.size(); ++e) CHECK(state[e] == doctest::Approx(rs[e]).epsilon(2e-5).scale(1.0));
  const auto counts = read_back(opt.update_counts(), rows);
  for (index_t r = 0; r < rows; ++r) CHECK(counts[r] == count[r]);
  CHECK(opt.steps() == steps);
}

}  // namespace

TEST_CASE_TEMPLATE("sparse optimizers equal a float64 reference on the touched rows and leave the others alone", B,
                   XSOFTMAX_TEST_BACKENDS) {
  reference_rule m{"momentum"};
  SUBCASE("momentum") { check_against_reference<B>(xs::momentum_rule(0.9f), m, 1); }
  SUBCASE("nesterov with weight decay") {
    reference_rule r = m;
    r.nesterov = true;
    r.wd = 0.01;
    check_against_reference<B>(xs::momentum_rule(0.9f, true, 0.01f), r, 2);
  }
  SUBCASE("adagrad") {
    reference_rule r{"adagrad"};
    r.eps = 1e-10;
    r.wd = 0.001;
    check_against_reference<B>(xs::adagrad_rule(1e-10f, 0.001f), r, 3);
  }
  SUBCASE("adam (L2 decay in the gradient)") {
    reference_rule r{"adam"};
    r.slots = 2;
    r.wd = 0.01;
    r.decoupled = false;
    check_against_reference<B>(xs::adam_rule(0.9f, 0.999f, 1e-8f, 0.01f, false), r, 4);
  }
  SUBCASE("adamw (decoupled decay)") {
    reference_rule r{"adam"};
    r.slots = 2;
    r.b1 = 0.8;
    r.b2 = 0.99;
    r.wd = 0.05;
    check_against_reference<B>(xs::adam_rule(0.8f, 0.99f, 1e-8f, 0.05f, true), r, 5);
  }
}

TEST_CASE_TEMPLATE("sparse optimizers are bitwise repeatable; a bad gradient changes neither weights nor state", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t rows = 40, dim = 6;
  std::mt19937 g(9);
  std::vector<host_gradient> grads;
  for (int s = 0; s < 4; ++s) grads.push_back(random_gradient(g, rows, dim, false));
  auto run = [&](test_vector<float>& w, xs::sparse_adam<B>& opt) {
    for (const auto& hg : grads) opt.step(xs::matrix_view<float>(w.data(), rows, dim), nullptr, to_backend<B>(hg, dim), 0.01f);
  };
  test_vector<float> w1(static_cast<std::size_t>(rows * dim), 0.5f), w2 = w1;
  xs::sparse_adam<B> a1(rows, dim, false), a2(rows, dim, false);
  run(w1, a1);
  run(w2, a2);
  CHECK(read_back(w1.data(), rows * dim) == read_back(w2.data(), rows * dim));

  const auto w_before = read_back(w1.data(), rows * dim);
  const auto s_before = read_back(a1.state(), rows * dim * 2);
  const xs::matrix_view<float> view(w1.data(), rows, dim);
  host_gradient bad = grads[0];
  bad.values[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(a1.step(view, nullptr, to_backend<B>(bad, dim), 0.01f), xs::non_finite_error);
  bad = grads[0];
  bad.rows[1] = bad.rows[0];
  CHECK_THROWS_AS(a1.step(view, nullptr, to_backend<B>(bad, dim), 0.01f), xs::invalid_argument);
  bad = grads[0];
  bad.rows[0] = rows;
  CHECK_THROWS_AS(a1.step(view, nullptr, to_backend<B>(bad, dim), 0.01f), xs::out_of_range);
  CHECK_THROWS_AS(a1.step(view, nullptr, to_backend<B>(grads[0], dim), std::numeric_limits<float>::infinity()),
                  xs::non_finite_error);
  CHECK_THROWS_AS(a1.step(xs::matrix_view<float>(w1.data(), rows - 1, dim), nullptr, to_backend<B>(grads[0], dim), 0.01f),
                  xs::shape_error);
  CHECK(read_back(w1.data(), rows * dim) == w_before);
  CHECK(read_back(a1.state(), rows * dim * 2) == s_before);
  CHECK(a1.steps() == 4);
}

TEST_CASE_TEMPLATE("sparse Adam trains a full softmax head through its sparse gradient", B, XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 50, d = 8, batch = 32;
  xs::full_softmax<xs::fp32, B> head(n, d, true);
  xs::sparse_adam<B> opt(n, d, true, xs::adam_rule(0.9f, 0.999f));
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  test_vector<float> h(static_cast<std::size_t>(batch * d)), gh(h.size());
  test_vector<index_t> t(static_cast<std::size_t>(batch));
  for (auto& x : h) x = nd(g);
  for (index_t i = 0; i < batch; ++i) t[i] = i % 7;  // a learnable mapping
  typename xs::full_softmax<xs::fp32, B>::gradient_type grad;
  const xs::warmup_cosine schedule(0.05f, 5, 60);
  float first = 0, last = 0;
  for (int s = 0; s < 60; ++s) {
    last = head.forward_backward(xs::matrix_view<float>(h.data(), batch, d), xs::vector_view<const index_t>(t.data(), batch),
                                 xs::matrix_view<float>(gh.data(), batch, d), grad);
    if (s == 0) first = last;
    opt.step(head, grad, schedule(opt.steps()));
  }
  CHECK(last < 0.5f * first);
}

TEST_CASE("learning-rate schedules: warm-up, then cosine, polynomial and step decay; bad values are rejected") {
  const xs::warmup_cosine cosine(1.f, 10, 110, 0.1f);
  CHECK(cosine(0) == doctest::Approx(0.1));
  CHECK(cosine(9) == doctest::Approx(1.0));
  CHECK(cosine(10) == doctest::Approx(1.0));
  CHECK(cosine(60) == doctest::Approx(0.55));
  CHECK(cosine(110) == doctest::Approx(0.1));
  CHECK(cosine(500) == doctest::Approx(0.1));
  const xs::warmup_polynomial poly(2.f, 0, 100, 2.0);
  CHECK(poly(0) == doctest::Approx(2.0));
  CHECK(poly(50) == doctest::Approx(0.5));
  CHECK(poly(100) == doctest::Approx(0.0));
  const xs::warmup_step stepped(1.f, 4, 10, 0.5);
  CHECK(stepped(1) == doctest::Approx(0.5));
  CHECK(stepped(4) == doctest::Approx(1.0));
  CHECK(stepped(14) == doctest::Approx(0.5));
  CHECK(stepped(25) == doctest::Approx(0.25));
  CHECK(xs::constant_lr{0.3f}(7) == doctest::Approx(0.3));
  CHECK_THROWS_AS(xs::warmup_cosine(0.f, 1, 10), xs::invalid_argument);
  CHECK_THROWS_AS(xs::warmup_cosine(1.f, 10, 10), xs::invalid_argument);
  CHECK_THROWS_AS(xs::warmup_polynomial(1.f, 0, 10, -1.0), xs::invalid_argument);
  CHECK_THROWS_AS(xs::warmup_step(1.f, 0, 0), xs::invalid_argument);
  CHECK_THROWS_AS(xs::momentum_rule(1.5f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::adam_rule(0.9f, 1.0f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::adagrad_rule(0.f), xs::invalid_argument);
  CHECK(xs::sparse_adam<>::state_bytes(100, 512, false) == 100u * 512u * 2u * 4u + 100u * 8u);
}
