// SPDX-License-Identifier: Apache-2.0
// The exact top-k search (tree_search.hpp) runs many rows in lockstep over packed-key heaps with
// pruning; it promises the result of the plain one-row best-first search, entry for entry and bit
// for bit, with the tie rule "larger log-probability, then smaller weight row". Checked here
// against that plain search (a std::priority_queue, no pruning) built on the same node
// log-probabilities (`child_log_probs`, bitwise the search's), on weights that make ties common:
// all zero (every sibling ties, and every node of a depth with every other), saturated (scores in
// the hundreds: a likely child's log-probability rounds to -0, so a child ties its parent) and
// ordinary random ones. A heap or pruning change that reorders tied entries fails here.

#include "hierarchical/reference_search.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;

enum class weights { zero, saturated, random };

template <class B, class Form>
void check_ties(index_t arity, weights kind) {
  constexpr bool sigmoid = std::is_same_v<Form, xsoftmax::sigmoid_nodes>;
  const index_t n = 300, d = 16, batch = 37;  // 37: not a multiple of the search's 16-row groups
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  const auto tree = xsoftmax::runtime_tree<>::huffman(freq, arity);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, Form>;
  const index_t rows = head_t::weight_rows(tree);
  test_rng rng(23);
  problem p = make_problem(rng, rows, n, d, batch, true);
  for (size_t i = 0; i < p.w.size(); ++i) p.w[i] = kind == weights::zero ? 0.f : kind == weights::saturated ? 60.f * p.w[i] : p.w[i];
  for (size_t i = 0; i < p.b.size(); ++i) p.b[i] = kind == weights::zero ? 0.f : p.b[i];
  auto head = head_t(tree, mview(p.w, rows, d), p.b.data());
  const auto hidden = make_hidden<float>(p.h, batch, d);
  const xsoftmax::matrix_view<const float> w(p.w.data(), rows, d);
  const std::vector<float> h(p.h.begin(), p.h.end());

  // The test must see what it is about: equal log-probabilities side by side in the results (zero
  // weights), whole paths of probability 1 in float (saturated: log-probability 0).
  index_t ties = 0, certain = 0;
  for (const index_t k : {index_t(1), index_t(5), index_t(40), n}) {
    test_vector<index_t> cls(static_cast<size_t>(batch * k));
    test_vector<float> lps(static_cast<size_t>(batch * k));
    head.topk(hidden.view(), k, mview(cls, batch, k), mview(lps, batch, k));
    std::vector<index_t> rc(static_cast<size_t>(k));
    std::vector<float> rl(static_cast<size_t>(k));
    for (index_t i = 0; i < batch; ++i) {
      plain_search<sigmoid>(tree.view(), h.data() + i * d, w, p.b.data(), k, rc.data(), rl.data());
      for (index_t j = 0; j < k; ++j) {
        INFO("k = ", k, ", row ", i, ", rank ", j);
        const size_t o = static_cast<size_t>(i * k + j);
        CHECK(cls[o] == rc[static_cast<size_t>(j)]);
        CHECK(bits(lps[o]) == bits(rl[static_cast<size_t>(j)]));
        if (j > 0 && rl[static_cast<size_t>(j)] == rl[static_cast<size_t>(j - 1)]) ++ties;
        if (rl[static_cast<size_t>(j)] == 0.f) ++certain;
      }
    }
  }
  if (kind == weights::zero) CHECK(ties > 0);
  if (kind == weights::saturated) CHECK(certain > 0);
}

TEST_CASE_TEMPLATE("hs search: exact top-k is the plain best-first search, ties included", B, XSOFTMAX_TEST_BACKENDS) {
  for (const weights kind : {weights::zero, weights::saturated, weights::random}) {
    INFO("weights ", static_cast<int>(kind));
    check_ties<B, xsoftmax::sigmoid_nodes>(2, kind);
    check_ties<B, xsoftmax::softmax_nodes>(3, kind);
  }
}

}  // namespace
