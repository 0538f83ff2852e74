// SPDX-License-Identifier: Apache-2.0
// `runtime_tree::forest`: several trees as one runtime_tree (the sharded hierarchical softmax runs
// all of a rank's subtrees in one head call). Checked: the forest's arrays are the trees' shifted
// (a forest of one tree is that tree); a hierarchical_softmax over the forest gives, row by row,
// bitwise what each tree's own head gives on that tree's rows (losses, hidden gradients, weight
// gradients, log_prob), with targets of every tree mixed in one batch and some rows ignored,
// softmax nodes (ternary trees) and sigmoid nodes (binary), on every host backend; topk refuses a
// forest of several trees, and topk_in_trees gives each row its own tree's head's top-k (bitwise,
// classes shifted; unfilled slots past a small tree's classes); bad arguments throw. Compiled for
// the cuda backend too (tests/cuda/CMakeLists.txt), where the values agree to 1e-5 instead of bit
// for bit (`agree`: cuBLAS picks its kernels by the GEMM shapes, which differ).

#include "support/head_checks.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using tree_t = xsoftmax::runtime_tree<>;

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

/// Whether the forest head's value `a` is the tree head's `b`: bit for bit on the host backends; on
/// cuda within 1e-5 of `scale` (the largest magnitude of that output) or of |b|: the forest's GEMMs
/// have other shapes than one tree's, and cuBLAS picks its kernels by shape (measured on an H100:
/// 1-8 ulp apart in losses, log-probabilities and gradients).
bool agree(float a, float b, double scale) {
#if XSOFTMAX_TEST_HOST_BUILD
  (void)scale;
  return bits(a) == bits(b);
#else
  return bits(a) == bits(b) || std::abs(a - b) <= 1e-5 * std::max(scale, std::abs(static_cast<double>(b)));
#endif
}


/// Three Huffman trees of different sizes (Zipf-like counts, so paths of different depths; the
/// middle one a single class under a ternary root, two under a binary one).
std::vector<tree_t> some_trees(int arity) {
  std::vector<tree_t> trees;
  for (const index_t n : {index_t(37), index_t(arity == 2 ? 2 : 1), index_t(160)}) {
    std::vector<double> f(static_cast<size_t>(n));
    for (index_t c = 0; c < n; ++c) f[static_cast<size_t>(c)] = 1.0 / double(c + 2);
    trees.push_back(tree_t::huffman(f, arity));
  }
  return trees;
}

std::vector<const tree_t*> pointers(const std::vector<tree_t>& trees) {
  std::vector<const tree_t*> p;
  for (const tree_t& t : trees) p.push_back(&t);
  return p;
}

TEST_CASE("runtime_tree::forest: the trees' arrays, shifted; a forest of one tree is the tree") {
  const auto trees = some_trees(3);
  const tree_t f = tree_t::forest(pointers(trees));
  CHECK(f.num_trees() == 3);
  index_t classes = 0, rows = 0, nodes = 0;
  for (std::size_t i = 0; i < trees.size(); ++i) {
    const tree_t& t = trees[i];
    CHECK(f.root_nodes()[i] == nodes);
    CHECK(f.block_offsets()[static_cast<size_t>(nodes)] == rows);
    for (index_t c = 0; c < t.num_classes(); ++c) {
      REQUIRE(f.depth(c + classes) == t.depth(c));
      CHECK(f.leaf_rank(c + classes) == t.leaf_rank(c) + classes);
      for (int l = 0; l < t.depth(c); ++l) {
        CHECK(f.path_row(c + classes, l) == t.path_row(c, l) + rows);
        const auto a = f.step(c + classes, l), b = t.step(c, l);
        CHECK(a.block_begin == b.block_begin + rows);
        CHECK(a.block_size == b.block_size);
        CHECK(a.child == b.child);
      }
    }
    for (index_t r = 0; r < t.num_rows(); ++r) {
      const auto a = f.child(r + rows), b = t.child(r);
      CHECK(a.is_leaf == b.is_leaf);
      if (b.is_leaf) CHECK(a.leaf_class == b.leaf_class + classes);
      else CHECK(a.block_begin == b.block_begin + rows);
    }
    classes += t.num_classes(), rows += t.num_rows(), nodes += t.num_internal_nodes();
  }
  CHECK(f.num_classes() == classes);
  CHECK(f.num_rows() == rows);
  CHECK(f.num_internal_nodes() == nodes);
  CHECK(f.root_block_size() == trees[0].root_block_size());

  const tree_t one = tree_t::forest({&trees[2]});
  CHECK(one.num_trees() == 1);
  CHECK(one.path_offsets() == trees[2].path_offsets());
  CHECK(one.path_rows() == trees[2].path_rows());
  CHECK(one.leaf_ranks() == trees[2].leaf_ranks());
  CHECK(one.row_parents() == trees[2].row_parents());
  CHECK(one.row_children() == trees[2].row_children());
  CHECK(one.block_offsets() == trees[2].block_offsets());
  CHECK(one.height() == trees[2].height());
  CHECK(one.is_binary() == trees[2].is_binary());
}

TEST_CASE("runtime_tree::forest: bad arguments") {
  const auto trees = some_trees(2);
  CHECK_THROWS_AS((void)tree_t::forest({}), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS((void)tree_t::forest({&trees[0], nullptr}), doctest::Contains("trees[1]"),
                       xsoftmax::invalid_argument);
  const tree_t empty;
  CHECK(empty.num_trees() == 0);
  CHECK_THROWS_WITH_AS((void)tree_t::forest({&empty}), doctest::Contains("trees[0]"), xsoftmax::invalid_argument);
}

/// One head over the forest of `trees` against one head per tree, on a batch mixing every tree's
/// classes (every 7th row ignored): bitwise.
template <class B, class Form>
void check_forest_head(int arity) {
  using head_t = xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B, Form>;
  const auto trees = some_trees(arity);
  const tree_t forest = tree_t::forest(pointers(trees));
  const index_t d = 19, batch = 83, rows = head_t::weight_rows(forest);
  test_rng rng(5);
  test_vector<float> w = random_floats(rng, rows * d, 0.5), bias = random_floats(rng, rows, 0.5),
                     h = random_floats(rng, batch * d, 1.0), up = random_floats(rng, batch, 1.0);
  std::vector<index_t> first_class, first_row;  // per tree, in the forest
  index_t fc = 0, fr = 0;
  for (const tree_t& t : trees) first_class.push_back(fc), first_row.push_back(fr), fc += t.num_classes(),
                                                                                    fr += head_t::weight_rows(t);
  test_vector<index_t> targets(static_cast<size_t>(batch));
  std::vector<int> tree_of(static_cast<size_t>(batch));
  for (index_t i = 0; i < batch; ++i) {
    const int k = static_cast<int>(rng.integer(0, 2));
    tree_of[static_cast<size_t>(i)] = k;
    targets[static_cast<size_t>(i)] =
        i % 7 == 3 ? -1 : first_class[static_cast<size_t>(k)] + rng.integer(0, trees[static_cast<size_t>(k)].num_classes() - 1);
  }
  xsoftmax::loss_options none;
  none.reduce = xsoftmax::reduction::none;
  none.ignore_index = -1;

  const head_t whole(forest, mview(w, rows, d), bias.data());
  test_vector<float> loss(static_cast<size_t>(batch)), gh(static_cast<size_t>(batch * d)), lp(static_cast<size_t>(batch));
  typename head_t::gradient_type g;
  whole.forward_backward(cview(h, batch, d), cvec(targets), mview(gh, batch, d), g, none, mvec(loss), cvec(up));
  const double gh_scale = largest_magnitude(gh);
  std::map<index_t, std::vector<float>> grad;  // forest row -> gradient (row, then bias)
  double grad_scale = 0;
  {
    const auto ids = on_host(g.rows);
    const auto values = on_host(g.values), biases = on_host(g.bias_values);
    grad_scale = std::max(largest_magnitude(values), largest_magnitude(biases));
    for (index_t e = 0; e < g.num_rows(); ++e) {
      auto& x = grad[ids[static_cast<size_t>(e)]];
      x.assign(values.begin() + e * d, values.begin() + (e + 1) * d);
      x.push_back(biases[static_cast<size_t>(e)]);
    }
  }
  test_vector<index_t> valid(targets);
  for (auto& t : valid) t = t < 0 ? 0 : t;
  whole.log_prob(cview(h, batch, d), cvec(valid), mvec(lp));

  // topk_in_trees: each row's best K classes in its own tree (the middle tree has fewer than K).
  constexpr index_t K = 3;
  test_vector<index_t> tree_ids(static_cast<size_t>(batch)), in_cls(static_cast<size_t>(batch * K));
  test_vector<float> in_lp(static_cast<size_t>(batch * K));
  for (index_t i = 0; i < batch; ++i) tree_ids[static_cast<size_t>(i)] = tree_of[static_cast<size_t>(i)];
  whole.topk_in_trees(cview(h, batch, d), cvec(tree_ids), K, mview(in_cls, batch, K), mview(in_lp, batch, K));

  std::map<index_t, std::vector<float>> sub_grad;
  for (std::size_t k = 0; k < trees.size(); ++k) {
    const index_t n_rows = head_t::weight_rows(trees[k]), at = first_row[k];
    const head_t part(trees[k], xsoftmax::matrix_view<float>(w.data() + at * d, n_rows, d), bias.data() + at);
    std::vector<index_t> mine;
    for (index_t i = 0; i < batch; ++i)
      if (tree_of[static_cast<size_t>(i)] == static_cast<int>(k)) mine.push_back(i);
    const index_t m = static_cast<index_t>(mine.size());
    test_vector<float> hk(static_cast<size_t>(m * d)), upk(static_cast<size_t>(m)), lk(static_cast<size_t>(m)),
        ghk(static_cast<size_t>(m * d)), lpk(static_cast<size_t>(m));
    test_vector<index_t> tk(static_cast<size_t>(m)), vk(static_cast<size_t>(m));
    for (index_t j = 0; j < m; ++j) {
      const index_t i = mine[static_cast<size_t>(j)], t = targets[static_cast<size_t>(i)];
      std::copy(h.begin() + i * d, h.begin() + (i + 1) * d, hk.begin() + j * d);
      upk[static_cast<size_t>(j)] = up[static_cast<size_t>(i)];
      tk[static_cast<size_t>(j)] = t < 0 ? -1 : t - first_class[k];
      vk[static_cast<size_t>(j)] = valid[static_cast<size_t>(i)] - (t < 0 ? 0 : first_class[k]);
      if (t < 0) vk[static_cast<size_t>(j)] = -1;
    }
    typename head_t::gradient_type gk;
    part.forward_backward(cview(hk, m, d), cvec(tk), mview(ghk, m, d), gk, none, mvec(lk), cvec(upk));
    const auto ids = on_host(gk.rows);
    const auto values = on_host(gk.values), biases = on_host(gk.bias_values);
    for (index_t e = 0; e < gk.num_rows(); ++e) {
      auto& x = sub_grad[ids[static_cast<size_t>(e)] + at];
      x.assign(values.begin() + e * d, values.begin() + (e + 1) * d);
      x.push_back(biases[static_cast<size_t>(e)]);
    }
    for (index_t j = 0; j < m; ++j) {
      const index_t i = mine[static_cast<size_t>(j)];
      INFO("tree ", k, ", row ", i);
      CHECK(agree(loss[static_cast<size_t>(i)], lk[static_cast<size_t>(j)], 0.0));
      for (index_t c = 0; c < d; ++c)
        CHECK(agree(gh[static_cast<size_t>(i * d + c)], ghk[static_cast<size_t>(j * d + c)], gh_scale));
    }
    // log_prob of the rows with a class (an ignored row's forest class 0 belongs to tree 0).
    std::vector<index_t> scored;
    for (index_t j = 0; j < m; ++j)
      if (vk[static_cast<size_t>(j)] >= 0) scored.push_back(j);
    const index_t ms = static_cast<index_t>(scored.size());
    test_vector<float> hs(static_cast<size_t>(ms * d)), ls(static_cast<size_t>(ms));
    test_vector<index_t> ts(static_cast<size_t>(ms));
    for (index_t a = 0; a < ms; ++a) {
      const index_t j = scored[static_cast<size_t>(a)];
      std::copy(hk.begin() + j * d, hk.begin() + (j + 1) * d, hs.begin() + a * d);
      ts[static_cast<size_t>(a)] = vk[static_cast<size_t>(j)];
    }
    if (ms > 0) part.log_prob(cview(hs, ms, d), cvec(ts), mvec(ls));
    for (index_t a = 0; a < ms; ++a)
      CHECK(agree(lp[static_cast<size_t>(mine[static_cast<size_t>(scored[static_cast<size_t>(a)])])],
                  ls[static_cast<size_t>(a)], 0.0));
    // The tree's own head's top-min(K, classes), shifted to forest classes; the rest unfilled.
    const index_t kk = std::min(K, trees[k].num_classes());
    test_vector<index_t> ck(static_cast<size_t>(m * kk));
    test_vector<float> lck(static_cast<size_t>(m * kk));
    if (m > 0) part.topk(cview(hk, m, d), kk, mview(ck, m, kk), mview(lck, m, kk));
    for (index_t j = 0; j < m; ++j)
      for (index_t e = 0; e < K; ++e) {
        const size_t at_in = static_cast<size_t>(mine[static_cast<size_t>(j)] * K + e);
        INFO("topk_in_trees: tree ", k, ", row ", mine[static_cast<size_t>(j)], ", slot ", e);
        if (e < kk) {
          CHECK(in_cls[at_in] == ck[static_cast<size_t>(j * kk + e)] + first_class[k]);
          CHECK(agree(in_lp[at_in], lck[static_cast<size_t>(j * kk + e)], 0.0));
        } else {
          CHECK(in_cls[at_in] == -1);
          CHECK(in_lp[at_in] == -std::numeric_limits<float>::infinity());
        }
      }
  }
  REQUIRE(grad.size() == sub_grad.size());
  for (const auto& entry : grad) {  // no structured binding: INFO captures `row` (C++20 under nvcc)
    const index_t row = entry.first;
    const std::vector<float>& x = entry.second;
    INFO("gradient row ", row);
    REQUIRE(sub_grad.count(row) == 1);
    const auto& y = sub_grad[row];
    for (std::size_t c = 0; c < x.size(); ++c) CHECK(agree(x[c], y[c], grad_scale));
  }

  test_vector<index_t> cls(static_cast<size_t>(batch));
  test_vector<float> lps(static_cast<size_t>(batch));
  CHECK_THROWS_WITH_AS(whole.topk(cview(h, batch, d), 1, mview(cls, batch, 1), mview(lps, batch, 1)),
                       doctest::Contains("forest of 3 trees"), xsoftmax::invalid_argument);
  tree_ids[5] = 3;
  CHECK_THROWS_WITH_AS(whole.topk_in_trees(cview(h, batch, d), cvec(tree_ids), K, mview(in_cls, batch, K),
                                           mview(in_lp, batch, K)),
                       doctest::Contains("trees[5] = 3"), xsoftmax::out_of_range);
  CHECK_THROWS_AS(whole.topk_in_trees(cview(h, batch, d), cvec(tree_ids), 0, mview(in_cls, batch, 0),
                                      mview(in_lp, batch, 0)),
                  xsoftmax::invalid_argument);
  CHECK_THROWS_AS(whole.topk_in_trees(cview(h, batch - 1, d), cvec(tree_ids), K, mview(in_cls, batch - 1, K),
                                      mview(in_lp, batch - 1, K)),
                  xsoftmax::shape_error);
}

TEST_CASE_TEMPLATE("hierarchical_softmax over a forest: each row bitwise its own tree's head", B,
                   XSOFTMAX_TEST_BACKENDS) {
  SUBCASE("softmax nodes, ternary Huffman trees") { check_forest_head<B, xsoftmax::softmax_nodes>(3); }
  SUBCASE("sigmoid nodes, binary Huffman trees") { check_forest_head<B, xsoftmax::sigmoid_nodes>(2); }
}

}  // namespace
