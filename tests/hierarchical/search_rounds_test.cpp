// SPDX-License-Identifier: Apache-2.0
// The host backends' search runner (detail/hierarchical/search_rounds.hpp: a tile's rows in lockstep
// rounds, each round's expansions node by node) against its oracle, the generic one-row search
// (`topk_search_step`, 16 rows a task): the same classes, log-probabilities (bitwise), expansions
// and overflow flags, for exact searches (k = 1, 5, 40) and beams, with an open list roomy enough
// and one so small that some rows overflow; on a Huffman tree of arity 4 (mixed depths, blocks of
// 2-4) and a uniform tree of 30-child blocks (rows share nodes: groups of 4 rows and the rest), with
// and without bias, starting at the root and at given blocks (a forest's per-row start).

#include "hierarchical/reference_search.hpp"
#include "hierarchical/search_step_runs.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/detail/hierarchical/search_rounds.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

/// The generic search (16 rows a task), or the rounds.
template <class B, class View>
search_out run_search(bool rounds, const search_in<View>& in, index_t k, index_t beam, index_t capacity) {
  return run_search_step<B>(in, k, beam, capacity, [&](const auto& step_of, const xd::execution<B>& ex) {
    if (!rounds) return generic_search{}(step_of, ex);
    xd::host_search_rounds<B>::run(ex, step_of(std::integral_constant<index_t, 1>{}));
    return true;
  });
}

template <class B, class Tree>
void check_tree(const Tree& tree, index_t max_block, const std::string& what, bool forest_starts) {
  const index_t d = 13, rows = 70, wrows = tree.num_rows();
  test_rng rng(53);
  search_in<decltype(tree.view())> in{tree.view(), {}, {}, {}, rows, d, wrows, max_block};
  in.w = random_floats(rng, wrows * d, 1.0);
  in.b = random_floats(rng, wrows, 1.0);
  in.h = random_floats(rng, rows * d, 1.0);
  // Per-row starts: the root's block, or (forest_starts) the block of one of the root's internal
  // children, as a forest's rows start at their tree's root block.
  std::vector<index_t> sb(static_cast<size_t>(rows)), ss(static_cast<size_t>(rows));
  std::vector<xsoftmax::child_ref> inner;
  for (index_t j = 0; j < tree.root_block_size(); ++j)
    if (!tree.view().child(j).is_leaf) inner.push_back(tree.view().child(j));
  REQUIRE(!inner.empty());
  for (index_t i = 0; i < rows; ++i) {
    const xsoftmax::child_ref c = inner[static_cast<size_t>(i) % inner.size()];
    sb[static_cast<size_t>(i)] = c.block_begin;
    ss[static_cast<size_t>(i)] = c.block_size;
  }
  for (const bool with_bias : {false, true})
    for (const index_t beam : {index_t(0), index_t(3)})
      for (const index_t k : {index_t(1), index_t(5), index_t(40)})
        for (const index_t capacity : {index_t(4) * (k + 1) * max_block + 64, max_block + 3}) {
          in.with_bias = with_bias;
          in.start_begin = forest_starts ? &sb : nullptr;
          in.start_size = forest_starts ? &ss : nullptr;
          const search_out gen = run_search<B>(false, in, k, beam, capacity);
          const search_out rnd = run_search<B>(true, in, k, beam, capacity);
          INFO(what, ", bias ", with_bias, ", beam ", beam, ", k = ", k, ", capacity ", capacity);
          CHECK(rnd.overflow == gen.overflow);
          CHECK(rnd.expansions == gen.expansions);
          CHECK(rnd.classes == gen.classes);
          for (size_t e = 0; e < gen.log_probs.size(); ++e) CHECK(bits(rnd.log_probs[e]) == bits(gen.log_probs[e]));
          if (capacity == max_block + 3 && beam == 0 && k == 40) {
            index_t overflowed = 0;
            for (int f : gen.overflow) overflowed += f;
            CHECK(overflowed > 0);  // the small open list is reached
          }
        }
}

TEST_CASE_TEMPLATE("hs search rounds: equal to the generic one-row search, outputs, expansions and overflows", B,
                   xsoftmax::serial, xsoftmax::omp) {
  const index_t n = 500;
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  const auto huffman = xsoftmax::runtime_tree<>::huffman(freq, 4);
  check_tree<B>(huffman, 4, "Huffman arity 4", false);
  check_tree<B>(huffman, 4, "Huffman arity 4, per-row starts", true);
  const xsoftmax::uniform_tree<2, 30> uniform(900);
  check_tree<B>(uniform, 30, "uniform 2 x 30", false);
}

}  // namespace
