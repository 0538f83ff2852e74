// SPDX-License-Identifier: Apache-2.0
// LARS and LAMB with per-layer trust ratios: the dense optimizers over several layers and the
// sparse variants over the touched rows of a head's gradient, against float64 references written
// here, over steps with a schedule's rates (and, sparse, steps touching different rows); bitwise
// repeatability (and serial == omp); the fixed-order sum; bad inputs throw typed errors and change
// nothing. Every backend of the build.

#include "support/test_memory.hpp"

#include <xsoftmax/detail/primitives/blocked_sum.hpp>
#include <xsoftmax/optim/large_batch.hpp>
#include <xsoftmax/optim/schedules.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::read_back;
using xsoftmax_test::test_vector;

/// The float64 reference of LARS (lamb = false) or LAMB, for one element and for a layer's ratio.
struct reference_rule {
  bool lamb = false;
  double mu = 0.9, wd = 0, eta = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-6;
  bool bias_correction = true;

  /// The value whose norm is the ratio's denominator: g for LARS, LAMB's update u.
  double term(double w, double g, const double* s, long t) const {
    if (!lamb) return g;
    const double m = b1 * s[0] + (1 - b1) * g, v = b2 * s[1] + (1 - b2) * g * g;
    const double c1 = bias_correction ? 1 - std::pow(b1, t) : 1, c2 = bias_correction ? 1 - std::pow(b2, t) : 1;
    return (m / c1) / (std::sqrt(v / c2) + eps) + wd * w;
  }
  double trust(double wn, double tn) const {
    if (wn <= 0 || tn <= 0) return 1;
    return lamb ? wn / tn : eta * wn / (tn + wd * wn);
  }
  void apply(double& w, double g, double* s, long t, double lr_trust) const {
    if (!lamb) {
      s[0] = mu * s[0] + lr_trust * (g + wd * w);
      w -= s[0];
      return;
    }
    const double u = term(w, g, s, t);
    s[0] = b1 * s[0] + (1 - b1) * g;
    s[1] = b2 * s[1] + (1 - b2) * g * g;
    w -= lr_trust * u;
  }
};

std::vector<float> normal_values(std::mt19937& g, index_t n, float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = nd(g);
  return v;
}

/// Dense layers {37, 300, 4}; the last starts at zero weights (ratio 1 on the first step) and gets
/// a zero gradient on step 2. Checks weights and ratios against the reference after every step.
template <class B, class Rule>
void check_dense_against_reference(Rule rule, const reference_rule& ref, std::uint32_t seed) {
  const std::vector<index_t> sizes{37, 300, 4};
  std::mt19937 g(seed);
  xs::large_batch_optimizer<Rule, B> opt(sizes, rule);
  std::vector<test_vector<float>> w, grad(sizes.size());
  std::vector<std::vector<double>> rw, rs;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    auto v = normal_values(g, sizes[l], 0.5f);
    if (l == 2) std::fill(v.begin(), v.end(), 0.f);
    w.emplace_back(v.begin(), v.end());
    rw.emplace_back(v.begin(), v.end());
    rs.emplace_back(v.size() * (ref.lamb ? 2 : 1), 0.0);
  }
  const xs::warmup_cosine schedule(ref.lamb ? 0.01f : 2.f, 2, 6);
  for (long step = 1; step <= 5; ++step) {
    const float lr = schedule(opt.steps());
    std::vector<xs::dense_layer> layers;
    for (std::size_t l = 0; l < sizes.size(); ++l) {
      auto v = normal_values(g, sizes[l], 1.f);
      if (l == 2 && step == 2) std::fill(v.begin(), v.end(), 0.f);
      grad[l].assign(v.begin(), v.end());
      layers.push_back({{w[l].data(), sizes[l]}, {grad[l].data(), sizes[l]}});
    }
    opt.step(layers, lr);
    for (std::size_t l = 0; l < sizes.size(); ++l) {
      const int slots = ref.lamb ? 2 : 1;
      double wn = 0, tn = 0;
      for (std::size_t e = 0; e < rw[l].size(); ++e) {
        const double t = ref.term(rw[l][e], grad[l][e], &rs[l][e * slots], step);
        wn += rw[l][e] * rw[l][e];
        tn += t * t;
      }
      const double trust = ref.trust(std::sqrt(wn), std::sqrt(tn));
      INFO("step ", step, ", layer ", l);
      CHECK(opt.trust_ratios()[l] == doctest::Approx(trust).epsilon(1e-5));
      for (std::size_t e = 0; e < rw[l].size(); ++e) ref.apply(rw[l][e], grad[l][e], &rs[l][e * slots], step, lr * trust);
      const auto got = read_back(w[l].data(), sizes[l]);
      for (std::size_t e = 0; e < rw[l].size(); ++e) CHECK(got[e] == doctest::Approx(rw[l][e]).epsilon(1e-4).scale(1.0));
    }
  }
  CHECK(opt.steps() == 5);
}

/// A sparse step's gradient on the host: unique touched rows in any order, values, bias values.
struct host_gradient {
  std::vector<index_t> rows;
  std::vector<float> values, bias_values;
};

host_gradient random_gradient(std::mt19937& g, index_t rows, index_t dim) {
  host_gradient h;
  for (index_t r = 0; r < rows; ++r)
    if (g() % 2 != 0) h.rows.push_back(r);  // about half the rows, different ones each step
  std::shuffle(h.rows.begin(), h.rows.end(), g);
  h.values = normal_values(g, static_cast<index_t>(h.rows.size()) * dim, 1.f);
  h.bias_values = normal_values(g, static_cast<index_t>(h.rows.size()), 1.f);
  return h;
}

template <class B>
xs::sparse_gradient<B, float> to_backend(const host_gradient& h, index_t dim, bool bias = true) {
  xs::sparse_gradient<B, float> g;
  g.dim = dim;
  g.rows.assign(h.rows.begin(), h.rows.end());
  g.values.assign(h.values.begin(), h.values.end());
  if (bias) g.bias_values.assign(h.bias_values.begin(), h.bias_values.end());
  return g;
}

/// The sparse variants: the layer is the touched rows and their bias entries; LAMB's bias
/// correction counts each row's own updates.
template <class B, class Rule>
void check_sparse_against_reference(Rule rule, const reference_rule& ref, std::uint32_t seed) {
  const index_t rows = 23, dim = 9;
  const int slots = ref.lamb ? 2 : 1;
  std::mt19937 g(seed);
  const auto w0 = normal_values(g, rows * dim, 0.5f), b0 = normal_values(g, rows, 0.5f);
  test_vector<float> w(w0.begin(), w0.end()), b(b0.begin(), b0.end());
  xs::sparse_trust_ratio_optimizer<Rule, B> opt(rows, dim, true, rule);
  std::vector<double> rw(w0.begin(), w0.end()), rb(b0.begin(), b0.end());
  std::vector<double> rs(static_cast<std::size_t>(rows * dim * slots), 0.0), rbs(static_cast<std::size_t>(rows * slots), 0.0);
  std::vector<long> count(static_cast<std::size_t>(rows), 0);
  for (int step = 0; step < 6; ++step) {
    const float lr = ref.lamb ? 0.01f : 1.f;
    const host_gradient hg = random_gradient(g, rows, dim);
    opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), to_backend<B>(hg, dim), lr);
    double wn = 0, tn = 0;
    auto add = [&](double wv, double gv, const double* s, long t) {
      const double x = ref.term(wv, gv, s, t);
      wn += wv * wv;
      tn += x * x;
    };
    for (std::size_t i = 0; i < hg.rows.size(); ++i) {
      const index_t r = hg.rows[i];
      for (index_t j = 0; j < dim; ++j) add(rw[r * dim + j], hg.values[i * dim + j], &rs[(r * dim + j) * slots], count[r] + 1);
      add(rb[r], hg.bias_values[i], &rbs[r * slots], count[r] + 1);
    }
    const double trust = ref.trust(std::sqrt(wn), std::sqrt(tn));
    CHECK(opt.trust_ratio() == doctest::Approx(trust).epsilon(1e-5));
    for (std::size_t i = 0; i < hg.rows.size(); ++i) {
      const index_t r = hg.rows[i];
      const long t = ++count[r];
      for (index_t j = 0; j < dim; ++j)
        ref.apply(rw[r * dim + j], hg.values[i * dim + j], &rs[(r * dim + j) * slots], t, lr * trust);
      ref.apply(rb[r], hg.bias_values[i], &rbs[r * slots], t, lr * trust);
    }
    const auto got = read_back(w.data(), rows * dim), got_bias = read_back(b.data(), rows);
    for (std::size_t e = 0; e < rw.size(); ++e) CHECK(got[e] == doctest::Approx(rw[e]).epsilon(1e-4).scale(1.0));
    for (std::size_t r = 0; r < rb.size(); ++r) CHECK(got_bias[r] == doctest::Approx(rb[r]).epsilon(1e-4).scale(1.0));
  }
  const auto counts = read_back(opt.base().update_counts(), rows);
  for (index_t r = 0; r < rows; ++r) CHECK(counts[r] == count[r]);
}

}  // namespace

TEST_CASE_TEMPLATE("LARS and LAMB equal a float64 reference, dense layers and sparse touched rows", B,
                   XSOFTMAX_TEST_BACKENDS) {
  reference_rule lars;
  lars.wd = 0.01;
  lars.eta = 0.02;
  reference_rule lamb;
  lamb.lamb = true;
  lamb.wd = 0.01;
  SUBCASE("dense LARS") { check_dense_against_reference<B>(xs::lars_rule(0.9f, 0.01f, 0.02f), lars, 1); }
  SUBCASE("dense LAMB") { check_dense_against_reference<B>(xs::lamb_rule(0.9f, 0.999f, 1e-6f, 0.01f), lamb, 2); }
  SUBCASE("sparse LARS") { check_sparse_against_reference<B>(xs::lars_rule(0.9f, 0.01f, 0.02f), lars, 3); }
  SUBCASE("sparse LAMB") { check_sparse_against_reference<B>(xs::lamb_rule(0.9f, 0.999f, 1e-6f, 0.01f), lamb, 4); }
  SUBCASE("sparse LAMB, no bias correction") {
    reference_rule r = lamb;
    r.bias_correction = false;
    r.b2 = 0.99;
    check_sparse_against_reference<B>(xs::lamb_rule(0.9f, 0.99f, 1e-6f, 0.01f, false), r, 5);
  }
}

namespace {
/// Integer terms, summed exactly in double whatever the order: the test of the folding levels.
struct integer_terms {
  XSOFTMAX_HD xs::detail::sum_pair operator()(index_t e) const {
    return {static_cast<double>(e), static_cast<double>(e % 7)};
  }
};
}  // namespace

TEST_CASE_TEMPLATE("the fixed-order sum is exact on integers across several folding levels", B, XSOFTMAX_TEST_BACKENDS) {
  const typename xs::detail::execution<B>::resources_type res{};
  const xs::detail::execution<B> ex{res};
  using squares = integer_terms;
  const index_t n = 5000;  // first_block 1: 5000 partials, folded to 3, then 1
  const auto s = xs::detail::blocked_sum(ex, n, squares{}, 1);
  CHECK(s.first == double(n) * (n - 1) / 2);
  double sevens = 0;
  for (index_t e = 0; e < n; ++e) sevens += static_cast<double>(e % 7);
  CHECK(s.second == sevens);
  CHECK(xs::detail::blocked_sum(ex, 0, squares{}).first == 0);
}

namespace {
template <class B>
std::vector<float> lamb_run(const std::vector<std::vector<float>>& grads, index_t n, bool attached = false) {
  test_vector<float> caller_state(static_cast<std::size_t>(2 * n), 5.f);
  xs::lamb<B> opt = attached ? xs::lamb<B>({n}, xs::lamb_rule{}, caller_state.data()) : xs::lamb<B>({n});
  if (attached) opt.reset();  // attached state is not initialised: reset() starts afresh
  test_vector<float> w(static_cast<std::size_t>(n), 0.25f), g(static_cast<std::size_t>(n));
  for (const auto& step : grads) {
    g.assign(step.begin(), step.end());
    opt.step({{{w.data(), n}, {g.data(), n}}}, 0.01f);
  }
  const auto out = read_back(w.data(), n);
  return std::vector<float>(out.begin(), out.end());
}
}  // namespace

TEST_CASE_TEMPLATE("large-batch steps are bitwise repeatable; bad inputs throw and change nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 5000;
  std::mt19937 g(7);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(normal_values(g, n, 1.f));
  const auto first = lamb_run<B>(grads, n);
  CHECK(lamb_run<B>(grads, n) == first);
  CHECK(lamb_run<B>(grads, n, true) == first);
#if XSOFTMAX_TEST_HOST_BUILD
  CHECK(lamb_run<xs::serial>(grads, n) == lamb_run<xs::omp>(grads, n));  // the sum's order is the thread count's
#endif

  xs::lars<B> opt({n, 3}, xs::lars_rule(0.9f, 1e-4f, 0.001f));
  test_vector<float> w(static_cast<std::size_t>(n), 0.5f), gr(grads[0].begin(), grads[0].end()), w2(3, 1.f), g2(3, 1.f);
  auto layers = [&](index_t n0, index_t n1) {
    return std::vector<xs::dense_layer>{{{w.data(), n0}, {gr.data(), n0}}, {{w2.data(), n1}, {g2.data(), n1}}};
  };
  opt.step(layers(n, 3), 0.1f);
  const auto w_before = read_back(w.data(), n), s_before = read_back(opt.state(), n + 3);
  const auto w2_before = read_back(w2.data(), 3);
  CHECK_THROWS_AS(opt.step(layers(n, 3), -0.1f), xs::invalid_argument);
  CHECK_THROWS_AS(opt.step(layers(n, 3), std::numeric_limits<float>::infinity()), xs::non_finite_error);
  CHECK_THROWS_AS(opt.step(layers(n - 1, 3), 0.1f), xs::shape_error);
  CHECK_THROWS_AS(opt.step({layers(n, 3)[0]}, 0.1f), xs::shape_error);
  g2[1] = std::numeric_limits<float>::quiet_NaN();  // the second layer's bad gradient: the first is untouched too
  CHECK_THROWS_AS(opt.step(layers(n, 3), 0.1f), xs::non_finite_error);
  g2[1] = 1.f;
  w2[2] = std::numeric_limits<float>::infinity();  // a non-finite norm, so a non-finite ratio
  CHECK_THROWS_AS(opt.step(layers(n, 3), 0.1f), xs::non_finite_error);
  w2[2] = w2_before[2];
  CHECK(read_back(w.data(), n) == w_before);
  CHECK(read_back(w2.data(), 3) == w2_before);
  CHECK(read_back(opt.state(), n + 3) == s_before);
  CHECK(opt.steps() == 1);
  try {
    opt.step(layers(n, 3), -2.f);
  } catch (const xs::invalid_argument& e) {
    CHECK(std::string(e.what()).find("-2") != std::string::npos);
  }

  // Sparse: a bad gradient or rate leaves weights, state and counts alone.
  const index_t rows = 12, dim = 4;
  xs::sparse_lamb<B> sparse(rows, dim, false);
  test_vector<float> sw(static_cast<std::size_t>(rows * dim), 0.3f);
  const xs::matrix_view<float> view(sw.data(), rows, dim);
  const host_gradient hg = random_gradient(g, rows, dim);
  sparse.step(view, nullptr, to_backend<B>(hg, dim, false), 0.01f);
  const auto sw_before = read_back(sw.data(), rows * dim), ss_before = read_back(sparse.base().state(), rows * dim * 2);
  host_gradient bad = hg;
  bad.values[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(sparse.step(view, nullptr, to_backend<B>(bad, dim, false), 0.01f), xs::non_finite_error);
  bad = hg;
  bad.rows[0] = rows;
  CHECK_THROWS_AS(sparse.step(view, nullptr, to_backend<B>(bad, dim, false), 0.01f), xs::out_of_range);
  CHECK_THROWS_AS(sparse.step(view, nullptr, to_backend<B>(hg, dim, false), -0.01f), xs::invalid_argument);
  CHECK_THROWS_AS(sparse.step(xs::matrix_view<float>(sw.data(), rows, dim - 1), nullptr, to_backend<B>(hg, dim, false), 0.01f),
                  xs::shape_error);
  CHECK(read_back(sw.data(), rows * dim) == sw_before);
  CHECK(read_back(sparse.base().state(), rows * dim * 2) == ss_before);
  CHECK(sparse.steps() == 1);

  CHECK_THROWS_AS(xs::lars_rule(0.9f, 0.f, -0.001f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::lars_rule(1.f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::lamb_rule(0.9f, 0.999f, -1e-6f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::lamb_rule(0.9f, 0.999f, 1e-6f, -0.1f), xs::invalid_argument);
  CHECK_THROWS_AS(xs::lamb<B>({4, 0}), xs::invalid_argument);
  CHECK_THROWS_AS(xs::lamb<B>(std::vector<index_t>{}), xs::invalid_argument);
  CHECK(xs::lamb<B>::state_bytes({10, 6}) == 16u * 2u * 4u);
  CHECK(xs::sparse_lars<B>::state_bytes(10, 4, false) == 10u * 4u * 4u + 10u * 8u);
}
