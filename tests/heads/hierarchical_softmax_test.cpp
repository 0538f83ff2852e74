// SPDX-License-Identifier: Apache-2.0
// hierarchical_softmax against its float64 reference (an explicit walk down each class's path
// through the tree contract) on uniform trees, random runtime trees and Huffman trees: losses for
// every reduction with ignore indices, bias or not, hidden as float / double / bf16, both the GEMM
// and the gather-dot path, owned weights and views; gradients against central finite differences
// and the exact set of touched rows; the distribution over all classes sums to 1; log_prob, topk
// (exact and beam) and apply_sgd; the sigmoid node form on binary Huffman trees.

#include "support/head_checks.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

constexpr reduction all_reductions[] = {reduction::none, reduction::mean, reduction::sum};

template <class Tree, class B, class Form = xsoftmax::softmax_nodes>
using hs32 = xsoftmax::hierarchical_softmax<Tree, xsoftmax::fp32, B, Form>;

/// gemm_min_run values that send every run through the GEMM (1), through gather-dot (huge), or mix.
constexpr index_t gemm_min_runs[] = {1, 3, index_t(1) << 40};

/// Targets drawn from a few "popular" classes half of the time, so that runs of samples sharing a
/// node are long at every level (the GEMM path runs for real).
test_vector<index_t> clustered_targets(test_rng& rng, index_t batch, index_t n, double ignore_fraction) {
  test_vector<index_t> popular = {rng.integer(0, n - 1), rng.integer(0, n - 1), n - 1};
  auto t = random_targets(rng, batch, n, ignore_fraction);
  for (auto& x : t)
    if (x >= 0 && rng.coin(0.5)) x = popular[static_cast<size_t>(rng.integer(0, 2))];
  return t;
}

/// Forward (every reduction, every gemm_min_run) and finite-difference gradients (one reduction
/// each, rotating) of an HS over `tree`, plus the exact set of touched gradient rows.
template <class B, class Form = xsoftmax::softmax_nodes, class Tree>
void check_hs_against_reference(const Tree& tree, test_rng& rng, index_t d, index_t batch, bool bias,
                                const std::string& what, bool with_fd = true) {
  constexpr bool sigmoid = std::is_same_v<Form, xsoftmax::sigmoid_nodes>;
  using head_t = hs32<Tree, B, Form>;
  const index_t n = tree.num_classes(), rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, n, d, batch, bias);
  p.targets = clustered_targets(rng, batch, n, 0.15);
  p.targets[0] = -100;
  auto head = head_t(tree, mview(p.w, rows, d), bias ? p.b.data() : nullptr);
  CHECK(head.num_classes() == n);
  CHECK(head.dim() == d);
  CHECK(head.has_bias() == bias);
  const auto ref = hs_reference(tree.view(), sigmoid);
  const auto params = p.params();
  const auto hb = make_hidden<float>(p.h, batch, d, 1);
  int turn = 0;
  for (index_t min_run : gemm_min_runs) {
    head.set_gemm_min_run(min_run);
    const std::string w = what + ", gemm_min_run " + std::to_string(min_run);
    for (reduction r : all_reductions) {
      loss_options opt;
      opt.reduce = r;
      check_forward(head, ref, params, hb, p.targets, opt, w + ", reduction " + reduction_name(r));
    }
    if (!with_fd) continue;
    loss_options opt;
    opt.reduce = all_reductions[turn++ % 3];
    test_vector<float> grad_output;
    if (opt.reduce == reduction::none) grad_output = random_grad_output(rng, batch);
    if (opt.reduce == reduction::mean) grad_output = {-1.3f};
    const auto out = check_gradients(head, ref, params, hb, p.targets, opt, grad_output,
                                     w + ", gradients, reduction " + reduction_name(opt.reduce));
    // The sparse gradient holds exactly the blocks on the targets' paths, each row once.
    const auto listed = on_host(out.grad.rows);
    test_vector<index_t> got(listed.begin(), listed.end());
    std::sort(got.begin(), got.end());
    CHECK_MESSAGE(std::adjacent_find(got.begin(), got.end()) == got.end(), w, ": a gradient row is listed twice");
    CHECK_MESSAGE(got == expected_touched_rows(tree.view(), p.targets, -100, sigmoid), w,
                  ": gradient rows are not exactly the blocks on the targets' paths");
  }
}

/// log_distribution over all classes: each row sums to 1 and matches the reference; log_prob of
/// the targets equals the distribution's entries; exact topk equals sorting the distribution.
template <class B, class Form = xsoftmax::softmax_nodes, class Tree>
void check_hs_distribution(const Tree& tree, test_rng& rng, index_t d, index_t batch, const std::string& what) {
  constexpr bool sigmoid = std::is_same_v<Form, xsoftmax::sigmoid_nodes>;
  using head_t = hs32<Tree, B, Form>;
  const index_t n = tree.num_classes(), rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, n, d, batch, true);
  auto head = head_t(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> dist(static_cast<size_t>(batch * n));
  head.log_distribution(hb.view(), 0, n, mview(dist, batch, n));
  for (index_t i = 0; i < batch; ++i) {
    double total = 0;
    for (index_t c = 0; c < n; ++c) total += std::exp(static_cast<double>(dist[static_cast<size_t>(i * n + c)]));
    INFO(what, ": row ", i, ", N = ", n);
    CHECK(total == doctest::Approx(1.0).epsilon(2e-5));
  }
  const auto ref = reference_log_distribution(hs_reference(tree.view(), sigmoid), p.params(), hb.reference(p.targets), n);
  check_close(dist, ref, loss_atol, loss_rtol, what + ": log_distribution vs reference");

  test_vector<float> lp(static_cast<size_t>(batch));
  head.log_prob(hb.view(), cvec(p.targets), mvec(lp));
  for (index_t i = 0; i < batch; ++i)
    CHECK(lp[static_cast<size_t>(i)] ==
          doctest::Approx(dist[static_cast<size_t>(i * n + p.targets[static_cast<size_t>(i)])]).epsilon(1e-5));

  const index_t k = std::min<index_t>(n, 6);
  test_vector<index_t> cls(static_cast<size_t>(batch * k));
  test_vector<float> lps(static_cast<size_t>(batch * k));
  head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k));
  for (index_t i = 0; i < batch; ++i)
    check_topk_row(ref.data() + i * n, n, cls.data() + i * k, lps.data() + i * k, k, what + ": exact topk");
}

/// Reference-checked random runtime trees: height 1..6, branching up to `max_branching`.
xsoftmax::runtime_tree<6> random_runtime_tree(test_rng& rng, int height, int max_branching, index_t budget) {
  const auto t = random_parent_tree(rng, height, max_branching, budget);
  auto tree = xsoftmax::runtime_tree<6>::from_parents(t.parent, t.leaf_class, t.num_classes);
  REQUIRE(tree.num_classes() == t.num_classes);
  REQUIRE(tree.height() == height);
  return tree;
}

template <int Depth, int Branching, index_t N>
struct uniform_case {
  using tree = xsoftmax::uniform_tree<Depth, Branching>;
  static constexpr index_t num_classes = N;
};

}  // namespace

TEST_CASE_TEMPLATE("hierarchical_softmax: uniform tree, forward and gradients match the float64 reference", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(101);
  // N = 100 is not 5^3: the last node of each level has masked children.
  const xsoftmax::uniform_tree<3, 5> tree(100);
  CHECK(tree.num_rows() == 100 + 20 + 4);
  check_hs_against_reference<B>(tree, rng, 6, 24, false, "uniform<3,5> N=100, no bias");
  check_hs_against_reference<B>(tree, rng, 6, 24, true, "uniform<3,5> N=100, bias");
  // Binary, N = 13 not a power of two (nodes with a single live child).
  check_hs_against_reference<B>(xsoftmax::uniform_tree<4, 2>(13), rng, 5, 16, true, "uniform<4,2> N=13");
  // Depth 1 with N < Branching.
  check_hs_against_reference<B>(xsoftmax::uniform_tree<1, 64>(37), rng, 5, 10, true, "uniform<1,64> N=37");
}

TEST_CASE_TEMPLATE("hierarchical_softmax: hidden given as double and bf16, strided views", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(102);
  const xsoftmax::uniform_tree<2, 7> tree(40);
  using head_t = hs32<xsoftmax::uniform_tree<2, 7>, B>;
  const index_t rows = head_t::weight_rows(tree), d = 9, batch = 20, stride = d + 3;
  problem p = make_problem(rng, rows, 40, d, batch, true, 0.1);
  // Weights in a strided caller buffer (padding NaN: must never be read).
  test_vector<float> buffer(static_cast<size_t>(rows * stride), std::numeric_limits<float>::quiet_NaN());
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < d; ++j) buffer[static_cast<size_t>(r * stride + j)] = p.w[static_cast<size_t>(r * d + j)];
  head_t head(tree, mview(buffer, rows, d, stride), p.b.data());
  CHECK(head.weights().data == buffer.data());
  const auto ref = hs_reference(tree.view());
  for (index_t min_run : {index_t(1), index_t(1) << 40}) {
    head.set_gemm_min_run(min_run);
    loss_options opt;
    opt.reduce = reduction::sum;
    auto hd = make_hidden<double>(p.h, batch, d, 2);
    for (auto& x : hd.storage) x += 1e-9 * std::cos(x * 1e3);  // not representable in fp32
    check_forward(head, ref, p.params(), hd, p.targets, opt, "double hidden");
    check_forward(head, ref, p.params(), make_hidden<__nv_bfloat16>(p.h, batch, d), p.targets, opt, "bf16 hidden");
    check_gradients(head, ref, p.params(), make_hidden<__nv_bfloat16>(p.h, batch, d, 1), p.targets, opt, {},
                    "bf16 hidden gradients");
    check_gradients(head, ref, p.params(), hd, p.targets, opt, {}, "double hidden gradients");
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: owned weights equal a view of the same values", B, XSOFTMAX_TEST_BACKENDS) {
  using tree_t = xsoftmax::uniform_tree<3, 4>;
  using head_t = hs32<tree_t, B>;
  const tree_t tree(50);
  const index_t d = 7, batch = 30;
  xsoftmax::init_options init;
  init.seed = 77;
  init.scale = 0.5f;
  head_t owned(tree, d, true, init);
  const index_t rows = head_t::weight_rows(tree);
  REQUIRE(owned.weights().rows == rows);
  auto w = dense_copy(xsoftmax::matrix_view<const float>(owned.weights()));
  CHECK(std::all_of(w.begin(), w.end(), [](float x) { return std::abs(x) <= 0.5f; }));
  CHECK(*std::max_element(w.begin(), w.end()) > 0.25f);
  test_rng rng(103);
  test_vector<float> bias = random_floats(rng, rows, 1.0);
  write_into(owned.bias(), bias);
  head_t view(tree, mview(w, rows, d), bias.data());
  const auto h = random_floats(rng, batch * d, 1.0);
  const auto hb = make_hidden<float>(h, batch, d);
  const auto targets = clustered_targets(rng, batch, 50, 0.1);
  for (reduction r : all_reductions) {
    loss_options opt;
    opt.reduce = r;
    const auto a = run_forward_backward(owned, hb, targets, opt);
    const auto b = run_forward_backward(view, hb, targets, opt);
    CHECK(same_outputs(a, b));  // same values, same kernels: identical bits
  }
  ref_params params;
  params.rows = rows;
  params.dim = d;
  params.w = to_doubles(w);
  params.b = to_doubles(bias);
  loss_options opt;
  check_forward(owned, hs_reference(tree.view()), params, hb, targets, opt, "owned");
}

TEST_CASE_TEMPLATE("hierarchical_softmax: random runtime trees, forward and gradients match the reference", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(104);
  for (int i = 0; i < 8; ++i) {
    const int height = 1 + i % 6;
    const int max_branching = i % 2 ? 3 : 8;
    const auto tree = random_runtime_tree(rng, height, max_branching, 40);
    const std::string what = "runtime tree #" + std::to_string(i) + " height " + std::to_string(height) + " N " +
                             std::to_string(tree.num_classes());
    check_hs_against_reference<B>(tree, rng, 5, 14, i % 3 != 0, what);
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: Huffman trees, forward and gradients match the reference", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(105);
  for (int arity : {2, 3, 8}) {
    const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 60), arity);
    check_hs_against_reference<B>(tree, rng, 5, 20, arity != 3, "huffman arity " + std::to_string(arity));
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: sigmoid nodes on a binary Huffman tree", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(106);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 70), 2);
  REQUIRE(tree.is_binary());
  using head_t = hs32<xsoftmax::runtime_tree<>, B, xsoftmax::sigmoid_nodes>;
  CHECK(head_t::weight_rows(tree) == tree.num_classes() - 1);  // one row per internal node
  check_hs_against_reference<B, xsoftmax::sigmoid_nodes>(tree, rng, 6, 24, true, "sigmoid, bias");
  check_hs_against_reference<B, xsoftmax::sigmoid_nodes>(tree, rng, 6, 24, false, "sigmoid, no bias");
  check_hs_distribution<B, xsoftmax::sigmoid_nodes>(tree, rng, 6, 5, "sigmoid huffman");
  // A complete binary uniform tree works in sigmoid form too.
  check_hs_distribution<B, xsoftmax::sigmoid_nodes>(xsoftmax::uniform_tree<5, 2>(32), rng, 6, 4, "sigmoid uniform<5,2>");
}

TEST_CASE_TEMPLATE("hierarchical_softmax: probabilities over all classes sum to 1 on uniform trees", Case,
                   uniform_case<1, 64, 50>, uniform_case<2, 7, 40>, uniform_case<3, 5, 100>,
                   uniform_case<4, 3, 70>, uniform_case<6, 2, 45>, uniform_case<2, 64, 1000>) {
  test_rng rng(107 + Case::num_classes);
  const typename Case::tree tree(Case::num_classes);
  const std::string what = "uniform<" + std::to_string(Case::tree::depth_value) + "," +
                           std::to_string(Case::tree::branching) + "> N=" + std::to_string(Case::num_classes);
  check_hs_distribution<primary_backend>(tree, rng, 8, 4, what + " " + backend_name<primary_backend>());
  check_hs_distribution<secondary_backend>(tree, rng, 8, 4, what + " " + backend_name<secondary_backend>());
  // N = Branching^Depth exactly (no masking) and N = 1.
  if (Case::tree::depth_value <= 3) {
    index_t full = 1;
    for (int l = 0; l < Case::tree::depth_value; ++l) full *= Case::tree::branching;
    if (full <= 2000) check_hs_distribution<primary_backend>(typename Case::tree(full), rng, 8, 3, what + " full");
  }
  check_hs_distribution<primary_backend>(typename Case::tree(1), rng, 4, 2, what + " N=1");
  // Random N up to the capacity (capped to keep the test fast).
  index_t capacity = 1;
  for (int l = 0; l < Case::tree::depth_value; ++l) capacity *= Case::tree::branching;
  for (int i = 0; i < 3; ++i) {
    const index_t n = rng.integer(2, std::min<index_t>(capacity, 1500));
    check_hs_distribution<primary_backend>(typename Case::tree(n), rng, 5, 2, what + " random N=" + std::to_string(n));
  }
}

TEST_CASE("hierarchical_softmax: probabilities over all classes sum to 1 on random runtime and Huffman trees") {
  test_rng rng(108);
  const int branchings[] = {2, 5, 17, 64};
  for (int i = 0; i < 12; ++i) {
    const int height = 1 + i % 6;
    const int max_branching = branchings[i % 4];
    const auto tree = random_runtime_tree(rng, height, max_branching, 600);
    const std::string what = "runtime tree #" + std::to_string(i) + " height " + std::to_string(height) +
                             " max branching " + std::to_string(max_branching) + " N " +
                             std::to_string(tree.num_classes());
    if (i % 2) check_hs_distribution<secondary_backend>(tree, rng, 6, 3, what);
    else check_hs_distribution<primary_backend>(tree, rng, 6, 3, what);
  }
  for (int arity : {2, 3, 4, 16, 64}) {
    const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 300), arity);
    check_hs_distribution<primary_backend>(tree, rng, 6, 3, "huffman arity " + std::to_string(arity));
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: log_prob equals minus the per-sample forward; log_distribution ranges", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(109);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 90), 4);
  using head_t = hs32<xsoftmax::runtime_tree<>, B>;
  const index_t n = 90, d = 8, batch = 40, rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, n, d, batch, true);
  head_t head(tree, mview(p.w, rows, d), p.b.data());
  for (index_t min_run : {index_t(1), index_t(16), index_t(1) << 40}) {
    head.set_gemm_min_run(min_run);
    test_vector<float> lp(static_cast<size_t>(batch)), per(static_cast<size_t>(batch));
    head.log_prob(cview(p.h, batch, d), cvec(p.targets), mvec(lp));
    loss_options none;
    none.reduce = reduction::none;
    head.forward(cview(p.h, batch, d), cvec(p.targets), none, mvec(per));
    for (index_t i = 0; i < batch; ++i) CHECK(lp[static_cast<size_t>(i)] == -per[static_cast<size_t>(i)]);
  }
  test_vector<float> all(static_cast<size_t>(3 * n));
  head.log_distribution(cview(p.h, 3, d), 0, n, mview(all, 3, n));
  const index_t lo = 17, hi = 61, stride = hi - lo + 2;
  test_vector<float> part(static_cast<size_t>(3 * stride), 5.f);
  head.log_distribution(cview(p.h, 3, d), lo, hi, mview(part, 3, hi - lo, stride));
  for (index_t i = 0; i < 3; ++i) {
    for (index_t c = lo; c < hi; ++c)
      CHECK(part[static_cast<size_t>(i * stride + c - lo)] == all[static_cast<size_t>(i * n + c)]);
    CHECK(part[static_cast<size_t>(i * stride + stride - 1)] == 5.f);
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: topk, exact search and beam search", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(110);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 150), 3);
  using head_t = hs32<xsoftmax::runtime_tree<>, B>;
  const index_t n = 150, d = 8, batch = 6, rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, n, d, batch, true);
  head_t head(tree, mview(p.w, rows, d), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  const auto ref = reference_log_distribution(hs_reference(tree.view()), p.params(), hb.reference(p.targets), n);

  // Exact search, k from 1 to N.
  for (index_t k : {index_t(1), index_t(4), n}) {
    test_vector<index_t> cls(static_cast<size_t>(batch * k));
    test_vector<float> lps(static_cast<size_t>(batch * k));
    head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k));
    for (index_t i = 0; i < batch; ++i)
      check_topk_row(ref.data() + i * n, n, cls.data() + i * k, lps.data() + i * k, k, "exact k=" + std::to_string(k));
    // A beam wider than the tree has nodes is exact search.
    xsoftmax::search_options wide;
    wide.beam_width = rows + 1;
    test_vector<index_t> cls2(cls.size());
    test_vector<float> lps2(lps.size());
    head.topk(hb.view(), k, mview(cls2, batch, k), mview(lps2, batch, k), wide);
    CHECK(cls2 == cls);
    CHECK(bitwise_equal(lps2, lps));
  }

  // Narrow beams: every class returned is valid and distinct with its own log-probability (that of
  // log_prob); a beam may run dry, and then only the tail holds -1 / -inf.
  for (index_t beam : {index_t(1), index_t(2), index_t(3)}) {
    for (index_t k : {index_t(1), index_t(3), index_t(8)}) {
      xsoftmax::search_options so;
      so.beam_width = beam;
      test_vector<index_t> cls(static_cast<size_t>(batch * k));
      test_vector<float> lps(static_cast<size_t>(batch * k));
      head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k), so);
      for (index_t i = 0; i < batch; ++i) {
        INFO("beam ", beam, " k ", k, " row ", i);
        test_vector<index_t> valid;
        bool dry = false;
        for (index_t j = 0; j < k; ++j) {
          const index_t c = cls[static_cast<size_t>(i * k + j)];
          const float l = lps[static_cast<size_t>(i * k + j)];
          if (c == -1) {
            dry = true;
            CHECK(std::isinf(l));
            CHECK(l < 0);
            continue;
          }
          CHECK_FALSE(dry);  // -1 only at the tail
          REQUIRE(c >= 0);
          REQUIRE(c < n);
          valid.push_back(c);
          CHECK(std::abs(l - ref[static_cast<size_t>(i * n + c)]) <= 2e-5 * (1 + std::abs(l)));
        }
        CHECK(!valid.empty());
        test_vector<index_t> s = valid;
        std::sort(s.begin(), s.end());
        CHECK(std::adjacent_find(s.begin(), s.end()) == s.end());
        // log_prob of the returned classes gives the returned log-probabilities.
        for (size_t j = 0; j < valid.size(); ++j) {
          test_vector<float> lp(1);  // a buffer, not a stack float: on cuda the head writes it from the GPU
          head.log_prob(xsoftmax::matrix_view<const float>(p.h.data() + i * d, 1, d),
                        xsoftmax::vector_view<const index_t>(&valid[j], 1), mvec(lp));
          CHECK(lp[0] == doctest::Approx(lps[static_cast<size_t>(i * k) + j]).epsilon(1e-5));
        }
      }
      if (beam == 1 && k == 1) {
        // beam 1 is greedy descent: the best child at every node, from the reference scores.
        const auto params = p.params();
        const auto rb = hb.reference(p.targets);
        for (index_t i = 0; i < batch; ++i) {
          const double* h = rb.h.data() + i * d;
          xsoftmax::child_ref node;
          node.block_begin = 0;
          node.block_size = tree.root_block_size();
          for (;;) {
            index_t best = 0;
            for (index_t j = 1; j < node.block_size; ++j)
              if (params.score(node.block_begin + j, h) > params.score(node.block_begin + best, h)) best = j;
            node = tree.child(node.block_begin + best);
            if (node.is_leaf) break;
          }
          CHECK(cls[static_cast<size_t>(i)] == node.leaf_class);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: apply_sgd updates exactly the touched rows", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(111);
  using tree_t = xsoftmax::uniform_tree<3, 4>;
  using head_t = hs32<tree_t, B>;
  const tree_t tree(60);
  const index_t d = 6, batch = 5, rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, 60, d, batch, true);
  head_t head(tree, mview(p.w, rows, d), p.b.data());
  typename head_t::gradient_type g;
  test_vector<float> gh(static_cast<size_t>(batch * d));
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(gh, batch, d), g);
  REQUIRE(g.num_rows() > 0);
  REQUIRE(g.num_rows() < rows);  // 5 samples cannot touch every block
  const auto w0 = p.w, b0 = p.b;
  const float lr = 0.25f;
  head.apply_sgd(g, lr);
  test_vector<char> updated(static_cast<size_t>(rows), 0);
  for (index_t i = 0; i < g.num_rows(); ++i) {
    const index_t r = g.rows[static_cast<size_t>(i)];
    updated[static_cast<size_t>(r)] = 1;
    for (index_t j = 0; j < d; ++j) {
      const size_t at = static_cast<size_t>(r * d + j);
      CHECK(p.w[at] == w0[at] - lr * g.values[static_cast<size_t>(i * d + j)]);
    }
    CHECK(p.b[static_cast<size_t>(r)] == b0[static_cast<size_t>(r)] - lr * g.bias_values[static_cast<size_t>(i)]);
  }
  for (index_t r = 0; r < rows; ++r)
    if (!updated[static_cast<size_t>(r)]) {
      CHECK(bitwise_equal(w0.data() + r * d, p.w.data() + r * d, static_cast<size_t>(d)));
      CHECK(bitwise_equal(&b0[static_cast<size_t>(r)], &p.b[static_cast<size_t>(r)], 1));
    }
  // A few SGD steps lower the loss.
  const float before = head.forward(cview(p.h, batch, d), cvec(p.targets));
  for (int step = 0; step < 3; ++step) {
    head.backward(cview(p.h, batch, d), cvec(p.targets), mview(gh, batch, d), g);
    head.apply_sgd(g, 0.2f);
  }
  CHECK(head.forward(cview(p.h, batch, d), cvec(p.targets)) < before);
}

TEST_CASE_TEMPLATE("hierarchical_softmax: a reused gradient object gives the same result as a fresh one", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(112);
  using tree_t = xsoftmax::uniform_tree<2, 8>;
  using head_t = hs32<tree_t, B>;
  const tree_t tree(60);
  const index_t d = 6, rows = head_t::weight_rows(tree);
  problem p = make_problem(rng, rows, 60, d, 40, true);
  head_t head(tree, mview(p.w, rows, d), p.b.data());
  for (index_t min_run : {index_t(1), index_t(1) << 40}) {
    head.set_gemm_min_run(min_run);
    typename head_t::gradient_type g;
    test_vector<float> gh(static_cast<size_t>(40 * d));
    head.backward(cview(p.h, 40, d), cvec(p.targets), mview(gh, 40, d), g);
    const test_vector<index_t> t2 = {59, 3, 3};
    test_vector<float> gh2(static_cast<size_t>(3 * d)), gh3(static_cast<size_t>(3 * d));
    head.backward(cview(p.h, 3, d), cvec(t2), mview(gh2, 3, d), g);
    typename head_t::gradient_type fresh;
    head.backward(cview(p.h, 3, d), cvec(t2), mview(gh3, 3, d), fresh);
    CHECK(same_gradient(g, fresh));
    CHECK(bitwise_equal(gh2, gh3));
  }
}

TEST_CASE_TEMPLATE("hierarchical_softmax: every sample ignored gives zero loss and zero gradients", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(113);
  using tree_t = xsoftmax::uniform_tree<2, 4>;
  using head_t = hs32<tree_t, B>;
  const tree_t tree(14);
  problem p = make_problem(rng, tree.num_rows(), 14, 4, 5, true);
  head_t head(tree, mview(p.w, p.rows, 4), p.b.data());
  test_vector<index_t> targets(5, -100);
  const auto hb = make_hidden<float>(p.h, 5, 4);
  for (reduction r : all_reductions) {
    loss_options opt;
    opt.reduce = r;
    const auto out = run_forward_backward(head, hb, targets, opt);
    CHECK(out.loss == 0.f);
    CHECK(std::all_of(out.per_sample.begin(), out.per_sample.end(), [](float x) { return x == 0.f; }));
    CHECK(std::all_of(out.grad_hidden.begin(), out.grad_hidden.end(), [](float x) { return x == 0.f; }));
    CHECK(out.grad.num_rows() == 0);
  }
}

// Sigmoid nodes on a host: the row ranges copy their hidden rows in and write the hidden gradients
// straight into the caller's rows (ignored rows zeroed first); a gradient matrix over the hidden
// rows themselves (in place) takes the sorted copy and the scatter instead. 300 rows: more than one
// range, runs crossing their bounds. Every form gives the same bits; the padding stays.
TEST_CASE_TEMPLATE("hierarchical_softmax: sigmoid nodes, strided, ignored and in-place hidden gradients", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(115);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 90), 2);
  using head_t = hs32<xsoftmax::runtime_tree<>, B, xsoftmax::sigmoid_nodes>;
  const index_t d = 7, batch = 300, pad = 2;
  problem p = make_problem(rng, head_t::weight_rows(tree), tree.num_classes(), d, batch, true, 0.15);
  head_t head(tree, mview(p.w, p.rows, d), p.b.data());
  test_vector<float> dense(static_cast<size_t>(batch * d), 5.f), strided(static_cast<size_t>(batch * (d + pad)), 9.f),
      in_place(p.h);
  typename head_t::gradient_type g1, g2, g3;
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(dense, batch, d), g1);
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(strided, batch, d, d + pad), g2);
  head.backward(cview(in_place, batch, d), cvec(p.targets), mview(in_place, batch, d), g3);
  index_t ignored = 0;
  for (index_t i = 0; i < batch; ++i) {
    const float* row = dense.data() + i * d;
    CHECK(bitwise_equal(row, strided.data() + i * (d + pad), static_cast<size_t>(d)));
    CHECK(bitwise_equal(row, in_place.data() + i * d, static_cast<size_t>(d)));
    for (index_t j = d; j < d + pad; ++j) CHECK(strided[static_cast<size_t>(i * (d + pad) + j)] == 9.f);
    if (p.targets[static_cast<size_t>(i)] == -100) {
      ++ignored;
      CHECK(std::all_of(row, row + d, [](float x) { return x == 0.f; }));
    }
  }
  CHECK(ignored > 0);
  CHECK(same_gradient(g1, g2));
  CHECK(same_gradient(g1, g3));
}

TEST_CASE_TEMPLATE("hierarchical_softmax: strided grad_hidden and topk outputs leave their padding alone", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(114);
  using tree_t = xsoftmax::uniform_tree<3, 3>;
  using head_t = hs32<tree_t, B>;
  const tree_t tree(20);
  const index_t d = 5, batch = 7, pad = 3;
  problem p = make_problem(rng, tree.num_rows(), 20, d, batch, false, 0.2);
  head_t head(tree, mview(p.w, p.rows, d));
  test_vector<float> dense(static_cast<size_t>(batch * d)), strided(static_cast<size_t>(batch * (d + pad)), 9.f);
  typename head_t::gradient_type g1, g2;
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(dense, batch, d), g1);
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(strided, batch, d, d + pad), g2);
  for (index_t i = 0; i < batch; ++i) {
    CHECK(bitwise_equal(dense.data() + i * d, strided.data() + i * (d + pad), static_cast<size_t>(d)));
    for (index_t j = d; j < d + pad; ++j) CHECK(strided[static_cast<size_t>(i * (d + pad) + j)] == 9.f);
  }
  const index_t k = 3, ks = k + 2;
  test_vector<index_t> c1(static_cast<size_t>(batch * k)), c2(static_cast<size_t>(batch * ks), -7);
  test_vector<float> l1(c1.size()), l2(c2.size(), 4.f);
  head.topk(cview(p.h, batch, d), k, mview(c1, batch, k), mview(l1, batch, k));
  head.topk(cview(p.h, batch, d), k, mview(c2, batch, k, ks), mview(l2, batch, k, ks));
  for (index_t i = 0; i < batch; ++i)
    for (index_t j = 0; j < ks; ++j) {
      const size_t at = static_cast<size_t>(i * ks + j);
      if (j < k) {
        CHECK(c2[at] == c1[static_cast<size_t>(i * k + j)]);
        CHECK(l2[at] == l1[static_cast<size_t>(i * k + j)]);
      } else {
        CHECK(c2[at] == -7);
        CHECK(l2[at] == 4.f);
      }
    }
}
