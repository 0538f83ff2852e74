// SPDX-License-Identifier: Apache-2.0
// Gradient filtering (`loss_options::gradient_filter`, Cut Cross-Entropy's `filter_eps` per entry)
// on the full softmax: the gradients against a float64 reference that drops every entry of
// dloss/dz with |dloss/dz| < f |u| (z the capped logit, u the row's upstream gradient) -- the plain
// loss and one with label smoothing, z-loss and soft-capping; every reduction, a bias, ignored
// rows, chunks and row blocks with and without kept scores; a bf16 head (on cuda: the tuned path,
// which leaves columns with no kept entry out of its GEMMs) within bf16's tolerance; the loss
// unchanged; f = 0 bitwise the exact step; bad values and heads without it rejected. The cut is
// placed in the widest gap between the reference's values, so no entry is near it. Host backends,
// and cuda in the GPU test binary (tests/cuda/CMakeLists.txt).

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
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

/// The float64 gradients of one step with a cut f (0: exact), and every |dloss/dz| / |u| met.
struct filtered_reference {
  test_vector<double> grad_hidden, grad_w, grad_b;
  std::vector<double> magnitudes;
};

/// Each row's upstream gradient: mean 1 / (rows not ignored), sum 1, none grad_output[r].
std::vector<double> upstream_of(const test_vector<index_t>& targets, reduction red, const test_vector<float>& up) {
  const auto kept = std::count_if(targets.begin(), targets.end(), [](index_t t) { return t >= 0; });
  std::vector<double> u(targets.size(), 0.0);
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] < 0) continue;
    u[r] = red == reduction::mean ? 1.0 / static_cast<double>(kept) : red == reduction::sum ? 1.0 : up[r];
  }
  return u;
}

/// The reference step of `p` (weights and hidden rows as `w` and `h`: maybe rounded) with label
/// smoothing eps, z-loss z and cap (0: none), filtered at f.
filtered_reference reference_step(const problem& p, const test_vector<double>& w, const test_vector<double>& h,
                                  const std::vector<double>& u, double eps, double z, double cap, double f) {
  const index_t n = p.num_classes, d = p.dim, rows = p.batch;
  filtered_reference ref;
  ref.grad_hidden.assign(static_cast<std::size_t>(rows * d), 0.0);
  ref.grad_w.assign(static_cast<std::size_t>(n * d), 0.0);
  ref.grad_b.assign(static_cast<std::size_t>(n), 0.0);
  std::vector<double> zc(static_cast<std::size_t>(n));
  for (index_t r = 0; r < rows; ++r) {
    const index_t t = p.targets[static_cast<std::size_t>(r)];
    if (t < 0) continue;
    const double* hr = h.data() + r * d;
    double mx = -INFINITY;
    for (index_t c = 0; c < n; ++c) {
      double s = p.has_bias() ? static_cast<double>(p.b[static_cast<std::size_t>(c)]) : 0.0;
      for (index_t k = 0; k < d; ++k) s += w[static_cast<std::size_t>(c * d + k)] * hr[k];
      zc[static_cast<std::size_t>(c)] = cap > 0 ? cap * std::tanh(s / cap) : s;
      mx = std::max(mx, zc[static_cast<std::size_t>(c)]);
    }
    double sum = 0;
    for (double v : zc) sum += std::exp(v - mx);
    const double lse = mx + std::log(sum), ur = u[static_cast<std::size_t>(r)];
    for (index_t c = 0; c < n; ++c) {
      const double zv = zc[static_cast<std::size_t>(c)];
      double g = std::exp(zv - lse) * (1 + 2 * z * lse) - (c == t ? 1 - eps : 0.0) - eps / static_cast<double>(n);
      ref.magnitudes.push_back(std::fabs(g));
      if (std::fabs(g) < f) g = 0;
      g *= ur;
      if (cap > 0) g *= 1 - (zv / cap) * (zv / cap);
      ref.grad_b[static_cast<std::size_t>(c)] += g;
      for (index_t k = 0; k < d; ++k) {
        ref.grad_hidden[static_cast<std::size_t>(r * d + k)] += g * w[static_cast<std::size_t>(c * d + k)];
        ref.grad_w[static_cast<std::size_t>(c * d + k)] += g * hr[k];
      }
    }
  }
  return ref;
}

/// A cut in the widest relative gap between consecutive values of `v` inside [lo, hi] (its geometric
/// middle), with the gap's ratio: no value is near the cut.
std::pair<double, double> cut_in_widest_gap(std::vector<double> v, double lo, double hi) {
  std::sort(v.begin(), v.end());
  double best = 1, cut = 0;
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    if (v[i] < lo || v[i + 1] > hi || v[i] <= 0) continue;
    if (v[i + 1] / v[i] > best) best = v[i + 1] / v[i], cut = std::sqrt(v[i] * v[i + 1]);
  }
  return {cut, best};
}

/// Every element within atol + rtol |ref| of the reference; names the first that is not.
template <class V>
void check_close(const V& got, const test_vector<double>& ref, double atol, double rtol, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (!(std::fabs(g - ref[i]) <= atol + rtol * std::fabs(ref[i]))) {
      FAIL_CHECK(what, ": element ", i, " is ", g, ", the reference ", ref[i]);
      return;
    }
  }
}

/// The largest |a - b| over two references.
double largest_difference(const test_vector<double>& a, const test_vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

loss_options options_of(reduction red, double eps, double z, double cap, double f) {
  loss_options o;
  o.reduce = red;
  o.label_smoothing = static_cast<float>(eps);
  o.z_loss = static_cast<float>(z);
  o.softcap = static_cast<float>(cap);
  o.gradient_filter = static_cast<float>(f);
  return o;
}

}  // namespace

TEST_CASE_TEMPLATE("full_softmax gradient_filter: the gradients drop every entry below the cut (float64 reference)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(611);
  // 70 rows over 40 classes of 6 (where the host's exponential form would run: filtering turns it
  // off) and 13 rows; peaked scores (weights x 2.5), so that most entries are far below the cut.
  for (index_t batch : {index_t(13), index_t(70)})
  for (bool bias : {false, true}) {
    const index_t n = 40, d = 6;
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    for (float& x : p.w) x *= 2.5f;
    const test_vector<double> wd = to_doubles(p.w), hd = to_doubles(p.h);
    const auto hb = make_hidden<float>(p.h, batch, d, 2);
    const test_vector<float> grad_output = random_grad_output(rng, batch);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    struct terms {
      double eps, z, cap;
    };
    for (terms tm : {terms{0, 0, 0}, terms{0.1, 1e-3, 4.0}})
    for (reduction red : {reduction::mean, reduction::sum, reduction::none}) {
      const test_vector<float> up = red == reduction::none ? grad_output : test_vector<float>{};
      const std::vector<double> u = upstream_of(p.targets, red, up);
      const filtered_reference exact = reference_step(p, wd, hd, u, tm.eps, tm.z, tm.cap, 0.0);
      // A cut where entries are dense (0.01 .. 0.1: above label smoothing's eps / n, so that its
      // uniform term alone is dropped), and one that keeps little but the targets.
      for (auto range : {std::pair{1e-2, 1e-1}, std::pair{0.15, 0.85}}) {
        const auto [f, gap] = cut_in_widest_gap(exact.magnitudes, range.first, range.second);
        const std::string what = std::string(bias ? "bias, " : "no bias, ") + reduction_name(red) + ", " +
                                 std::to_string(batch) + " rows, eps " + std::to_string(tm.eps) + ", cut " +
                                 std::to_string(f);
        INFO(what);
        REQUIRE(gap > 1.001);  // the premise: no entry within 0.1 % of the cut (fp32 is within ~1e-6)
        const filtered_reference ref = reference_step(p, wd, hd, u, tm.eps, tm.z, tm.cap, f);
        // The premise that the test can fail: the filter changes the gradient well beyond the tolerance.
        REQUIRE(largest_difference(ref.grad_w, exact.grad_w) > 10 * grad_atol);
        const loss_options o = options_of(red, tm.eps, tm.z, tm.cap, f);
        const loss_options unfiltered = options_of(red, tm.eps, tm.z, tm.cap, 0.0);
        for (index_t block : {index_t(0), index_t(4)})
        for (bool kept : {false, true}) {
          if (block == 0 && kept) continue;
          head.use_automatic_plan();
          head.set_chunk_size(7);
          if (block > 0) {
            head.set_row_block(block);
            if (kept) head.keep_scores_in_row_blocks(block);
            else head.set_score_cache_bytes(0);
          }
          const std::string layout = block == 0 ? "one block" : kept ? "row blocks, scores kept" : "row blocks";
          const auto got = run_forward_backward(head, hb, p.targets, o, up);
          const auto plain = run_forward_backward(head, hb, p.targets, unfiltered, up);
          CHECK_MESSAGE(bitwise_equal(&got.loss, &plain.loss, 1), layout, ": the loss is the unfiltered one");
          CHECK_MESSAGE(bitwise_equal(got.per_sample, plain.per_sample), layout, ": per-sample losses");
          check_close(got.grad_hidden, ref.grad_hidden, grad_atol, grad_rtol, layout + ", grad_hidden");
          const auto rows = on_host(got.grad.rows);
          const auto values = on_host(got.grad.values);
          REQUIRE(static_cast<index_t>(rows.size()) == n);
          std::vector<double> dense(static_cast<std::size_t>(n * d));
          for (std::size_t i = 0; i < rows.size(); ++i)
            for (index_t k = 0; k < d; ++k)
              dense[static_cast<std::size_t>(rows[i] * d + k)] = values[i * static_cast<std::size_t>(d) + k];
          check_close(dense, ref.grad_w, grad_atol, grad_rtol, layout + ", grad_w");
          if (bias) check_close(on_host(got.grad.bias_values), ref.grad_b, grad_atol, grad_rtol, layout + ", grad_b");
        }
        head.use_automatic_plan();
        head.set_chunk_size(0);
      }
      // f = 0 is the exact step, bit for bit.
      const auto zero = run_forward_backward(head, hb, p.targets, options_of(red, tm.eps, tm.z, tm.cap, 0.0), up);
      loss_options plain_options = options_of(red, tm.eps, tm.z, tm.cap, 0.0);
      const auto plain = run_forward_backward(head, hb, p.targets, plain_options, up);
      CHECK(same_outputs(zero, plain));
    }
  }
}

TEST_CASE_TEMPLATE("full_softmax gradient_filter: a bf16 head (cuda: the GEMMs over the kept columns) within bf16", B,
                   XSOFTMAX_TEST_BACKENDS) {
  // Chunks of 16 columns of 48 with a high cut: most chunks keep at most half their columns, which
  // the cuda backend's tuned path gathers for its GEMMs (elsewhere: zeroed entries).
  test_rng rng(612);
  const index_t n = 48, d = 8, batch = 24;
  problem p = make_problem(rng, n, n, d, batch, false, 0.1);
  for (float& x : p.w) x *= 2.5f;
  const test_vector<float> w_rounded = rounded_through<xsoftmax::bf16::storage_type>(p.w);
  const test_vector<float> h_rounded = rounded_through<xsoftmax::bf16::storage_type>(p.h);
  const test_vector<double> wd = to_doubles(w_rounded), hd = to_doubles(h_rounded);
  auto w16 = convert<xsoftmax::bf16::storage_type>(p.w);
  const auto hb = make_hidden<float>(h_rounded, batch, d);
  xsoftmax::full_softmax<xsoftmax::bf16, B> head(mview(w16, n, d));
  head.set_chunk_size(16);
  const std::vector<double> u = upstream_of(p.targets, reduction::mean, {});
  const filtered_reference exact = reference_step(p, wd, hd, u, 0, 0, 0, 0.0);
  const auto [f, gap] = cut_in_widest_gap(exact.magnitudes, 0.2, 0.8);
  REQUIRE(gap > 1.001);
  const filtered_reference ref = reference_step(p, wd, hd, u, 0, 0, 0, f);
  REQUIRE(largest_difference(ref.grad_w, exact.grad_w) > 0.1 * *std::max_element(ref.grad_w.begin(), ref.grad_w.end()));
  const auto got = run_forward_backward(head, hb, p.targets, options_of(reduction::mean, 0, 0, 0, f));
  // bf16's tolerance (tests/cuda/support.cuh): 3e-2 of the largest magnitude.
  double scale_w = 0, scale_h = 0;
  for (double x : ref.grad_w) scale_w = std::max(scale_w, std::fabs(x));
  for (double x : ref.grad_hidden) scale_h = std::max(scale_h, std::fabs(x));
  check_close(got.grad_hidden, ref.grad_hidden, 3e-2 * scale_h, 0, "bf16 grad_hidden");
  const auto rows = on_host(got.grad.rows);
  const auto values = on_host(got.grad.values);
  std::vector<double> dense(static_cast<std::size_t>(n * d));
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (index_t k = 0; k < d; ++k) dense[static_cast<std::size_t>(rows[i] * d + k)] = values[i * static_cast<std::size_t>(d) + k];
  check_close(dense, ref.grad_w, 3e-2 * scale_w, 0, "bf16 grad_w");
  // Into a dense bf16 gradient: the same within bf16.
  test_vector<xsoftmax::bf16::storage_type> dense16(static_cast<std::size_t>(n * d));
  test_vector<float> gh(static_cast<std::size_t>(batch * d));
  (void)head.forward_backward(hb.view(), cvec(p.targets), mview(gh, batch, d),
                              xsoftmax::dense_gradient<xsoftmax::bf16::storage_type>{mview(dense16, n, d)},
                              options_of(reduction::mean, 0, 0, 0, f));
  std::vector<double> widened(dense16.size());
  for (std::size_t i = 0; i < dense16.size(); ++i) widened[i] = xsoftmax::to_float(dense16[i]);
  check_close(widened, ref.grad_w, 3e-2 * scale_w, 0, "bf16 dense grad_w");
}

TEST_CASE_TEMPLATE("full_softmax gradient_filter: bad values and heads that do not define it are rejected", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(613);
  const index_t n = 16, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, false);
  const auto hb = make_hidden<float>(p.h, batch, d);
  xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, d));
  loss_options o;
  for (float bad : {-0.5f, 1.f, 2.f, INFINITY, std::nanf("")}) {
    o.gradient_filter = bad;
    CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), o),
                         doctest::Contains("options.gradient_filter = "), xsoftmax::invalid_argument);
  }
  o.gradient_filter = -0.5f;
  CHECK_THROWS_WITH_AS((void)full.forward(hb.view(), cvec(p.targets), o),
                       doctest::Contains("options.gradient_filter = -0.5 must be in [0, 1)"), xsoftmax::invalid_argument);
  o.gradient_filter = 0.25f;
  CHECK(std::isfinite(full.forward(hb.view(), cvec(p.targets), o)));
  using tree = xsoftmax::uniform_tree<2, 4>;
  xsoftmax::hierarchical_softmax<tree, xsoftmax::fp32, B> hs(tree(n), d);
  CHECK_THROWS_WITH_AS((void)hs.forward(hb.view(), cvec(p.targets), o),
                       doctest::Contains("hierarchical_softmax does not define it"), xsoftmax::invalid_argument);
}
