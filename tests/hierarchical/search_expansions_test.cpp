// SPDX-License-Identifier: Apache-2.0
// `search_options::expansions`: the hierarchical softmax's top-k reports, per row, how many nodes
// its search expanded (scored the children of). Checked against the plain reference search
// (reference_search.hpp), which counts its own expansions:
//  * softmax nodes, exact search: the same count as the reference on a device (the library's
//    pruning skips only entries that would never be popped), at least the reference's on the host
//    backends (their level-by-level search expands a superset), at k = 1, 5, 40 and every class, on
//    Huffman trees of arity 3 and 4 and a uniform tree, with a batch that is no multiple of the
//    16-row groups;
//  * sigmoid nodes: a beam wider than the tree is the one-level search (the reference's count);
//    the exact search's two-levels-per-pop form scores every node the one-level search expands
//    and at most two children early per pop (so at most three times as many);
//  * beam 1 on top-1 is greedy descent: one expansion per internal node on the returned leaf's path;
//  * beam searches of widths 1-50 equal a plain beam search (sort and truncate after every
//    expansion) entry for entry, with the same expansions;
//  * counting changes no result (bitwise), and a wrong length is a typed error.

#include "hierarchical/reference_search.hpp"
#include "support/head_checks.hpp"
#include "support/check_throws.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;

/// Class frequencies 1 / (c + 1): the Huffman trees' counts.
std::vector<double> harmonic_frequencies(index_t n) {
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  return freq;
}

/// The head's top-k of `hb` with and without counting; checks the results agree bit for bit and
/// returns the per-row counts.
template <class Head, class H>
test_vector<index_t> counted_topk(const Head& head, const H& hb, index_t k, index_t beam) {
  const index_t batch = hb.rows;
  test_vector<index_t> c1(static_cast<size_t>(batch * k)), c2(c1.size()), counts(static_cast<size_t>(batch), -7);
  test_vector<float> l1(c1.size()), l2(c1.size());
  xsoftmax::search_options plain;
  plain.beam_width = beam;
  xsoftmax::search_options counted = plain;
  counted.expansions = mvec(counts);
  head.topk(hb.view(), k, mview(c1, batch, k), mview(l1, batch, k), plain);
  head.topk(hb.view(), k, mview(c2, batch, k), mview(l2, batch, k), counted);
  for (size_t i = 0; i < c1.size(); ++i) {
    INFO("entry ", i);
    CHECK(c1[i] == c2[i]);
    CHECK(bits(l1[i]) == bits(l2[i]));
  }
  return counts;
}

/// The reference search's expansions of row i.
template <bool Sigmoid, class View>
index_t reference_expansions(const View& tv, const problem& p, index_t wrows, index_t i, index_t k) {
  std::vector<index_t> cls(static_cast<size_t>(k));
  std::vector<float> lps(static_cast<size_t>(k));
  index_t expansions = -1;
  plain_search<Sigmoid>(tv, p.h.data() + i * p.dim, xsoftmax::matrix_view<const float>(p.w.data(), wrows, p.dim),
                        p.b.data(), k, cls.data(), lps.data(), nullptr, &expansions);
  return expansions;
}

template <class B, class Tree>
void check_softmax_nodes(const Tree& tree, index_t n, const std::string& what) {
  using head_t = xsoftmax::hierarchical_softmax<Tree, xsoftmax::fp32, B>;
  const index_t d = 11, batch = 37, rows = head_t::weight_rows(tree);
  test_rng rng(23);
  problem p = make_problem(rng, rows, n, d, batch, true);
  const head_t head(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  for (const index_t k : {index_t(1), index_t(5), index_t(40), n}) {
    const test_vector<index_t> counts = counted_topk(head, hb, k, 0);
    for (index_t i = 0; i < batch; ++i) {
      INFO(what, ", k = ", k, ", row ", i);
      const index_t ref = reference_expansions<false>(tree.view(), p, rows, i, k);
      // The host backends run an exact search level by level (search_levels.hpp): a beam first,
      // then every node at or above a cut, a superset of the reference's (search_levels_test.cpp
      // bounds it from above); the device's runner is the best-first search itself.
      if constexpr (xsoftmax::is_host_backend<B>)
        CHECK(counts[static_cast<size_t>(i)] >= ref);
      else
        CHECK(counts[static_cast<size_t>(i)] == ref);
    }
  }
}

TEST_CASE_TEMPLATE("hs search: softmax nodes, each row's expansions equal the reference search's", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 300;
  const std::vector<double> freq = harmonic_frequencies(n);
  check_softmax_nodes<B>(xsoftmax::runtime_tree<>::huffman(freq, 3), n, "Huffman arity 3");
  check_softmax_nodes<B>(xsoftmax::runtime_tree<>::huffman(freq, 4), n, "Huffman arity 4");
  check_softmax_nodes<B>(xsoftmax::uniform_tree<3, 7>(n), n, "uniform 3 x 7");
}

TEST_CASE_TEMPLATE("hs search: sigmoid nodes, the one-level count exactly, the two-level search's within its bounds",
                   B, XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 300, d = 9, batch = 37;
  const std::vector<double> freq = harmonic_frequencies(n);
  const auto tree = xsoftmax::runtime_tree<>::huffman(freq, 2);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes>;
  const index_t wrows = head_t::weight_rows(tree);
  test_rng rng(29);
  problem p = make_problem(rng, wrows, n, d, batch, true);
  const head_t head(tree, mview(p.w, wrows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  index_t early = 0;
  for (const index_t k : {index_t(1), index_t(5), index_t(40), n}) {
    const test_vector<index_t> one_level = counted_topk(head, hb, k, tree.num_rows() + 1);
    const test_vector<index_t> pairs = counted_topk(head, hb, k, 0);
    for (index_t i = 0; i < batch; ++i) {
      INFO("k = ", k, ", row ", i);
      const index_t ref = reference_expansions<true>(tree.view(), p, wrows, i, k);
      const index_t two = pairs[static_cast<size_t>(i)];
      CHECK(one_level[static_cast<size_t>(i)] == ref);
      CHECK(two >= ref);
      CHECK(two <= 3 * ref);
      early += two - ref;
    }
  }
  CHECK(early > 0);  // the test reaches children scored early
}

TEST_CASE_TEMPLATE("hs search: beam 1 on top-1 expands the returned leaf's path once per node", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 150, d = 8, batch = 21;
  test_rng rng(31);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, n), 3);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B>;
  const index_t rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, n, d, batch, true);
  const head_t head(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  const test_vector<index_t> counts = counted_topk(head, hb, 1, 1);
  test_vector<index_t> cls(static_cast<size_t>(batch));
  test_vector<float> lps(static_cast<size_t>(batch));
  xsoftmax::search_options beam1;
  beam1.beam_width = 1;
  head.topk(hb.view(), 1, mview(cls, batch, 1), mview(lps, batch, 1), beam1);
  // Each class's depth: the internal nodes on its path, found by walking down from the root.
  std::vector<index_t> depth(static_cast<size_t>(n), -1);
  const auto walk = [&](auto&& self, index_t begin, index_t size, index_t level) -> void {
    for (index_t j = 0; j < size; ++j) {
      const xsoftmax::child_ref c = tree.child(begin + j);
      if (c.is_leaf) depth[static_cast<size_t>(c.leaf_class)] = level;
      else self(self, c.block_begin, c.block_size, level + 1);
    }
  };
  walk(walk, 0, tree.root_block_size(), 1);
  index_t deeper = 0;
  for (index_t i = 0; i < batch; ++i) {
    INFO("row ", i, ", class ", cls[static_cast<size_t>(i)]);
    REQUIRE(cls[static_cast<size_t>(i)] >= 0);
    CHECK(counts[static_cast<size_t>(i)] == depth[static_cast<size_t>(cls[static_cast<size_t>(i)])]);
    deeper += depth[static_cast<size_t>(cls[static_cast<size_t>(i)])] > 1 ? 1 : 0;
  }
  CHECK(deeper > 0);
}

/// Beam searches of every width against the plain beam search (full sort and truncate after each
/// expansion): the same classes and log-probabilities (bit for bit on the host backends, to a few
/// ulps on the device), and the same expansions; on
/// softmax nodes (Huffman arity 3, blocks up to 3; a uniform tree of 40-child blocks, where a
/// beam's selection sees far more entries than it keeps) and on sigmoid nodes.
template <class B, class Form, class Tree>
void check_beams(const Tree& tree, index_t n, index_t d, const std::string& what) {
  constexpr bool sigmoid = std::is_same_v<Form, xsoftmax::sigmoid_nodes>;
  using head_t = xsoftmax::hierarchical_softmax<Tree, xsoftmax::fp32, B, Form>;
  const index_t batch = 37, wrows = head_t::weight_rows(tree);
  test_rng rng(41);
  problem p = make_problem(rng, wrows, n, d, batch, true);
  const head_t head(tree, mview(p.w, wrows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  for (const index_t beam : {index_t(1), index_t(2), index_t(3), index_t(8), index_t(50)})
    for (const index_t k : {index_t(1), index_t(5), index_t(20)}) {
      test_vector<index_t> cls(static_cast<size_t>(batch * k)), counts(static_cast<size_t>(batch));
      test_vector<float> lps(cls.size());
      xsoftmax::search_options so;
      so.beam_width = beam;
      so.expansions = mvec(counts);
      head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k), so);
      std::vector<index_t> rc(static_cast<size_t>(k));
      std::vector<float> rl(static_cast<size_t>(k));
      for (index_t i = 0; i < batch; ++i) {
        index_t ref_expansions = -1;
        plain_beam_search<sigmoid>(tree.view(), p.h.data() + i * d, xsoftmax::matrix_view<const float>(p.w.data(), wrows, d),
                                   p.b.data(), k, beam, rc.data(), rl.data(), &ref_expansions);
        INFO(what, ", beam ", beam, ", k = ", k, ", row ", i);
        CHECK(counts[static_cast<size_t>(i)] == ref_expansions);
        for (index_t j = 0; j < k; ++j) {
          CHECK(cls[static_cast<size_t>(i * k + j)] == rc[static_cast<size_t>(j)]);
          const float got = lps[static_cast<size_t>(i * k + j)], want = rl[static_cast<size_t>(j)];
          // The host backends run the reference's arithmetic; nvcc contracts the device's
          // multiply-adds into FMAs, so there a log-probability may differ from the host's in its
          // last bits (the H200 of stop 50: 1-2 ulps on the arity-3 Huffman tree, the classes and
          // expansions identical). The cuda runner's own oracle, the generic device search, is
          // compared bit for bit in tests/cuda/hs_tuned_cuda_test.cu.
          if constexpr (xsoftmax::is_host_backend<B>)
            CHECK(bits(got) == bits(want));
          else
            CHECK(std::abs(got - want) <= 1e-6f * (1.f + std::abs(want)));
        }
      }
    }
}

TEST_CASE_TEMPLATE("hs search: beam searches equal the plain beam search, entry for entry", B, XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 300;
  const std::vector<double> freq = harmonic_frequencies(n);
  check_beams<B, xsoftmax::softmax_nodes>(xsoftmax::runtime_tree<>::huffman(freq, 3), n, 7, "Huffman arity 3");
  check_beams<B, xsoftmax::softmax_nodes>(xsoftmax::uniform_tree<2, 40>(1600), 1600, 13, "uniform 2 x 40");
  check_beams<B, xsoftmax::sigmoid_nodes>(xsoftmax::runtime_tree<>::huffman(freq, 2), n, 9, "sigmoid Huffman");
}

TEST_CASE_TEMPLATE("hs search: an expansions vector of the wrong length is a shape_error", B, XSOFTMAX_TEST_BACKENDS) {
  const auto tree = xsoftmax::uniform_tree<2, 4>(16);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<2, 4>, xsoftmax::fp32, B>;
  const index_t d = 4, batch = 3, rows = head_t::weight_rows(tree);
  test_rng rng(37);
  problem p = make_problem(rng, rows, 16, d, batch, false);
  const head_t head(tree, mview(p.w, rows, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> cls(static_cast<size_t>(batch)), counts(static_cast<size_t>(batch + 1));
  test_vector<float> lps(static_cast<size_t>(batch));
  xsoftmax::search_options so;
  so.expansions = mvec(counts);
  check_throws<xsoftmax::shape_error>([&] { head.topk(hb.view(), 1, mview(cls, batch, 1), mview(lps, batch, 1), so); },
                                      "search_options::expansions has 4 entries, expected 3");
}

}  // namespace
