// SPDX-License-Identifier: Apache-2.0
// The AVX2 host tunings of the sigmoid hierarchical softmax's kernels (row_kernels.hpp,
// fast_exp.hpp, node_runs.hpp; bench/RESULTS.md, "Binary Huffman: AVX2 row kernels ..."), bitwise
// against the portable versions they replace at run time: dot_row8 / axpy_row, fast_exp /
// fast_log1p_unit, sigmoid_node_loss and softplus_pair on 8 lanes, the finite scan's block test.
// Bitwise, not within a
// tolerance: the AVX2 code does the same float operations in the same order without FMA, so a
// result must not depend on the CPU it runs on. Skipped (with a message) on a CPU without AVX2 or
// a build without the AVX2 path (not x86-64 GCC/Clang, or a baseline ISA with FMA); the dispatching
// entry points are then the portable code itself.

#include "support/float_bits.hpp"
#include "support/reference.hpp"

#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using xsoftmax::index_t;
using xsoftmax_test::test_rng;
namespace xd = xsoftmax::detail;

using xsoftmax_test::bits;
using xsoftmax_test::same_bits;

// Node scores that reach every branch: signed zeros, denormals, the fast_exp clamps (-87.34 and
// 88.38) and their neighbours, huge values, infinities, NaN, and random values over [-120, 120].
std::vector<float> node_scores() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.f, -0.f, 1e-45f, -1e-45f, 1e-30f, -1e-30f, 1.f, -1.f, 0.5f, -0.5f,
                          87.3365f, -87.3365f, 87.34f, -87.34f, 88.3762f, -88.3762f, 88.38f, -88.38f,
                          100.f, -100.f, 1e30f, -1e30f, inf, -inf, std::nanf("")};
  test_rng rng(5);
  for (int i = 0; i < 4000; ++i) v.push_back(static_cast<float>(rng.uniform(-120.0, 120.0)));
  for (int i = 0; i < 1000; ++i) v.push_back(static_cast<float>(rng.uniform(-1.0, 1.0)));
  while (v.size() % xd::node_lanes != 0) v.push_back(0.25f);
  return v;
}

#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
bool avx2_here() {
  if (!xd::row_simd::has_avx2) MESSAGE("this CPU has no AVX2: the AVX2 kernels are not run");
  return xd::row_simd::has_avx2;
}

__attribute__((target("avx2"))) void exp_log1p8(const float* x, float* e, float* l) {
  _mm256_storeu_ps(e, xd::avx2::fast_exp(_mm256_loadu_ps(x)));
  _mm256_storeu_ps(l, xd::avx2::fast_log1p_unit(_mm256_loadu_ps(x)));
}

TEST_CASE("row kernels avx2: dot_row8 and axpy_row bitwise equal their portable versions") {
  if (!avx2_here()) return;
  test_rng rng(3);
  for (index_t d = 0; d <= 70; ++d)
    for (const index_t extra : {0, 100, 256}) {
      const index_t n = d + extra;
      const auto h = xsoftmax_test::random_floats(rng, n, 1.0), w = xsoftmax_test::random_floats(rng, n, 1.0),
                 y = xsoftmax_test::random_floats(rng, n, 1.0);
      INFO("d = ", n);
      CHECK(bits(xd::dot_row8_avx2(h.data(), w.data(), n)) == bits(xd::dot_row8_portable(h.data(), w.data(), n)));
      CHECK(bits(xd::dot_row8(h.data(), w.data(), n)) == bits(xd::dot_row8_portable(h.data(), w.data(), n)));
      std::vector<float> y1(y.begin(), y.end()), y2(y.begin(), y.end());
      xd::axpy_row_avx2(-0.37f, w.data(), y1.data(), n);
      xd::axpy_row_portable(-0.37f, w.data(), y2.data(), n);
      bool equal = true;
      for (index_t p = 0; p < n; ++p) equal = equal && bits(y1[static_cast<size_t>(p)]) == bits(y2[static_cast<size_t>(p)]);
      CHECK(equal);
    }
}

TEST_CASE("row kernels avx2: fast_exp and fast_log1p_unit on 8 lanes bitwise equal the scalar functions") {
  if (!avx2_here()) return;
  std::vector<float> xs = node_scores();
  test_rng rng(9);
  for (int i = 0; i < 2000; ++i) xs.push_back(static_cast<float>(rng.uniform(0.0, 1.0)));  // log1p's domain
  while (xs.size() % 8 != 0) xs.push_back(0.75f);
  for (size_t i = 0; i < xs.size(); i += 8) {
    float e[8], l[8];
    // fast_exp over every score; fast_log1p_unit over the same values (its domain is [0, 1]: the
    // others are compared too, the two must agree wherever they are evaluated).
    exp_log1p8(xs.data() + i, e, l);
    for (size_t j = 0; j < 8; ++j) {
      INFO("x = ", xs[i + j]);
      CHECK(same_bits(e[j], xd::fast_exp(xs[i + j])));
      CHECK(same_bits(l[j], xd::fast_log1p_unit(xs[i + j])));
    }
  }
}

TEST_CASE("row kernels avx2: sigmoid_node_loss8 and softplus_pair8 bitwise equal the scalar functions") {
  if (!avx2_here()) return;
  const std::vector<float> s = node_scores();
  const index_t lanes = xd::node_lanes;
  int checked = 0;
  for (size_t i = 0; i < s.size(); i += static_cast<size_t>(lanes)) {
    for (const bool alternate : {false, true}) {
      float first[xd::node_lanes], loss[xd::node_lanes], ds[xd::node_lanes], minus[xd::node_lanes],
          plus[xd::node_lanes];
      for (index_t j = 0; j < lanes; ++j) first[j] = (alternate ? (j % 2 == 0) : (j % 3 == 0)) ? 1.f : 0.f;
      xd::avx2::sigmoid_node_loss8(s.data() + i, first, loss, ds);
      xd::avx2::softplus_pair8(s.data() + i, minus, plus);
      for (index_t j = 0; j < lanes; ++j) {
        const float x = s[i + static_cast<size_t>(j)];
        INFO("s = ", x, ", first = ", first[j]);
        float ds_ref = 0.f, minus_ref = 0.f, plus_ref = 0.f;
        const float loss_ref = xd::sigmoid_node_loss(x, first[j] != 0.f, &ds_ref);
        xd::softplus_pair(x, minus_ref, plus_ref);
        CHECK(same_bits(loss[j], loss_ref));
        CHECK(same_bits(ds[j], ds_ref));
        CHECK(same_bits(minus[j], minus_ref));
        CHECK(same_bits(plus[j], plus_ref));
        ++checked;
      }
    }
  }
  CHECK(checked >= 10000);
}
TEST_CASE("row kernels avx2: the finite scan's block test equals its portable version") {
  if (!avx2_here()) return;
  const float inf = std::numeric_limits<float>::infinity(), big = std::numeric_limits<float>::max();
  test_rng rng(11);
  int checked = 0, bad_found = 0;
  for (index_t n = 0; n <= 40; ++n)
    for (const float scale : {1.f, 0.05f, 4.f, 1e30f}) {
      const auto base = xsoftmax_test::random_floats(rng, n, 1.0);
      // Clean, then one value at each position: a NaN, +-inf, or one the scale pushes past the range.
      for (index_t at = -1; at < n; ++at)
        for (const float v : {std::nanf(""), inf, -inf, big, -1e10f}) {
          std::vector<float> x(base.begin(), base.end());
          if (at >= 0) x[static_cast<size_t>(at)] = v;
          const bool want = xd::any_non_finite_scaled_portable(x.data(), n, scale);
          INFO("n = ", n, ", at = ", at, ", value = ", v, ", scale = ", scale);
          CHECK(xd::any_non_finite_scaled_avx2(x.data(), n, scale) == want);
          CHECK(xd::any_non_finite_scaled(x.data(), n, scale) == want);
          ++checked;
          bad_found += want ? 1 : 0;
          if (at < 0) break;  // the clean vector once per (n, scale)
        }
    }
  CHECK(checked > 4000);
  CHECK(bad_found > 3000);  // most cases hold a bad value: both answers are exercised
}

#else
TEST_CASE("row kernels avx2: not built here") { MESSAGE("no AVX2 path in this build (not x86-64 GCC/Clang, or built with FMA)"); }
#endif

// Whether the dispatching group forms take the AVX2 path here: otherwise they are loops over the
// scalar functions, and comparing them with those functions could not fail.
bool dispatches_avx2() {
#if defined(XSOFTMAX_ROW_KERNELS_AVX2)
  return xd::row_simd::has_avx2;
#else
  return false;
#endif
}

TEST_CASE("row kernels: the dispatching group forms equal the scalar functions" *
          doctest::skip(!dispatches_avx2())) {
  // sigmoid_node_loss8 / softplus_pair8 as callers reach them (the AVX2 path on this CPU).
  const std::vector<float> s = node_scores();
  for (size_t i = 0; i < s.size(); i += static_cast<size_t>(xd::node_lanes)) {
    float first[xd::node_lanes], loss[xd::node_lanes], ds[xd::node_lanes], minus[xd::node_lanes],
        plus[xd::node_lanes];
    for (index_t j = 0; j < xd::node_lanes; ++j) first[j] = j % 2 == 0 ? 1.f : 0.f;
    xd::sigmoid_node_loss8(s.data() + i, first, loss, ds);
    xd::softplus_pair8(s.data() + i, minus, plus);
    for (index_t j = 0; j < xd::node_lanes; ++j) {
      const float x = s[i + static_cast<size_t>(j)];
      float ds_ref = 0.f, minus_ref = 0.f, plus_ref = 0.f;
      INFO("s = ", x);
      CHECK(same_bits(loss[j], xd::sigmoid_node_loss(x, first[j] != 0.f, &ds_ref)));
      CHECK(same_bits(ds[j], ds_ref));
      xd::softplus_pair(x, minus_ref, plus_ref);
      CHECK(same_bits(minus[j], minus_ref));
      CHECK(same_bits(plus[j], plus_ref));
    }
  }
}

TEST_CASE("row kernels: the dispatching group forms, skipped here") {
  if (dispatches_avx2()) return;
  WARN_MESSAGE(false, "SKIPPED: no AVX2 dispatch on this CPU or build; the group forms are the scalar loops");
}

}  // namespace
