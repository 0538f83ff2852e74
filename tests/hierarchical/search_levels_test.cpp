// SPDX-License-Identifier: Apache-2.0
// The host backends' exact search level by level above a cut (detail/hierarchical/search_levels.hpp)
// against its oracle, the generic best-first search (`topk_search_step`, with an open list roomy
// enough): the same classes and log-probabilities, bitwise, for k = 1, 5, 40 and more than the
// tree's classes; on a Huffman tree of arity 4 (mixed depths), uniform trees of 2 and 3 levels, with
// and without bias, from the root and from per-row start blocks, and with zero weights (every
// child's log-probability equal: the order among ties is the best-first search's, smaller row
// first). Its expansions are at least the best-first search's and at most its dive's plus every
// node at or above the dive's cut (the dive and the count written plainly, with the same
// arithmetic). It uses no open list (a capacity too small for the best-first search changes
// nothing), declines a beam search (through `tree_search_tuning` the rounds then run, bitwise the
// generic search's), and searches rows whose levels outgrow its memory budget in smaller parts, a
// lone row by the rounds.

#include "hierarchical/reference_search.hpp"
#include "hierarchical/search_step_runs.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/detail/hierarchical/search_levels.hpp>
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

/// runner 0: the generic search (16 rows a task); 1: host_level_search alone; 2: tree_search_tuning.
template <class B, class View>
search_out run_search(int runner, const search_in<View>& in, index_t k, index_t beam, index_t capacity,
                      std::size_t level_budget = xd::search_level_budget_bytes) {
  return run_search_step<B>(in, k, beam, capacity, [&](const auto& step_of, const xd::execution<B>& ex) {
    const std::integral_constant<index_t, 1> one{};
    if (runner == 0) return generic_search{}(step_of, ex);
    if (runner == 1) return xd::host_level_search<B>::run(ex, step_of(one), level_budget);
    xd::tree_search_tuning<B>::run(ex, step_of(one));
    return true;
  });
}

/// Row i's internal nodes (the start included) whose key is at or above `cut`, walked depth first
/// with the best-first search's arithmetic (parent's value + child's log-probability).
template <class View>
index_t nodes_at_or_above(const search_in<View>& in, index_t i, std::uint64_t cut) {
  const xsoftmax::matrix_view<const float> wv(in.w.data(), in.wrows, in.d);
  const float* bias = in.with_bias ? in.b.data() : nullptr;
  const float* h = in.h.data() + i * in.d;
  index_t count = 0;
  std::vector<float> lp(static_cast<size_t>(in.max_block));
  struct open_node {
    index_t begin, size;
    float base;
  };
  std::vector<open_node> stack{{in.start_begin ? (*in.start_begin)[static_cast<size_t>(i)] : 0,
                                in.start_size ? (*in.start_size)[static_cast<size_t>(i)] : in.tv.root_block_size(), 0.f}};
  while (!stack.empty()) {
    const open_node n = stack.back();
    stack.pop_back();
    ++count;
    xd::child_log_probs<false>(h, wv, bias, n.begin, n.size, lp.data());
    for (index_t j = 0; j < n.size; ++j) {
      const std::uint64_t key = xd::open_heap::pack(n.base + lp[static_cast<size_t>(j)], n.begin + j);
      const xsoftmax::child_ref c = in.tv.child(n.begin + j);
      if (!c.is_leaf && key >= cut) stack.push_back({c.block_begin, c.block_size, xd::open_heap::lp_of(key)});
    }
  }
  return count;
}

/// The level search's dive written plainly (no cut while it dives): from row i's start, the best
/// child node level by level; the k-th best leaf met is the cut (0 with fewer than k). `dived`:
/// the nodes it expanded. The library's dive stops where the best child is below the risen cut,
/// which changes neither the k best leaves nor the cut (nothing below that child reaches it).
template <class View>
std::uint64_t plain_dive_cut(const search_in<View>& in, index_t i, index_t k, index_t& dived) {
  const xsoftmax::matrix_view<const float> wv(in.w.data(), in.wrows, in.d);
  const float* bias = in.with_bias ? in.b.data() : nullptr;
  const float* h = in.h.data() + i * in.d;
  struct open_node {
    std::uint64_t key;
    index_t begin, size;
  };
  std::vector<open_node> open;
  open.push_back({xd::open_heap::pack(0.f, 0), in.start_begin ? (*in.start_begin)[static_cast<size_t>(i)] : 0,
                  in.start_size ? (*in.start_size)[static_cast<size_t>(i)] : in.tv.root_block_size()});
  std::vector<std::uint64_t> leaves;
  std::vector<float> lp(static_cast<size_t>(in.max_block));
  dived = 0;
  while (!open.empty()) {
    std::vector<open_node> next;
    for (const open_node& n : open) {
      ++dived;
      xd::child_log_probs<false>(h, wv, bias, n.begin, n.size, lp.data());
      for (index_t j = 0; j < n.size; ++j) {
        const std::uint64_t key = xd::open_heap::pack(xd::open_heap::lp_of(n.key) + lp[static_cast<size_t>(j)], n.begin + j);
        const xsoftmax::child_ref c = in.tv.child(n.begin + j);
        if (c.is_leaf) leaves.push_back(key);
        else next.push_back({key, c.block_begin, c.block_size});
      }
    }
    std::sort(next.begin(), next.end(), [](const open_node& a, const open_node& b) { return a.key > b.key; });
    open.clear();
    if (!next.empty()) open.push_back(next.front());
  }
  if (static_cast<index_t>(leaves.size()) < k) return 0;
  std::sort(leaves.begin(), leaves.end(), std::greater<>());
  return leaves[static_cast<size_t>(k - 1)];
}

void check_same_results(const search_out& got, const search_out& want) {
  CHECK(got.classes == want.classes);
  for (size_t e = 0; e < want.log_probs.size(); ++e) {
    INFO("entry ", e);
    CHECK(bits(got.log_probs[e]) == bits(want.log_probs[e]));
  }
}

template <class B, class View>
void check_search(const search_in<View>& in, const std::string& what, index_t classes) {
  for (const index_t k : {index_t(1), index_t(5), index_t(40), classes + 3}) {
    INFO(what, ", bias ", in.with_bias, ", k = ", k);
    const index_t roomy = 4 * (k + 1) * in.max_block + 1024;
    const search_out gen = run_search<B>(0, in, k, 0, roomy);
    for (int f : gen.overflow) REQUIRE(f == 0);
    const search_out lvl = run_search<B>(1, in, k, 0, roomy);
    REQUIRE(lvl.taken);
    check_same_results(lvl, gen);
    for (int f : lvl.overflow) CHECK(f == 0);
    // Expansions: at least the best-first search's; at most the dive's and every node at or above
    // the dive's cut.
    for (index_t i = 0; i < in.rows; ++i) {
      INFO("row ", i);
      const size_t r = static_cast<size_t>(i);
      CHECK(lvl.expansions[r] >= gen.expansions[r]);
      index_t dived = 0;
      const std::uint64_t cut = plain_dive_cut(in, i, k, dived);
      CHECK(lvl.expansions[r] <= dived + nodes_at_or_above(in, i, cut));
    }
    // An open list too small for the best-first search: the level search uses none, so it runs
    // all the same, with the roomy search's results.
    const index_t small = in.max_block + 1;
    const search_out lvl_small = run_search<B>(1, in, k, 0, small);
    CHECK(lvl_small.taken);
    for (int f : lvl_small.overflow) CHECK(f == 0);
    check_same_results(lvl_small, gen);
  }
  // A beam search is declined, and through the tuning equals the generic beam.
  CHECK_FALSE(run_search<B>(1, in, 5, 3, 64 + in.max_block).taken);
  const search_out tb = run_search<B>(2, in, 5, 3, 64 + in.max_block), gb = run_search<B>(0, in, 5, 3, 64 + in.max_block);
  check_same_results(tb, gb);
  CHECK(tb.expansions == gb.expansions);
}

template <class B, class Tree>
void check_tree(const Tree& tree, index_t max_block, index_t classes, const std::string& what) {
  test_rng rng(71);
  search_in<decltype(tree.view())> in{tree.view(), {}, {}, {}, 45, 13, tree.num_rows(), max_block};
  in.w = random_floats(rng, in.wrows * in.d, 1.0);
  in.b = random_floats(rng, in.wrows, 1.0);
  in.h = random_floats(rng, in.rows * in.d, 1.0);
  for (const bool with_bias : {false, true}) {
    in.with_bias = with_bias;
    check_search<B>(in, what, classes);
  }
  // Per-row starts: the block of one of the root's internal children (a forest's rows).
  std::vector<index_t> sb(static_cast<size_t>(in.rows)), ss(sb.size());
  std::vector<xsoftmax::child_ref> inner;
  for (index_t j = 0; j < tree.root_block_size(); ++j)
    if (!tree.view().child(j).is_leaf) inner.push_back(tree.view().child(j));
  REQUIRE(!inner.empty());
  for (size_t i = 0; i < sb.size(); ++i) {
    sb[i] = inner[i % inner.size()].block_begin;
    ss[i] = inner[i % inner.size()].block_size;
  }
  in.start_begin = &sb;
  in.start_size = &ss;
  check_search<B>(in, what + ", per-row starts", classes);
  in.start_begin = in.start_size = nullptr;
  // Zero weights, no bias: within a node every child's log-probability is the same, so keys differ
  // by row alone and the order among equal log-probabilities decides.
  in.with_bias = false;
  std::fill(in.w.begin(), in.w.end(), 0.f);
  check_search<B>(in, what + ", zero weights", classes);
}

TEST_CASE_TEMPLATE("hs level search: equal to the generic best-first search, bitwise; its expansions bounded", B,
                   xsoftmax::serial, xsoftmax::omp) {
  const index_t n = 400;
  std::vector<double> freq(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) freq[static_cast<size_t>(c)] = 1.0 / double(c + 1);
  check_tree<B>(xsoftmax::runtime_tree<>::huffman(freq, 4), 4, n, "Huffman arity 4");
  check_tree<B>(xsoftmax::uniform_tree<2, 30>(n), 30, n, "uniform 2 x 30");
  check_tree<B>(xsoftmax::uniform_tree<3, 8>(n), 8, n, "uniform 3 x 8");
}

TEST_CASE_TEMPLATE("hs level search: rows whose levels outgrow the budget are searched in parts, a lone row by the "
                   "rounds", B, xsoftmax::serial, xsoftmax::omp) {
  // Uniform 2 x 30 over 900 classes, zero weights: every root child is at the beam's cut, so the
  // second level holds 30 open nodes a row (720 bytes). Budgets of 45 rows' worth (one part), of
  // 10 rows' (parts of 6), and of less than one row's (every row alone, by the rounds).
  const xsoftmax::uniform_tree<2, 30> tree(900);
  search_in<decltype(tree.view())> in{tree.view(), {}, {}, {}, 45, 5, tree.num_rows(), 30};
  in.w.assign(static_cast<size_t>(in.wrows * in.d), 0.f);
  in.h.assign(static_cast<size_t>(in.rows * in.d), 1.f);
  const index_t k = 3, roomy = 4 * (k + 1) * 30 + 1024;
  const search_out gen = run_search<B>(0, in, k, 0, roomy);
  for (int f : gen.overflow) REQUIRE(f == 0);
  const std::size_t row_bytes = 30 * sizeof(xd::level_open_node);
  for (const std::size_t budget : {45 * row_bytes, 10 * row_bytes, row_bytes - 1}) {
    INFO("budget ", budget);
    const search_out lvl = run_search<B>(1, in, k, 0, roomy, budget);
    CHECK(lvl.taken);
    for (int f : lvl.overflow) CHECK(f == 0);
    check_same_results(lvl, gen);
    for (size_t i = 0; i < gen.expansions.size(); ++i) CHECK(lvl.expansions[i] >= gen.expansions[i]);
  }
}

}  // namespace
