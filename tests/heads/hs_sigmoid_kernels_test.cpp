// SPDX-License-Identifier: Apache-2.0
// The kernels behind the sigmoid hierarchical softmax's per-(sample, node) work and its search
// (bench/RESULTS.md, stop 18): dot_row8 / axpy_row against float64 and, bitwise, against their
// scalar form (the host SIMD path must give the same bits); sigmoid_node_loss and softplus_pair
// against float64 and against softplus / sigmoid; the search's packed open-list keys against the
// (log-probability, row) order they encode; and the exact top-k of a sigmoid Huffman head at
// word2vec width against its own log_distribution (bitwise: both sum the same child terms in path
// order).

#include "support/head_checks.hpp"

#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

TEST_CASE("hs sigmoid kernels: dot_row8 and axpy_row against float64 and their scalar form") {
  test_rng rng(11);
  for (index_t d : {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 100, 103, 257}) {
    std::vector<float> h(static_cast<size_t>(d)), w(static_cast<size_t>(d)), y(static_cast<size_t>(d));
    for (index_t p = 0; p < d; ++p) {
      h[static_cast<size_t>(p)] = static_cast<float>(rng.uniform(-1.0, 1.0));
      w[static_cast<size_t>(p)] = static_cast<float>(rng.uniform(-1.0, 1.0));
      y[static_cast<size_t>(p)] = static_cast<float>(rng.uniform(-1.0, 1.0));
    }
    // The same values stored as double take the scalar path (to_float(double) is exact here).
    const std::vector<double> wd(w.begin(), w.end());
    double ref = 0, mag = 0;
    for (index_t p = 0; p < d; ++p) {
      ref += double(h[static_cast<size_t>(p)]) * w[static_cast<size_t>(p)];
      mag += std::abs(double(h[static_cast<size_t>(p)]) * w[static_cast<size_t>(p)]);
    }
    INFO("d = ", d);
    const float fast = xd::dot_row8(h.data(), w.data(), d);
    CHECK(std::abs(fast - ref) <= 1e-6 * (1 + mag));
    CHECK(fast == xd::dot_row8(h.data(), wd.data(), d));  // bitwise: SIMD == scalar

    const float g = 0.37f;
    std::vector<float> y1(y), y2(y);
    xd::axpy_row(g, w.data(), y1.data(), d);
    xd::axpy_row(g, wd.data(), y2.data(), d);
    for (index_t p = 0; p < d; ++p) {
      const size_t i = static_cast<size_t>(p);
      CHECK(y1[i] == y2[i]);
      CHECK(y1[i] == y[i] + g * w[i]);
    }
  }
}

TEST_CASE("hs sigmoid kernels: sigmoid_node_loss and softplus_pair") {
  for (double sd = -120; sd <= 120; sd += 0.173) {
    const float s = static_cast<float>(sd);
    const double sx = s;
    for (const bool first : {false, true}) {
      INFO("s = ", s, ", first = ", first);
      float ds = 0.f;
      const float loss = xd::sigmoid_node_loss(s, first, &ds);
      const double x = first ? -sx : sx;
      const double ref_loss = x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
      const double ref_ds = 1 / (1 + std::exp(-sx)) - (first ? 1 : 0);
      CHECK(std::abs(loss - ref_loss) <= 1e-6 * (1 + ref_loss));
      CHECK(std::abs(ds - ref_ds) <= 3e-7);
      CHECK(loss == xd::softplus(first ? -s : s));  // bitwise the term the other paths use
      CHECK(xd::sigmoid_node_loss(s, first, nullptr) == loss);
      if (s > 0.f) CHECK(ds + (first ? 1.f : 0.f) == xd::sigmoid(s));
    }
    float minus = 0.f, plus = 0.f;
    xd::softplus_pair(s, minus, plus);
    CHECK(minus == xd::softplus(-s));
    CHECK(plus == xd::softplus(s));
  }
}

TEST_CASE("hs search: packed open-list keys order as (larger log-probability, smaller row)") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> lps = {0.f, -0.f, -1e-30f, -1e-3f, -0.5f, -0.5f, -1.f, -3.25f, -87.f, -1e30f, -inf, 2.f};
  const std::vector<index_t> rows = {0, 1, 2, 7, 100, 4096, 199999, index_t(0xFFFFFFFE)};
  using heap = xd::open_heap;
  for (float la : lps)
    for (index_t ra : rows) {
      const std::uint64_t ka = heap::pack(la, ra);
      CHECK(heap::row_of(ka) == ra);
      CHECK(heap::lp_of(ka) == la);  // -0 comes back as +0, equal as a float
      for (float lb : lps)
        for (index_t rb : rows) {
          const bool better = la > lb || (la == lb && ra < rb);
          CHECK((ka > heap::pack(lb, rb)) == better);
        }
    }
  // The heap itself: popping gives the entries in that order.
  test_rng rng(5);
  std::vector<std::uint64_t> storage(64);
  heap hp{storage.data(), 0, 64};
  std::vector<std::pair<float, index_t>> in;
  for (int i = 0; i < 60; ++i) {
    const float l = -static_cast<float>(rng.integer(0, 9)) * 0.25f;  // many ties
    const index_t r = rng.integer(0, 1000);
    in.push_back({l, r});
    REQUIRE(hp.push(l, r));
  }
  std::sort(in.begin(), in.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (const auto& e : in) {
    hp.pop_to_back();
    CHECK(heap::lp_of(storage[static_cast<size_t>(hp.size)]) == e.first);
    CHECK(heap::row_of(storage[static_cast<size_t>(hp.size)]) == e.second);
  }
}

TEST_CASE_TEMPLATE("hs sigmoid: exact top-k at word2vec width equals the head's own distribution", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 3000, d = 103, batch = 16;
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  const auto tree = xsoftmax::runtime_tree<>::huffman(freq, 2);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes>;
  const index_t rows = head_t::weight_rows(tree);
  test_rng rng(3);
  problem p = make_problem(rng, rows, n, d, batch, true);
  auto head = head_t(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> dist(static_cast<size_t>(batch * n));
  head.log_distribution(hb.view(), 0, n, mview(dist, batch, n));
  for (index_t k : {1, 5}) {
    test_vector<index_t> cls(static_cast<size_t>(batch * k));
    test_vector<float> lps(static_cast<size_t>(batch * k));
    head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k));
    for (index_t i = 0; i < batch; ++i) {
      const float* row = dist.data() + i * n;
      std::vector<index_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), index_t(0));
      std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return row[a] > row[b]; });
      for (index_t j = 0; j < k; ++j) {
        INFO("k = ", k, ", row ", i, ", rank ", j);
        const index_t c = cls[static_cast<size_t>(i * k + j)];
        REQUIRE(c >= 0);
        REQUIRE(c < n);
        CHECK(lps[static_cast<size_t>(i * k + j)] == row[c]);                     // bitwise
        CHECK(row[c] == row[order[static_cast<size_t>(j)]]);                      // a k best
      }
    }
  }
}

}  // namespace
