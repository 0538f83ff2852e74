// SPDX-License-Identifier: Apache-2.0
// The shared kernels against naive double-precision loops: the blocked host GEMM (every transpose
// combination, odd sizes, alpha / beta, leading dimensions, split rows) and CBLAS when present;
// dense scores and gather-dot (fp32 and bf16 storage, bias); the online log-sum-exp over chunks;
// row top-k over chunks against a sort; sparse accumulation against a naive sum, bitwise equal
// across serial / omp and thread counts.

#include "support/reference.hpp"

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/host/gemm.hpp>
#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/host_gemm.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/sparse_accumulate.hpp>

#include <doctest/doctest.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
namespace host = xsoftmax::detail::host;

/// One GEMM problem with its operands stored with padded leading dimensions.
struct gemm_problem {
  host::gemm_args args;
  std::vector<float> a, b, c0;  ///< c0: C before the call
  std::vector<double> expected;  ///< naive double result, m x n
  std::vector<double> tolerance; ///< per element: k * 2^-22 * sum |alpha a b| + |beta c| * 2^-23
};

gemm_problem make_gemm(test_rng& rng, host::op op_a, host::op op_b, index_t m, index_t n, index_t k, float alpha,
                       float beta) {
  gemm_problem p;
  host::gemm_args& g = p.args;
  g.op_a = op_a;
  g.op_b = op_b;
  g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
  // Stored shapes: A is m x k (or k x m transposed), B is k x n (or n x k); every leading
  // dimension padded by a few elements.
  const index_t a_rows = op_a == host::op::none ? m : k, a_cols = op_a == host::op::none ? k : m;
  const index_t b_rows = op_b == host::op::none ? k : n, b_cols = op_b == host::op::none ? n : k;
  g.lda = a_cols + 3;
  g.ldb = b_cols + 1;
  g.ldc = n + 2;
  p.a = random_floats(rng, std::max<index_t>(a_rows * g.lda, 1), 1.0);
  p.b = random_floats(rng, std::max<index_t>(b_rows * g.ldb, 1), 1.0);
  // beta == 0: C is not read (BLAS semantics), so NaN there must not leak into the result.
  p.c0 = beta == 0.f ? std::vector<float>(static_cast<size_t>(std::max<index_t>(m * g.ldc, 1)),
                                          std::numeric_limits<float>::quiet_NaN())
                     : random_floats(rng, std::max<index_t>(m * g.ldc, 1), 1.0);
  p.expected.assign(static_cast<size_t>(m * n), 0.0);
  p.tolerance.assign(static_cast<size_t>(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double acc = 0, mag = 0;
      for (index_t q = 0; q < k; ++q) {
        const double x = op_a == host::op::none ? p.a[static_cast<size_t>(i * g.lda + q)] : p.a[static_cast<size_t>(q * g.lda + i)];
        const double y = op_b == host::op::none ? p.b[static_cast<size_t>(q * g.ldb + j)] : p.b[static_cast<size_t>(j * g.ldb + q)];
        acc += x * y;
        mag += std::abs(x * y);
      }
      const double c = beta == 0.f ? 0.0 : static_cast<double>(p.c0[static_cast<size_t>(i * g.ldc + j)]);
      p.expected[static_cast<size_t>(i * n + j)] = alpha * acc + beta * c;
      // fp32 summation of k products: error <= k * 2^-24 * sum |x y| (the 4x margin covers the
      // rounding of alpha * x and the final combination with beta * c).
      p.tolerance[static_cast<size_t>(i * n + j)] =
          (k + 2) * std::ldexp(1.0, -22) * std::abs(alpha) * mag + std::ldexp(1.0, -22) * std::abs(beta * c) + 1e-30;
    }
  return p;
}

/// Runs `gemm` on a copy of C and checks the m x n result against the naive one, and that the
/// padding of C is untouched.
template <class Gemm>
std::vector<float> run_and_check_gemm(const gemm_problem& p, Gemm gemm, const std::string& what) {
  std::vector<float> c = p.c0;
  host::gemm_args g = p.args;
  g.a = p.a.data();
  g.b = p.b.data();
  g.c = c.data();
  gemm(g);
  index_t bad = 0;
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j = 0; j < g.n; ++j) {
      const double got = c[static_cast<size_t>(i * g.ldc + j)];
      const double want = p.expected[static_cast<size_t>(i * g.n + j)];
      if (!(std::abs(got - want) <= p.tolerance[static_cast<size_t>(i * g.n + j)])) {
        if (bad++ == 0) MESSAGE(what, ": C[", i, "][", j, "] = ", got, ", expected ", want);
      }
    }
    for (index_t j = g.n; j < g.ldc; ++j)
      if (!bitwise_equal(&c[static_cast<size_t>(i * g.ldc + j)], &p.c0[static_cast<size_t>(i * g.ldc + j)], 1)) ++bad;
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " wrong elements");
  return c;
}

const char* op_name(host::op o) { return o == host::op::none ? "N" : "T"; }

}  // namespace

TEST_CASE("primitives: gemm_blocked equals a naive triple loop (all transposes, odd sizes, alpha, beta)") {
  test_rng rng(501);
  struct shape {
    index_t m, n, k;
  };
  // Odd sizes; k > 256 and n > 512 cross the blocked loop's k- and n-panels; 1 x 1 x 1; k = 0.
  const shape shapes[] = {{7, 13, 5}, {1, 1, 1}, {17, 530, 3}, {5, 9, 300}, {33, 1, 71}, {3, 4, 0}};
  const std::pair<float, float> scalars[] = {{1.f, 0.f}, {0.5f, 1.f}, {-1.25f, -0.75f}, {2.f, 0.f}};
  for (auto op_a : {host::op::none, host::op::transpose})
    for (auto op_b : {host::op::none, host::op::transpose})
      for (const auto& s : shapes)
        for (auto [alpha, beta] : scalars) {
          const auto p = make_gemm(rng, op_a, op_b, s.m, s.n, s.k, alpha, beta);
          const std::string what = std::string("gemm_blocked ") + op_name(op_a) + op_name(op_b) + " m " +
                                   std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
                                   " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta);
          const auto whole = run_and_check_gemm(p, host::gemm_blocked, what);
          // Any split of C's rows gives the same bits (each element sums over k in one order).
          const auto split = run_and_check_gemm(
              p,
              [](const host::gemm_args& g) {
                for (index_t r0 = 0; r0 < g.m; r0 += 3) host::gemm_blocked_rows(g, r0, std::min(g.m, r0 + 3));
              },
              what + " split rows");
          CHECK_MESSAGE(bitwise_equal(whole, split), what, ": split rows differ");
          // host::gemm (CBLAS when present) agrees within the same tolerance.
          run_and_check_gemm(p, host::gemm, what + " via host::gemm");
        }
}

TEST_CASE("primitives: gemm_cblas equals gemm_blocked") {
  if (!host::has_cblas()) {
    // CI installs OpenBLAS and sets XSOFTMAX_REQUIRE_CBLAS=1: there, a build that lost its CBLAS
    // fails here instead of passing without comparing anything.
    const char* required = std::getenv("XSOFTMAX_REQUIRE_CBLAS");
    REQUIRE_MESSAGE(!(required && std::string(required) == "1"),
                    "XSOFTMAX_REQUIRE_CBLAS=1 but this build found no CBLAS (XSOFTMAX_HAS_CBLAS unset)");
    MESSAGE("SKIP: built without CBLAS, nothing to compare");
    return;
  }
#if defined(XSOFTMAX_HAS_CBLAS)
  test_rng rng(502);
  for (auto op_a : {host::op::none, host::op::transpose})
    for (auto op_b : {host::op::none, host::op::transpose})
      for (auto [alpha, beta] : {std::pair<float, float>{1.f, 0.f}, {0.75f, -1.5f}}) {
        const auto p = make_gemm(rng, op_a, op_b, 23, 41, 277, alpha, beta);
        const std::string what = std::string("cblas ") + op_name(op_a) + op_name(op_b);
        const auto blocked = run_and_check_gemm(p, host::gemm_blocked, what + " blocked");
        const auto cblas = run_and_check_gemm(p, host::gemm_cblas, what + " cblas");
        // Both within the naive bound; against each other, twice that bound.
        index_t bad = 0;
        for (index_t i = 0; i < 23; ++i)
          for (index_t j = 0; j < 41; ++j) {
            const size_t at = static_cast<size_t>(i * p.args.ldc + j);
            if (!(std::abs(blocked[at] - cblas[at]) <= 2 * p.tolerance[static_cast<size_t>(i * 41 + j)])) ++bad;
          }
        CHECK(bad == 0);
      }
#endif
}

TEST_CASE("primitives: gemm_parallel gives the same bits on serial and omp policies") {
  test_rng rng(503);
  const auto p = make_gemm(rng, host::op::none, host::op::transpose, 70, 37, 19, 1.f, 1.f);
  const auto a = run_and_check_gemm(
      p, [](const host::gemm_args& g) { xsoftmax::detail::gemm_parallel(thrust::cpp::par, g); }, "serial");
  const auto b = run_and_check_gemm(
      p, [](const host::gemm_args& g) { xsoftmax::detail::gemm_parallel(thrust::omp::par, g); }, "omp");
  CHECK(bitwise_equal(a, b));
  // Empty shapes leave C alone.
  std::vector<float> c(4, 3.f);
  host::gemm_args g;
  g.m = 0, g.n = 2, g.k = 2, g.c = c.data(), g.ldc = 2;
  host::gemm(g);
  xsoftmax::detail::gemm_parallel(thrust::omp::par, g);
  CHECK(c == std::vector<float>(4, 3.f));
}

TEST_CASE("primitives: dense_scores and gather_dot equal naive dot products (fp32 and bf16 storage, bias)") {
  test_rng rng(504);
  const index_t rows = 9, d = 13, wrows = 40, stride = d + 2, first = 11, count = 17;
  const auto h = random_floats(rng, rows * d, 1.0);
  auto w = random_floats(rng, wrows * stride, 1.0);
  const auto bias = random_floats(rng, wrows, 1.0);
  const auto wb = convert<__nv_bfloat16>(w);
  const auto bb = convert<__nv_bfloat16>(bias);
  auto naive = [&](auto weight, auto bias_ptr, index_t i, index_t c) {
    double s = bias_ptr ? as_double(bias_ptr[c]) : 0.0;
    for (index_t p = 0; p < d; ++p) s += static_cast<double>(h[static_cast<size_t>(i * d + p)]) * as_double(weight[static_cast<size_t>(c * stride + p)]);
    return s;
  };
  for (bool with_bias : {false, true}) {
    std::vector<float> scratch;
    // fp32: rows used in place (no copy), at their stride.
    const auto wf = xsoftmax::detail::rows_as_float(thrust::cpp::par, cview(w, wrows, d, stride), first, count, scratch);
    CHECK(wf.data == w.data() + first * stride);
    CHECK(wf.stride == stride);
    // bf16: widened into scratch, dense.
    const auto wbf = xsoftmax::detail::rows_as_float(thrust::cpp::par, cview(wb, wrows, d, stride), first, count, scratch);
    CHECK(wbf.data == scratch.data());
    CHECK(wbf.stride == d);
    for (index_t r = 0; r < count; ++r)
      for (index_t p = 0; p < d; ++p)
        CHECK(wbf(r, p) == xsoftmax::to_float(wb[static_cast<size_t>((first + r) * stride + p)]));

    const index_t lds = count + 3;
    for (int storage = 0; storage < 2; ++storage) {
      std::vector<float> s(static_cast<size_t>(rows * lds), -7.f), scratch2;
      if (storage == 0)
        xsoftmax::detail::dense_scores(thrust::omp::par, cview(h, rows, d), cview(w, wrows, d, stride),
                                       with_bias ? bias.data() : nullptr, first, count, s.data(), lds, scratch2);
      else
        xsoftmax::detail::dense_scores(thrust::cpp::par, cview(h, rows, d), cview(wb, wrows, d, stride),
                                       with_bias ? bb.data() : nullptr, first, count, s.data(), lds, scratch2);
      for (index_t i = 0; i < rows; ++i) {
        for (index_t c = 0; c < count; ++c) {
          const double want = storage == 0 ? naive(w.data(), with_bias ? bias.data() : nullptr, i, first + c)
                                           : naive(wb.data(), with_bias ? bb.data() : nullptr, i, first + c);
          INFO("dense_scores storage ", storage, " bias ", with_bias, " row ", i, " col ", c);
          CHECK(s[static_cast<size_t>(i * lds + c)] == doctest::Approx(want).epsilon(1e-5).scale(1.0));
        }
        for (index_t c = count; c < lds; ++c) CHECK(s[static_cast<size_t>(i * lds + c)] == -7.f);  // padding untouched
        // gather_dot: one row against the same block, read in place.
        std::vector<float> g(static_cast<size_t>(count));
        if (storage == 0)
          xsoftmax::detail::gather_dot(h.data() + i * d, cview(w, wrows, d, stride), with_bias ? bias.data() : nullptr,
                                       first, count, g.data());
        else
          xsoftmax::detail::gather_dot(h.data() + i * d, cview(wb, wrows, d, stride), with_bias ? bb.data() : nullptr,
                                       first, count, g.data());
        for (index_t c = 0; c < count; ++c)
          CHECK(g[static_cast<size_t>(c)] == doctest::Approx(s[static_cast<size_t>(i * lds + c)]).epsilon(1e-5).scale(1.0));
      }
    }
  }
}

TEST_CASE("primitives: online_lse_update over chunks equals a one-shot log-sum-exp") {
  test_rng rng(505);
  const index_t rows = 6, cols = 97, lds = cols + 5;
  for (double offset : {0.0, 80.0, -300.0}) {  // large scores: exp would overflow without the running max
    std::vector<float> s(static_cast<size_t>(rows * lds), std::numeric_limits<float>::quiet_NaN());
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = 0; j < cols; ++j)
        s[static_cast<size_t>(i * lds + j)] = static_cast<float>(offset + rng.uniform(-6, 6) + (i == 2 ? 0.1 * j : 0.0));
    std::vector<index_t> targets = {0, 96, 50, 13, 13, 70};
    for (index_t chunk : {index_t(1), index_t(10), index_t(32), cols}) {
      for (auto policy_omp : {false, true}) {
        if (policy_omp && chunk == 1) continue;  // ~100 parallel regions: slow on a loaded machine
        xsoftmax::detail::online_lse_state st(rows);
        for (index_t c0 = 0; c0 < cols; c0 += chunk) {
          const index_t cn = std::min(chunk, cols - c0);
          if (policy_omp)
            xsoftmax::detail::online_lse_update(thrust::omp::par, s.data() + c0, rows, cn, lds, c0, targets.data(), st);
          else
            xsoftmax::detail::online_lse_update(thrust::cpp::par, s.data() + c0, rows, cn, lds, c0, targets.data(), st);
        }
        for (index_t i = 0; i < rows; ++i) {
          std::vector<double> row(s.begin() + i * lds, s.begin() + i * lds + cols);
          INFO("offset ", offset, " chunk ", chunk, " row ", i);
          CHECK(st.lse(i) == doctest::Approx(logsumexp(row)).epsilon(1e-6));
          CHECK(st.target_logit[static_cast<size_t>(i)] == s[static_cast<size_t>(i * lds + targets[static_cast<size_t>(i)])]);
          CHECK(xsoftmax::detail::row_logsumexp(s.data() + i * lds, cols) == doctest::Approx(logsumexp(row)).epsilon(1e-6));
        }
      }
    }
  }
  // Without targets the target logits stay as they were.
  std::vector<float> s = {1.f, 2.f, 3.f};
  xsoftmax::detail::online_lse_state st(1);
  xsoftmax::detail::online_lse_update(thrust::cpp::par, s.data(), 1, 3, 3, 0, nullptr, st);
  CHECK(st.target_logit[0] == 0.f);
  CHECK(st.lse(0) == doctest::Approx(logsumexp({1.0, 2.0, 3.0})).epsilon(1e-6));
}

TEST_CASE("primitives: row_topk over chunks equals a stable sort by (score desc, index asc)") {
  test_rng rng(506);
  const index_t rows = 5, cols = 83, lds = cols + 1;
  std::vector<float> s(static_cast<size_t>(rows * lds));
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j)
      // Row 3 has many exact ties (scores from a small set); row 4 is constant.
      s[static_cast<size_t>(i * lds + j)] =
          i == 3 ? static_cast<float>(rng.integer(0, 4)) : i == 4 ? 1.f : static_cast<float>(rng.uniform(-5, 5));
  for (index_t k : {index_t(1), index_t(7), cols, cols + 4}) {
    for (index_t chunk : {index_t(1), index_t(9), cols}) {
      for (bool use_omp : {false, true}) {
        if (use_omp && chunk == 1) continue;
        xsoftmax::detail::row_topk_state st(rows, k);
        for (index_t c0 = 0; c0 < cols; c0 += chunk) {
          const index_t cn = std::min(chunk, cols - c0);
          if (use_omp) xsoftmax::detail::row_topk_update(thrust::omp::par, s.data() + c0, rows, cn, lds, c0, st);
          else xsoftmax::detail::row_topk_update(thrust::cpp::par, s.data() + c0, rows, cn, lds, c0, st);
        }
        if (use_omp) xsoftmax::detail::row_topk_finish(thrust::omp::par, rows, st);
        else xsoftmax::detail::row_topk_finish(thrust::cpp::par, rows, st);
        const index_t kept = std::min(k, cols);
        for (index_t i = 0; i < rows; ++i) {
          std::vector<index_t> order(static_cast<size_t>(cols));
          std::iota(order.begin(), order.end(), index_t(0));
          const float* row = s.data() + i * lds;
          std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return row[a] > row[b]; });
          INFO("k ", k, " chunk ", chunk, " row ", i, " omp ", use_omp);
          CHECK(st.size[static_cast<size_t>(i)] == kept);
          bool same = true;
          for (index_t j = 0; j < kept; ++j) {
            same = same && st.index[static_cast<size_t>(i * k + j)] == order[static_cast<size_t>(j)];
            same = same && st.score[static_cast<size_t>(i * k + j)] == row[order[static_cast<size_t>(j)]];
          }
          CHECK(same);
        }
      }
    }
  }
}

TEST_CASE("primitives: sparse_accumulate equals a naive sum, bitwise, on every policy and thread count") {
  test_rng rng(507);
  const index_t n = 500, dim = 7;
  std::vector<index_t> keys(static_cast<size_t>(n));
  for (auto& k : keys) k = rng.integer(0, 60) * 3 - 20;  // duplicates, gaps, negative keys
  const auto values = random_floats(rng, n * dim, 1.0);
  // Naive: unique keys ascending; each key's rows summed in input order, in fp32 (the documented
  // order, so the result must match bit for bit), and in double for the value check.
  std::vector<index_t> want_keys = keys;
  std::sort(want_keys.begin(), want_keys.end());
  want_keys.erase(std::unique(want_keys.begin(), want_keys.end()), want_keys.end());
  std::vector<float> want(want_keys.size() * dim, 0.f);
  std::vector<double> want_d(want.size(), 0.0);
  for (index_t i = 0; i < n; ++i) {
    const size_t u = static_cast<size_t>(std::lower_bound(want_keys.begin(), want_keys.end(), keys[static_cast<size_t>(i)]) - want_keys.begin());
    for (index_t j = 0; j < dim; ++j) {
      want[u * dim + j] += values[static_cast<size_t>(i * dim + j)];
      want_d[u * dim + j] += values[static_cast<size_t>(i * dim + j)];
    }
  }
  std::vector<index_t> ks;
  std::vector<float> vs;
  xsoftmax::detail::sparse_accumulate(thrust::cpp::par, keys, values, dim, ks, vs);
  CHECK(ks == want_keys);
  CHECK(bitwise_equal(vs, want));
  check_close(vs, want_d, 1e-5, 1e-5, "sparse_accumulate vs double sums");
  std::vector<index_t> ko;
  std::vector<float> vo;
  xsoftmax::detail::sparse_accumulate(thrust::omp::par, keys, values, dim, ko, vo);
  CHECK(ko == want_keys);
  CHECK(bitwise_equal(vo, want));
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    xsoftmax::detail::sparse_accumulate(thrust::omp::par, keys, values, dim, ko, vo);  // reused outputs
    CHECK(ko == want_keys);
    CHECK_MESSAGE(bitwise_equal(vo, want), "threads ", threads);
  }
  omp_set_num_threads(saved);
#endif
  // Empty input.
  xsoftmax::detail::sparse_accumulate(thrust::omp::par, std::vector<index_t>{}, std::vector<float>{}, dim, ko, vo);
  CHECK(ko.empty());
  CHECK(vo.empty());
}

TEST_CASE("primitives: parallel_for visits every index exactly once") {
  for (index_t n : {index_t(0), index_t(1), index_t(1000)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    for (auto& h : hits) h = 0;
    std::atomic<int>* ptr = hits.data();
    xsoftmax::detail::parallel_for(thrust::omp::par, n, [=](index_t i) { ptr[i].fetch_add(1); });
    xsoftmax::detail::parallel_for(thrust::cpp::par, n, [=](index_t i) { ptr[i].fetch_add(1); });
    for (auto& h : hits) CHECK(h.load() == 2);
  }
  xsoftmax::detail::parallel_for(thrust::omp::par, -5, [](index_t) { FAIL("called for a negative count"); });
}
