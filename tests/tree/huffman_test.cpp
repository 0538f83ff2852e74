// SPDX-License-Identifier: Apache-2.0
// runtime_tree::huffman: valid trees (the tree contract), the Kraft sum, monotone depths, optimal
// weighted path length against an exhaustive search that shares no code with the Huffman builder,
// arities 2..8, degenerate inputs and bad counts.

#include "support/tree_contract.hpp"

#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using std::size_t;
using xsoftmax::index_t;
using huffman_tree = xsoftmax::runtime_tree<>;
using xsoftmax_test::check_tree_contract;

/// sum over classes of arity^(height - depth): the Kraft sum scaled by arity^height, exact in
/// integers (the tests keep arity^height below 2^63).
template <class Tree>
std::uint64_t scaled_kraft_sum(const Tree& t, int arity) {
  const auto power = [&](int e) {
    std::uint64_t p = 1;
    for (int i = 0; i < e; ++i) p *= static_cast<std::uint64_t>(arity);
    return p;
  };
  REQUIRE(std::log2(static_cast<double>(arity)) * t.height() < 62.0);
  std::uint64_t sum = 0;
  for (index_t c = 0; c < t.num_classes(); ++c) sum += power(t.height() - t.depth(c));
  return sum;
}

template <class Tree, class Count>
long double weighted_path_length(const Tree& t, const std::vector<Count>& counts) {
  long double sum = 0;
  for (index_t c = 0; c < t.num_classes(); ++c) {
    sum += static_cast<long double>(counts[static_cast<size_t>(c)]) * t.depth(c);
  }
  return sum;
}

/// The optimal weighted path length over all trees whose internal nodes have 2..arity children,
/// by exhaustive search over merge sequences: any such tree is built bottom-up by repeatedly
/// replacing some 2..arity current subtrees by their parent, which adds their total weight once to
/// the cost (every leaf below gets one level deeper). No greedy choice, no padding.
std::int64_t optimal_cost(std::vector<std::int64_t> items, int arity,
                          std::map<std::vector<std::int64_t>, std::int64_t>& memo) {
  if (items.size() <= 1) return 0;
  std::sort(items.begin(), items.end());
  if (const auto it = memo.find(items); it != memo.end()) return it->second;
  const auto m = static_cast<unsigned>(items.size());
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  for (unsigned mask = 1; mask < (1u << m); ++mask) {
    const int picked = __builtin_popcount(mask);
    if (picked < 2 || picked > arity) continue;
    std::vector<std::int64_t> rest;
    std::int64_t merged = 0;
    for (unsigned i = 0; i < m; ++i) {
      if (mask & (1u << i))
        merged += items[i];
      else
        rest.push_back(items[i]);
    }
    rest.push_back(merged);
    best = std::min(best, merged + optimal_cost(rest, arity, memo));
  }
  memo.emplace(items, best);
  return best;
}

template <class Error, class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST_CASE("huffman: optimal weighted path length equals exhaustive search (N <= 7, arity 2..4)") {
  std::mt19937_64 rng(12345);
  for (int arity = 2; arity <= 4; ++arity) {
    std::map<std::vector<std::int64_t>, std::int64_t> memo;
    for (int n = 2; n <= 7; ++n) {
      for (int trial = 0; trial < 12; ++trial) {
        // Small ranges produce many ties and zeros, where tie-breaking bugs would show.
        std::uniform_int_distribution<std::int64_t> count(0, trial < 6 ? 4 : 100);
        std::vector<std::int64_t> counts(static_cast<size_t>(n));
        for (auto& x : counts) x = count(rng);
        CAPTURE(arity);
        CAPTURE(n);
        CAPTURE(trial);
        const auto t = huffman_tree::huffman(counts, arity);
        check_tree_contract(t);
        const auto expected = optimal_cost(counts, arity, memo);
        CHECK(weighted_path_length(t, counts) == static_cast<long double>(expected));
      }
    }
  }
}

TEST_CASE(
    "huffman: Kraft sum is 1 for binary trees, <= 1 for k-ary; frequent classes are shallower") {
  std::mt19937_64 rng(99);
  for (int arity = 2; arity <= 8; ++arity) {
    for (int trial = 0; trial < 10; ++trial) {
      std::uniform_int_distribution<int> size(2, 600);
      const int n = size(rng);
      // Log-uniform counts: a skewed, Zipf-like spread with some equal values.
      std::uniform_real_distribution<double> log_count(0.0, 8.0);
      std::vector<double> counts(static_cast<size_t>(n));
      for (auto& x : counts) x = std::floor(std::exp(log_count(rng)));
      CAPTURE(arity);
      CAPTURE(n);
      const auto t = huffman_tree::huffman(counts, arity);
      CHECK(t.num_classes() == n);
      check_tree_contract(t);
      const std::uint64_t full = [&] {
        std::uint64_t p = 1;
        for (int i = 0; i < t.height(); ++i) p *= static_cast<std::uint64_t>(arity);
        return p;
      }();
      const auto kraft = scaled_kraft_sum(t, arity);
      if (arity == 2) {
        CHECK(kraft == full);
        CHECK(t.is_binary());
      } else {
        CHECK(kraft <= full);
      }
      // Every internal node has `arity` children except at most one (the padded first merge).
      index_t short_nodes = 0;
      const auto& offsets = t.block_offsets();
      for (size_t k = 0; k + 1 < offsets.size(); ++k) {
        const index_t kids = offsets[k + 1] - offsets[k];
        CHECK(kids >= 2);
        CHECK(kids <= arity);
        short_nodes += kids < arity ? 1 : 0;
      }
      CHECK(short_nodes <= 1);
      // counts[a] > counts[b] implies depth(a) <= depth(b).
      std::vector<index_t> by_count(static_cast<size_t>(n));
      std::iota(by_count.begin(), by_count.end(), index_t(0));
      std::sort(by_count.begin(), by_count.end(), [&](index_t a, index_t b) {
        return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
      });
      int deepest_so_far = 0;
      for (size_t i = 0; i < by_count.size();) {
        size_t j = i;  // classes [i, j) share one count
        int shallowest = std::numeric_limits<int>::max(), deepest = 0;
        while (j < by_count.size() && counts[static_cast<size_t>(by_count[j])] ==
                                          counts[static_cast<size_t>(by_count[i])]) {
          shallowest = std::min(shallowest, t.depth(by_count[j]));
          deepest = std::max(deepest, t.depth(by_count[j]));
          ++j;
        }
        CHECK(shallowest >= deepest_so_far);
        deepest_so_far = std::max(deepest_so_far, deepest);
        i = j;
      }
    }
  }
}

TEST_CASE("huffman: one class, equal counts, zero counts") {
  for (int arity = 2; arity <= 5; ++arity) {
    const auto one = huffman_tree::huffman(std::vector<double>{3.0}, arity);
    CHECK(one.num_classes() == 1);
    CHECK(one.num_rows() == 1);
    CHECK(one.root_block_size() == 1);
    CHECK(one.depth(0) == 1);
    CHECK(one.height() == 1);
    CHECK(one.leaf_rank(0) == 0);
    CHECK(one.child(0).is_leaf);
    CHECK(one.child(0).leaf_class == 0);
  }
  // Equal counts: a complete tree.
  const auto eight = huffman_tree::huffman(std::vector<int>(8, 5));
  for (index_t c = 0; c < 8; ++c) CHECK(eight.depth(c) == 3);
  const auto nine = huffman_tree::huffman(std::vector<int>(9, 1), 3);
  for (index_t c = 0; c < 9; ++c) CHECK(nine.depth(c) == 2);
  CHECK(nine.root_block_size() == 3);
  const auto five = huffman_tree::huffman(std::vector<int>(5, 1));
  std::vector<int> depths;
  for (index_t c = 0; c < 5; ++c) depths.push_back(five.depth(c));
  std::sort(depths.begin(), depths.end());
  CHECK(depths == std::vector<int>{2, 2, 2, 3, 3});
  // All zero counts and two classes in a 5-ary tree (3 dummies dropped).
  const auto zeros = huffman_tree::huffman(std::vector<double>(6, 0.0), 4);
  check_tree_contract(zeros);
  // -0.0 is a zero count, not a negative one, and ties with +0.0 by class id.
  const auto signed_zeros = huffman_tree::huffman(std::vector<double>{5.0, -0.0, 0.0, 1.0});
  check_tree_contract(signed_zeros);
  CHECK(signed_zeros.depth(1) == 3);
  CHECK(signed_zeros.depth(2) == 3);
  const auto two = huffman_tree::huffman(std::vector<double>{1.0, 2.0}, 5);
  CHECK(two.root_block_size() == 2);
  CHECK(two.depth(0) == 1);
  CHECK(two.depth(1) == 1);
}

TEST_CASE("huffman: count types and determinism") {
  const std::vector<index_t> i64{7, 1, 1, 3, 0, 12, 5};
  const std::vector<unsigned> u32{7, 1, 1, 3, 0, 12, 5};
  const std::vector<float> f32{7, 1, 1, 3, 0, 12, 5};
  const auto a = huffman_tree::huffman(i64, 3);
  const auto b = huffman_tree::huffman(u32, 3);
  const auto c = huffman_tree::huffman(f32, 3);
  const auto d = huffman_tree::huffman(i64, 3);
  CHECK(a.path_rows() == b.path_rows());
  CHECK(a.path_rows() == c.path_rows());
  xsoftmax_test::check_same_tree_arrays(a, d);
  // Integer counts are summed exactly: 2^62 + 1 vs 2^62 would be equal in double.
  const index_t big = index_t(1) << 61;
  const auto exact = huffman_tree::huffman(std::vector<index_t>{big, big + 1, big, 1});
  check_tree_contract(exact);
}

TEST_CASE("huffman: a large skewed input is valid") {
  std::mt19937_64 rng(5);
  const index_t n = 20000;
  std::vector<double> counts(static_cast<size_t>(n));
  for (index_t i = 0; i < n; ++i)
    counts[static_cast<size_t>(i)] = std::floor(1e7 / static_cast<double>(i + 1));  // Zipf
  std::shuffle(counts.begin(), counts.end(), rng);
  const auto t = huffman_tree::huffman(counts);
  CHECK(t.num_classes() == n);
  CHECK(t.num_rows() == 2 * n - 2);
  CHECK(t.is_binary());
  CHECK(t.height() <= 64);
  check_tree_contract(t.view());
  const auto t8 = huffman_tree::huffman(counts, 8);
  check_tree_contract(t8);
  CHECK(t8.height() < t.height());
}

TEST_CASE("huffman: bad input") {
  using xsoftmax::invalid_argument;
  using xsoftmax::non_finite_error;
  using xsoftmax::tree_error;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS((void)huffman_tree::huffman(std::vector<double>{}), invalid_argument);
  CHECK(thrown_message<invalid_argument>([] {
          (void)huffman_tree::huffman(std::vector<double>{});
        }).find("counts is empty") != std::string::npos);
  CHECK(thrown_message<invalid_argument>([] {
          (void)huffman_tree::huffman(std::vector<double>{1, 2}, 1);
        }).find("arity = 1") != std::string::npos);
  CHECK(thrown_message<invalid_argument>([] {
          (void)huffman_tree::huffman(std::vector<double>{1, -2.5, 3});
        }).find("counts[1] = -2.5") != std::string::npos);
  CHECK(thrown_message<invalid_argument>([] {
          (void)huffman_tree::huffman(std::vector<int>{1, 2, -7});
        }).find("counts[2] = -7") != std::string::npos);
  CHECK(thrown_message<non_finite_error>([&] {
          (void)huffman_tree::huffman(std::vector<double>{1, 2, 3, nan});
        }).find("counts[3] = nan") != std::string::npos);
  CHECK(thrown_message<non_finite_error>([&] {
          (void)huffman_tree::huffman(std::vector<double>{inf, 2});
        }).find("counts[0] = inf") != std::string::npos);
  CHECK_THROWS_AS((void)huffman_tree::huffman(std::vector<double>{1, -inf}), invalid_argument);
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 2 + 1;
  CHECK(thrown_message<invalid_argument>([&] {
          (void)huffman_tree::huffman(std::vector<std::uint64_t>{huge, huge});
        }).find("overflow") != std::string::npos);

  // Counts 1, 2, 4, ..., 2^19 make a binary Huffman tree a chain: classes 0 and 1 at depth 19.
  std::vector<double> doubling(20);
  for (size_t i = 0; i < doubling.size(); ++i) doubling[i] = std::ldexp(1.0, static_cast<int>(i));
  const auto msg =
      thrown_message<tree_error>([&] { (void)xsoftmax::runtime_tree<8>::huffman(doubling); });
  INFO(msg);
  CHECK(msg.find("huffman") != std::string::npos);
  CHECK(msg.find("depth 19") != std::string::npos);
  CHECK(msg.find("MaxDepth = 8") != std::string::npos);
  const auto deep = xsoftmax::runtime_tree<19>::huffman(doubling);
  CHECK(deep.height() == 19);
}

TEST_CASE("huffman: braced list of counts") {
  const auto t = huffman_tree::huffman({4.0, 1.0, 1.0, 2.0});
  CHECK(t.depth(0) == 1);
  CHECK(t.depth(3) == 2);
  CHECK(t.depth(1) == 3);
  CHECK(t.depth(2) == 3);
  const auto k = huffman_tree::huffman({1, 1, 1}, 3);
  CHECK(k.root_block_size() == 3);
}

TEST_CASE("huffman: arity >= N gives the flat softmax") {
  const auto flat = huffman_tree::huffman({3.0, 1.0, 4.0, 1.0, 5.0}, 1000000000);
  CHECK(flat.num_rows() == 5);
  CHECK(flat.root_block_size() == 5);
  CHECK(flat.height() == 1);
  check_tree_contract(flat);
}
