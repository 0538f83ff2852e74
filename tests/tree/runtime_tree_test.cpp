// SPDX-License-Identifier: Apache-2.0
// runtime_tree built from parent arrays: the tree contract of tree_types.hpp on random trees,
// the exact layout (BFS blocks, DFS leaf order) against an independent construction, and every
// malformed input rejected with a typed exception naming the offending value.

#include "support/check_throws.hpp"

#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using xsoftmax_test::check_throws;

namespace {

using std::size_t;
using xsoftmax::index_t;
using tree64 = xsoftmax::runtime_tree<>;

/// A parent-array tree with a class on every leaf.
struct parent_tree {
  std::vector<index_t> parent;
  std::vector<index_t> leaf_class;
  index_t num_classes = 0;
};

/// Random tree: height exactly `height` (first node of every level is internal), branching in
/// [1, max_branching] (mostly >= 2), other nodes internal with probability 0.6 until `node_budget`
/// runs out. Node ids are shuffled so parents do not precede children, and classes are a random
/// permutation over the leaves.
parent_tree random_parent_tree(std::mt19937_64& rng, int height, int max_branching,
                               index_t node_budget) {
  std::vector<index_t> parent{-1};
  std::vector<int> level{0};
  std::uniform_int_distribution<int> branching(2, max_branching);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<char> internal{1};
  for (size_t head = 0; head < parent.size(); ++head) {
    const int l = level[head];
    const bool first_of_level = head == 0 || level[head - 1] != l;
    const bool make_internal =
        l < height && (head == 0 || first_of_level ||
                       (static_cast<index_t>(parent.size()) < node_budget && unit(rng) < 0.6));
    internal[head] = make_internal ? 1 : 0;
    if (!make_internal) continue;
    const int kids = unit(rng) < 0.05 ? 1 : branching(rng);
    for (int k = 0; k < kids; ++k) {
      parent.push_back(static_cast<index_t>(head));
      level.push_back(l + 1);
      internal.push_back(0);
    }
  }
  const auto m = static_cast<index_t>(parent.size());
  std::vector<index_t> perm(static_cast<size_t>(m));
  std::iota(perm.begin(), perm.end(), index_t(0));
  std::shuffle(perm.begin(), perm.end(), rng);
  parent_tree t;
  t.parent.assign(static_cast<size_t>(m), -1);
  t.leaf_class.assign(static_cast<size_t>(m), -1);
  std::vector<index_t> leaves;
  for (index_t i = 0; i < m; ++i) {
    const index_t p = parent[static_cast<size_t>(i)];
    t.parent[static_cast<size_t>(perm[static_cast<size_t>(i)])] =
        p < 0 ? -1 : perm[static_cast<size_t>(p)];
    if (!internal[static_cast<size_t>(i)]) leaves.push_back(perm[static_cast<size_t>(i)]);
  }
  std::shuffle(leaves.begin(), leaves.end(), rng);
  t.num_classes = static_cast<index_t>(leaves.size());
  for (index_t c = 0; c < t.num_classes; ++c)
    t.leaf_class[static_cast<size_t>(leaves[static_cast<size_t>(c)])] = c;
  return t;
}

/// Relabels a tree so that node i is class i for i < N and internal nodes come after, for the
/// `from_parents(parent, num_classes)` overload.
std::vector<index_t> class_numbered_parents(const parent_tree& t) {
  const auto m = static_cast<index_t>(t.parent.size());
  std::vector<index_t> new_id(static_cast<size_t>(m));
  index_t next_internal = t.num_classes;
  for (index_t v = 0; v < m; ++v) {
    const index_t c = t.leaf_class[static_cast<size_t>(v)];
    new_id[static_cast<size_t>(v)] = c >= 0 ? c : next_internal++;
  }
  std::vector<index_t> parent(static_cast<size_t>(m));
  for (index_t v = 0; v < m; ++v) {
    const index_t p = t.parent[static_cast<size_t>(v)];
    parent[static_cast<size_t>(new_id[static_cast<size_t>(v)])] =
        p < 0 ? -1 : new_id[static_cast<size_t>(p)];
  }
  return parent;
}

/// The contract of tree_types.hpp, checked through its methods only (works for any tree view).
template <class Tree>
void check_tree_contract(const Tree& t) {
  const index_t n = t.num_classes();
  const index_t rows = t.num_rows();
  REQUIRE(n >= 1);
  REQUIRE(t.root_block_size() >= 1);

  // Walk the blocks breadth-first from the root through child(): each row belongs to exactly one
  // block, the blocks tile [0, rows) in BFS order, and every class is reached exactly once.
  std::vector<int> row_owners(static_cast<size_t>(rows), 0);
  std::vector<int> class_seen(static_cast<size_t>(n), 0);
  std::vector<std::pair<index_t, index_t>> blocks{{0, t.root_block_size()}};
  index_t expected_begin = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [begin, size] = blocks[b];
    CHECK(begin == expected_begin);  // blocks stacked in BFS order without gaps
    CHECK(size >= 1);
    expected_begin = begin + size;
    for (index_t r = begin; r < begin + size; ++r) {
      REQUIRE(r >= 0);
      REQUIRE(r < rows);
      ++row_owners[static_cast<size_t>(r)];
      const auto ch = t.child(r);
      if (ch.is_leaf) {
        REQUIRE(ch.leaf_class >= 0);
        REQUIRE(ch.leaf_class < n);
        ++class_seen[static_cast<size_t>(ch.leaf_class)];
      } else {
        blocks.emplace_back(ch.block_begin, ch.block_size);
      }
    }
  }
  CHECK(expected_begin == rows);
  CHECK(std::all_of(row_owners.begin(), row_owners.end(), [](int k) { return k == 1; }));
  CHECK(std::all_of(class_seen.begin(), class_seen.end(), [](int k) { return k == 1; }));

  // Paths: start at the root block, each step's chosen row leads to the next step's block, and
  // the last row is the class's leaf.
  for (index_t c = 0; c < n; ++c) {
    const int d = t.depth(c);
    REQUIRE(d >= 1);
    REQUIRE(d <= Tree::max_depth);
    const auto first = t.step(c, 0);
    CHECK(first.block_begin == 0);
    CHECK(first.block_size == t.root_block_size());
    for (int l = 0; l < d; ++l) {
      const auto s = t.step(c, l);
      REQUIRE(s.child >= 0);
      REQUIRE(s.child < s.block_size);
      const auto ch = t.child(s.block_begin + s.child);
      if (l + 1 < d) {
        REQUIRE_FALSE(ch.is_leaf);
        const auto next = t.step(c, l + 1);
        CHECK(next.block_begin == ch.block_begin);
        CHECK(next.block_size == ch.block_size);
      } else {
        REQUIRE(ch.is_leaf);
        CHECK(ch.leaf_class == c);
      }
    }
  }

  // leaf_rank is a permutation, and the classes below every internal node (identified by its
  // block) have contiguous ranks.
  std::vector<index_t> rank_of(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) rank_of[static_cast<size_t>(c)] = t.leaf_rank(c);
  std::vector<index_t> sorted = rank_of;
  std::sort(sorted.begin(), sorted.end());
  for (index_t i = 0; i < n; ++i) REQUIRE(sorted[static_cast<size_t>(i)] == i);
  struct range {
    index_t lo = -1, hi = -1, count = 0;
  };
  std::vector<range> by_block(static_cast<size_t>(rows) + 1);
  for (index_t c = 0; c < n; ++c) {
    for (int l = 0; l < t.depth(c); ++l) {
      auto& r = by_block[static_cast<size_t>(t.step(c, l).block_begin)];
      const index_t k = rank_of[static_cast<size_t>(c)];
      r.lo = r.count == 0 ? k : std::min(r.lo, k);
      r.hi = r.count == 0 ? k : std::max(r.hi, k);
      ++r.count;
    }
  }
  for (const auto& r : by_block) {
    if (r.count > 0) CHECK(r.hi - r.lo + 1 == r.count);
  }
}

/// Checks the exact layout against an independent construction from the parent array: children
/// ordered by node index, blocks in BFS order, leaf ranks from a recursive DFS.
template <class Tree>
void check_layout_matches(const Tree& t, const parent_tree& p) {
  const auto m = static_cast<index_t>(p.parent.size());
  std::vector<std::vector<index_t>> kids(static_cast<size_t>(m));
  index_t root = -1;
  for (index_t v = 0; v < m; ++v) {
    const index_t q = p.parent[static_cast<size_t>(v)];
    if (q < 0)
      root = v;
    else
      kids[static_cast<size_t>(q)].push_back(v);  // ascending v: children by node index
  }
  std::vector<index_t> order{root};
  for (size_t h = 0; h < order.size(); ++h) {
    for (index_t u : kids[static_cast<size_t>(order[h])]) order.push_back(u);
  }
  REQUIRE(static_cast<index_t>(order.size()) == m);
  std::vector<index_t> row(static_cast<size_t>(m));
  for (size_t i = 0; i < order.size(); ++i)
    row[static_cast<size_t>(order[i])] = static_cast<index_t>(i) - 1;

  CHECK(t.num_rows() == m - 1);
  CHECK(t.root_block_size() == static_cast<index_t>(kids[static_cast<size_t>(root)].size()));
  index_t internal = 0;
  bool binary = true;
  for (index_t v = 0; v < m; ++v) {
    const auto& k = kids[static_cast<size_t>(v)];
    if (k.empty()) continue;
    ++internal;
    binary = binary && k.size() == 2;
    for (size_t j = 0; j < k.size(); ++j)
      CHECK(row[static_cast<size_t>(k[j])] ==
            row[static_cast<size_t>(k[0])] + static_cast<index_t>(j));
    if (v == root) continue;
    const auto ch = t.child(row[static_cast<size_t>(v)]);
    CHECK_FALSE(ch.is_leaf);
    CHECK(ch.block_begin == row[static_cast<size_t>(k[0])]);
    CHECK(ch.block_size == static_cast<index_t>(k.size()));
  }
  CHECK(t.num_internal_nodes() == internal);
  if constexpr (std::is_same_v<Tree, tree64>) CHECK(t.is_binary() == binary);  // tree only

  int height = 0;
  for (index_t v = 0; v < m; ++v) {
    const index_t c = p.leaf_class[static_cast<size_t>(v)];
    if (c < 0) continue;
    const auto ch = t.child(row[static_cast<size_t>(v)]);
    CHECK(ch.is_leaf);
    CHECK(ch.leaf_class == c);
    std::vector<index_t> up;  // v, parent(v), ..., root
    for (index_t x = v; x >= 0; x = p.parent[static_cast<size_t>(x)]) up.push_back(x);
    const int d = static_cast<int>(up.size()) - 1;
    height = std::max(height, d);
    REQUIRE(t.depth(c) == d);
    for (int l = 0; l < d; ++l) {
      const index_t node = up[static_cast<size_t>(d - l)];
      const index_t next = up[static_cast<size_t>(d - l - 1)];
      const auto& k = kids[static_cast<size_t>(node)];
      const auto s = t.step(c, l);
      CHECK(s.block_begin == row[static_cast<size_t>(k[0])]);
      CHECK(s.block_size == static_cast<index_t>(k.size()));
      CHECK(s.child == static_cast<index_t>(std::find(k.begin(), k.end(), next) - k.begin()));
      CHECK(t.path_row(c, l) == row[static_cast<size_t>(next)]);
    }
  }
  CHECK(t.height() == height);

  index_t next_rank = 0;
  std::function<void(index_t)> dfs = [&](index_t v) {
    const index_t c = p.leaf_class[static_cast<size_t>(v)];
    if (c >= 0) CHECK(t.leaf_rank(c) == next_rank++);
    for (index_t u : kids[static_cast<size_t>(v)]) dfs(u);
  };
  dfs(root);
}


}  // namespace

TEST_CASE("runtime_tree: view is trivially copyable and carries max_depth") {
  static_assert(std::is_trivially_copyable_v<tree64::view_type>);
  static_assert(std::is_trivially_copyable_v<xsoftmax::runtime_tree_view<7>>);
  static_assert(tree64::max_depth == 64);
  static_assert(xsoftmax::runtime_tree<7>::max_depth == 7);
  static_assert(xsoftmax::runtime_tree<7>::view_type::max_depth == 7);
  const tree64 empty;
  CHECK(empty.num_classes() == 0);
  CHECK(empty.num_rows() == 0);
  CHECK(empty.num_internal_nodes() == 0);
  CHECK(empty.root_block_size() == 0);
}

TEST_CASE("runtime_tree: small hand-made tree") {
  // root 6 -> {4, 5, 3}; 4 -> {0, 1}; 5 -> {2}; 3 is class 3 directly under the root.
  //   children by index: root {3, 4, 5}; BFS rows: 3:0 4:1 5:2 | 0:3 1:4 | 2:5
  const auto t = tree64::from_parents({4, 4, 5, 6, 6, 6, -1}, 4);
  CHECK(t.num_classes() == 4);
  CHECK(t.num_rows() == 6);
  CHECK(t.num_internal_nodes() == 3);
  CHECK(t.root_block_size() == 3);
  CHECK(t.height() == 2);
  CHECK_FALSE(t.is_binary());
  CHECK(t.depth(3) == 1);
  CHECK(t.step(3, 0).block_begin == 0);
  CHECK(t.step(3, 0).child == 0);
  CHECK(t.depth(0) == 2);
  CHECK(t.step(0, 0).child == 1);
  CHECK(t.step(0, 1).block_begin == 3);
  CHECK(t.step(0, 1).block_size == 2);
  CHECK(t.step(1, 1).child == 1);
  CHECK(t.step(2, 1).block_begin == 5);
  CHECK(t.step(2, 1).block_size == 1);
  // DFS leaf order: 3, 0, 1, 2.
  CHECK(t.leaf_rank(3) == 0);
  CHECK(t.leaf_rank(0) == 1);
  CHECK(t.leaf_rank(1) == 2);
  CHECK(t.leaf_rank(2) == 3);
  CHECK(t.path_offsets() == std::vector<index_t>{0, 2, 4, 6, 7});
  CHECK(t.block_offsets() == std::vector<index_t>{0, 3, 5, 6});
  check_tree_contract(t);
  check_tree_contract(t.view());
}

TEST_CASE("runtime_tree: single class and a chain of exactly MaxDepth") {
  const auto one = tree64::from_parents({1, -1}, 1);
  CHECK(one.num_classes() == 1);
  CHECK(one.num_rows() == 1);
  CHECK(one.root_block_size() == 1);
  CHECK(one.depth(0) == 1);
  CHECK(one.child(0).is_leaf);
  check_tree_contract(one);

  // class 0 under internal nodes 1 <- 2 <- 3 <- 4 (root): depth 4 == MaxDepth is allowed.
  const auto chain = xsoftmax::runtime_tree<4>::from_parents({1, 2, 3, 4, -1}, 1);
  CHECK(chain.depth(0) == 4);
  CHECK(chain.height() == 4);
  CHECK_FALSE(chain.is_binary());
  check_tree_contract(chain);
}

TEST_CASE("runtime_tree: contract and layout on random parent-array trees") {
  std::mt19937_64 rng(20240611);
  std::uniform_int_distribution<int> height_dist(1, 6);
  std::uniform_int_distribution<int> branching_dist(2, 64);
  for (int trial = 0; trial < 40; ++trial) {
    const int height = height_dist(rng);
    const int branching = branching_dist(rng);
    const auto p = random_parent_tree(rng, height, branching, 3000);
    CAPTURE(trial);
    CAPTURE(height);
    CAPTURE(branching);
    CAPTURE(p.num_classes);
    const auto t = tree64::from_parents(p.parent, p.leaf_class, p.num_classes);
    CHECK(t.num_classes() == p.num_classes);
    CHECK(t.height() == height);
    check_tree_contract(t);
    check_tree_contract(t.view());
    check_layout_matches(t, p);

    // The class-numbered overload gives the same tree up to node numbering.
    parent_tree q;
    q.parent = class_numbered_parents(p);
    q.num_classes = p.num_classes;
    q.leaf_class.assign(q.parent.size(), -1);
    for (index_t c = 0; c < q.num_classes; ++c) q.leaf_class[static_cast<size_t>(c)] = c;
    const auto u = tree64::from_parents(q.parent, q.num_classes);
    check_tree_contract(u);
    check_layout_matches(u, q);
  }
}

TEST_CASE("runtime_tree: view_over rebinds the same scalars to other copies of the arrays") {
  std::mt19937_64 rng(7);
  const auto p = random_parent_tree(rng, 4, 9, 500);
  const auto t = tree64::from_parents(p.parent, p.leaf_class, p.num_classes);
  // Copies standing in for device arrays.
  const auto po = t.path_offsets();
  const auto pr = t.path_rows();
  const auto lr = t.leaf_ranks();
  const auto rp = t.row_parents();
  const auto rc = t.row_children();
  const auto bo = t.block_offsets();
  const auto v = t.view_over(po.data(), pr.data(), lr.data(), rp.data(), rc.data(), bo.data());
  CHECK(v.num_classes() == t.num_classes());
  CHECK(v.num_rows() == t.num_rows());
  CHECK(v.num_internal_nodes() == t.num_internal_nodes());
  CHECK(v.root_block_size() == t.root_block_size());
  CHECK(v.height() == t.height());
  check_tree_contract(v);
  check_layout_matches(v, p);
  const xsoftmax::runtime_tree_view<> raw(t.num_classes(), t.num_rows(), t.num_internal_nodes(),
                                          t.root_block_size(), t.height(), po.data(), pr.data(),
                                          lr.data(), rp.data(), rc.data(), bo.data());
  check_tree_contract(raw);
}

TEST_CASE("runtime_tree: a binary tree's blocks are row pairs, the view's shortcut equals the tables") {
  // Every internal node with two children (binary Huffman trees, forests of them): node k's block
  // is rows [2k, 2k + 2), which the view uses instead of row_parent / block_offset. Its steps and
  // children must equal those the tables give (a view built without the flag reads them).
  std::mt19937_64 rng(31);
  std::vector<double> counts(777);
  for (auto& c : counts) c = std::uniform_real_distribution<double>(0.1, 1e4)(rng);
  const auto a = tree64::huffman(counts, 2);
  const auto b = tree64::huffman(std::vector<double>{3, 1, 4, 1, 5}, 2);
  const auto forest = tree64::forest({&a, &b});
  const auto ternary = tree64::huffman(counts, 3);
  CHECK(a.is_binary());
  CHECK(forest.is_binary());
  CHECK_FALSE(ternary.is_binary());
  for (const tree64* t : {&a, &forest, &ternary}) {
    const auto fast = t->view();
    const xsoftmax::runtime_tree_view<> tables(t->num_classes(), t->num_rows(), t->num_internal_nodes(),
                                               t->root_block_size(), t->height(), t->path_offsets().data(),
                                               t->path_rows().data(), t->leaf_ranks().data(),
                                               t->row_parents().data(), t->row_children().data(),
                                               t->block_offsets().data(), /*binary=*/false);
    for (index_t c = 0; c < t->num_classes(); ++c)
      for (int l = 0; l < fast.depth(c); ++l) {
        const auto x = fast.step(c, l), y = tables.step(c, l);
        CHECK(x.block_begin == y.block_begin);
        CHECK(x.block_size == y.block_size);
        CHECK(x.child == y.child);
      }
    for (index_t r = 0; r < t->num_rows(); ++r) {
      const auto x = fast.child(r), y = tables.child(r);
      CHECK(x.is_leaf == y.is_leaf);
      if (x.is_leaf) {
        CHECK(x.leaf_class == y.leaf_class);
      } else {
        CHECK(x.block_begin == y.block_begin);
        CHECK(x.block_size == y.block_size);
      }
    }
    if (t != &forest) check_tree_contract(fast);  // the contract is a single tree's (one root block)
  }
}

TEST_CASE("runtime_tree::from_parents: bad sizes") {
  using xsoftmax::invalid_argument;
  using xsoftmax::shape_error;
  using xsoftmax::tree_error;
  check_throws<shape_error>(
      [] {
        (void)tree64::from_parents({-1, 0}, {-1}, 1);
      },
      {"from_parents", "leaf_class.size() = 1", "parent.size() = 2"});
  check_throws<invalid_argument>(
      [] {
        (void)tree64::from_parents({-1, 0}, {-1, 0}, 0);
      },
      {"num_classes = 0"});
  check_throws<invalid_argument>(
      [] {
        (void)tree64::from_parents({1, -1}, -3);
      },
      {"num_classes = -3"});
  check_throws<shape_error>(
      [] {
        (void)tree64::from_parents({2, 2, -1}, 5);
      },
      {"parent.size() = 3", "num_classes = 5"});
  // Not a tree_error: the sizes are wrong, not the tree.
  CHECK_THROWS_AS((void)tree64::from_parents({-1, 0}, {-1}, 1), shape_error);
  try {
    (void)tree64::from_parents({-1, 0}, {-1, 0}, 0);
  } catch (const tree_error&) {
    FAIL("num_classes = 0 must not be reported as a tree_error");
  } catch (const invalid_argument&) {
  }
}

TEST_CASE("runtime_tree::from_parents: malformed structure") {
  using xsoftmax::tree_error;
  check_throws<tree_error>([] { (void)tree64::from_parents({}, {}, 1); }, {"no root"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({1, 2, 0}, {0, -1, -1}, 1);
      },
      {"no root"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, -1, 0}, {-1, 0, -1}, 1);
      },
      {"more than one root", "parent[0]", "parent[1]"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 7, 0}, {-1, 0, 1}, 2);
      },
      {"parent[1] = 7", "out of range [-1, 3)"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, -2, 0}, {-1, 0, 1}, 2);
      },
      {"parent[1] = -2"});
  // 2 <-> 3 form a cycle.
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 3, 2}, {-1, 0, -1, -1}, 1);
      },
      {"cycle", "node 2"});
  // Self-loop.
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 2}, {-1, 0, 1}, 2);
      },
      {"cycle", "node 2"});
  // Node 2 hangs below the cycle 3 <-> 4: an orphan.
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 3, 4, 3}, {-1, 0, 1, -1, -1}, 2);
      },
      {"node 2 is an orphan", "not reachable from the root", "cycle through node 3"});
  check_throws<tree_error>([] { (void)tree64::from_parents({-1}, {0}, 1); },
                           {"root (node 0) is a leaf"});
  // The root check comes before reachability: node 0 is a childless root, 1 <-> 2 a cycle.
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 2, 1}, {0, -1, -1}, 1);
      },
      {"root (node 0) is a leaf"});
}

TEST_CASE("runtime_tree::from_parents: bad classes") {
  using xsoftmax::tree_error;
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0, 1}, {-1, 0, 1, 2}, 3);
      },
      {"internal node 1", "carries class 0"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0}, {-1, 0, -1}, 1);
      },
      {"node 2 is a leaf that is not a class"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0}, {-1, 0, 5}, 2);
      },
      {"leaf_class[2] = 5", "num_classes = 2"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0}, {-1, -3, 0}, 2);
      },
      {"leaf_class[1] = -3"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0}, {-1, 1, 1}, 2);
      },
      {"class 1 is listed twice", "duplicate", "nodes 1 and 2"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({-1, 0, 0}, {-1, 0, 2}, 3);
      },
      {"class 1 is missing", "covers 2 of num_classes = 3"});
  // Class-numbered overload: class 0 with a child; an internal node without children.
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({2, 0, -1}, 2);
      },
      {"internal node 0", "carries class 0"});
  check_throws<tree_error>(
      [] {
        (void)tree64::from_parents({2, 2, -1, 2}, 2);
      },
      {"node 3 is a leaf that is not a class"});
}

TEST_CASE("runtime_tree::from_parents: depth beyond MaxDepth") {
  using xsoftmax::tree_error;
  // Class 0 below the chain 1 <- 2 <- 3 <- 4 <- 5 (root): depth 5.
  check_throws<tree_error>(
      [] {
        (void)xsoftmax::runtime_tree<4>::from_parents({1, 2, 3, 4, 5, -1}, 1);
      },
      {"class 0", "depth 5", "MaxDepth = 4"});
  // A long chain (deeper than any int counter would need to saturate) still reports the depth.
  std::vector<index_t> chain(10001);
  for (index_t i = 0; i < 10000; ++i) chain[static_cast<size_t>(i)] = i + 1;
  chain.back() = -1;
  check_throws<tree_error>([&] { (void)tree64::from_parents(chain, 1); },
                           {"depth 10000", "MaxDepth = 64"});
}
