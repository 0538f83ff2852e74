// SPDX-License-Identifier: Apache-2.0
// to_parent_array: a runtime_tree exported as a parent array and rebuilt by from_parents has the
// same arrays (rows, paths, leaf order, blocks) for user trees with classes at mixed depths and
// children in any node order, Huffman trees (binary and ternary), k-means label trees and a
// one-class tree; a forest and an empty tree are refused with typed errors.

#include "support/check_throws.hpp"
#include "support/tree_contract.hpp"

#include <xsoftmax/backend.hpp>
#include <xsoftmax/tree/kmeans_tree.hpp>
#include <xsoftmax/tree/parent_array.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <random>
#include <vector>

using xsoftmax_test::check_throws;

namespace {

using xsoftmax::index_t;
using tree64 = xsoftmax::runtime_tree<>;

void check_round_trip(const tree64& tree) {
  const xsoftmax::tree_parent_array a = xsoftmax::to_parent_array(tree);
  REQUIRE(a.parent.size() == static_cast<std::size_t>(tree.num_rows() + 1));
  CHECK(a.num_classes == tree.num_classes());
  xsoftmax_test::check_same_tree_arrays(tree64::from_parents(a.parent, a.leaf_class, a.num_classes), tree);
}

}  // namespace

TEST_CASE("to_parent_array: from_parents rebuilds the same tree") {
  SUBCASE("a user tree: classes at depths 1 to 3, nodes listed out of order") {
    // nodes 0..4 classes; 5 root; 7 under the root (classes 3, 1 and node 6); 6 holds 0 and 4;
    // class 2 hangs from the root itself.
    const std::vector<index_t> parent = {6, 7, 5, 7, 6, -1, 7, 5};
    check_round_trip(tree64::from_parents(parent, 5));
  }
  SUBCASE("Huffman trees") {
    std::mt19937 rng(7);
    std::vector<double> counts(300);
    for (auto& c : counts) c = static_cast<double>(rng() % 1000);
    check_round_trip(tree64::huffman(counts, 2));
    check_round_trip(tree64::huffman(counts, 3));
  }
  SUBCASE("k-means label trees") {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    const index_t n = 500, d = 8;
    std::vector<float> v(static_cast<std::size_t>(n * d));
    for (auto& x : v) x = normal(rng);
    xsoftmax::kmeans_tree_options o;
    o.branching = 3;
    check_round_trip(xsoftmax::kmeans_label_tree(xsoftmax::matrix_view<const float>(v.data(), n, d), o));
    o.branching = 23;
    o.max_depth = 2;
    check_round_trip(xsoftmax::kmeans_label_tree(xsoftmax::matrix_view<const float>(v.data(), n, d), o));
  }
  SUBCASE("one class") {
    const tree64 one = tree64::from_parents({1, -1}, 1);
    check_round_trip(one);
    const xsoftmax::tree_parent_array a = xsoftmax::to_parent_array(one);
    CHECK(a.parent == std::vector<index_t>{-1, 0});
    CHECK(a.leaf_class == std::vector<index_t>{-1, 0});
  }
}

TEST_CASE("to_parent_array: node r + 1 is the node below row r") {
  const tree64 t = tree64::huffman(std::vector<double>{5, 1, 1, 3}, 2);
  const xsoftmax::tree_parent_array a = xsoftmax::to_parent_array(t);
  for (index_t r = 0; r < t.num_rows(); ++r) {
    const xsoftmax::child_ref c = t.child(r);
    INFO("row ", r);
    CHECK(a.leaf_class[r + 1] == (c.is_leaf ? c.leaf_class : -1));
  }
  CHECK(a.parent[0] == -1);
}

TEST_CASE("to_parent_array: a forest and an empty tree are refused") {
  const tree64 a = tree64::from_parents({2, 2, -1}, 2), b = tree64::from_parents({1, -1}, 1);
  const tree64 forest = tree64::forest({&a, &b});
  check_throws<xsoftmax::tree_error>([&] { (void)xsoftmax::to_parent_array(forest); },
                                     {"to_parent_array", "forest of 2 trees"});
  check_throws<xsoftmax::invalid_argument>([] { (void)xsoftmax::to_parent_array(tree64{}); },
                                           {"to_parent_array", "empty"});
  CHECK_NOTHROW((void)xsoftmax::to_parent_array(tree64::forest({&a})));
}
