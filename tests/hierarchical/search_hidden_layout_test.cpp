// SPDX-License-Identifier: Apache-2.0
// The hierarchical softmax's top-k and log_distribution take contiguous fp32 hidden rows in place
// and pack every other layout first (hierarchical_softmax_search.inl). Both routes must give the
// same bits: checked with the same rows contiguous and padded (stride d + 5, the padding NaN, so a
// padded view read as contiguous would show), for an exact search (top-1, top-5, top-40: the open
// lists' pruning at several k) and a beam search, on a sigmoid Huffman head (binary) and a
// softmax-node head (blocks of 4), with a batch that is not a multiple of the search's 16-row
// groups.

#include "support/head_checks.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

template <class B, class Form>
void check_layouts(index_t arity) {
  const index_t n = 700, d = 37, batch = 37;
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  const auto tree = xsoftmax::runtime_tree<>::huffman(freq, arity);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, Form>;
  const index_t rows = head_t::weight_rows(tree);
  test_rng rng(17);
  problem p = make_problem(rng, rows, n, d, batch, true);
  auto head = head_t(tree, mview(p.w, rows, d), p.b.data());
  const auto dense = make_hidden<float>(p.h, batch, d);
  const auto padded = make_hidden<float>(p.h, batch, d, 5);
  REQUIRE(padded.view().stride == d + 5);

  for (const index_t k : {1, 5, 40})
    for (const index_t beam : {0, 8}) {
      test_vector<index_t> c1(static_cast<size_t>(batch * k)), c2(static_cast<size_t>(batch * k));
      test_vector<float> l1(static_cast<size_t>(batch * k)), l2(static_cast<size_t>(batch * k));
      xsoftmax::search_options o;
      o.beam_width = beam;
      head.topk(dense.view(), k, mview(c1, batch, k), mview(l1, batch, k), o);
      head.topk(padded.view(), k, mview(c2, batch, k), mview(l2, batch, k), o);
      for (index_t i = 0; i < batch * k; ++i) {
        INFO("k = ", k, ", beam = ", beam, ", entry ", i);
        CHECK(c1[static_cast<size_t>(i)] == c2[static_cast<size_t>(i)]);
        CHECK(bits(l1[static_cast<size_t>(i)]) == bits(l2[static_cast<size_t>(i)]));
        if (beam == 0 && k <= 5) CHECK(c1[static_cast<size_t>(i)] >= 0);  // an exact search fills every slot
      }
    }

  test_vector<float> d1(static_cast<size_t>(batch * 300)), d2(static_cast<size_t>(batch * 300));
  head.log_distribution(dense.view(), 100, 400, mview(d1, batch, 300));
  head.log_distribution(padded.view(), 100, 400, mview(d2, batch, 300));
  for (index_t i = 0; i < batch * 300; ++i) {
    INFO("log_distribution entry ", i);
    CHECK(bits(d1[static_cast<size_t>(i)]) == bits(d2[static_cast<size_t>(i)]));
  }
}

TEST_CASE_TEMPLATE("hs search: contiguous fp32 rows (used in place) and padded rows (packed) give the same bits", B,
                   XSOFTMAX_TEST_BACKENDS) {
  SUBCASE("sigmoid nodes, binary Huffman") { check_layouts<B, xsoftmax::sigmoid_nodes>(2); }
  SUBCASE("softmax nodes, 4-ary Huffman") { check_layouts<B, xsoftmax::softmax_nodes>(4); }
}

}  // namespace
