// SPDX-License-Identifier: Apache-2.0
// Equivalences as oracles: the omp backend equals serial bit for bit; results are bitwise
// repeatable across runs and OpenMP thread counts; a hierarchical softmax of depth 1 equals the full
// softmax with the same weights; the HS GEMM path equals its gather-dot path; an HS over a runtime
// tree shaped like a uniform tree equals the HS over that uniform tree.

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#if defined(_OPENMP) && XSOFTMAX_TEST_HOST_BUILD
#include <omp.h>
#endif

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

// Bitwise equality of omp and serial (host-only: the cuda build of this file skips it).
#if XSOFTMAX_TEST_HOST_BUILD
/// Everything a head computes for one batch: forward_backward under each reduction (none with a
/// per-sample upstream gradient), log_prob, topk and log_distribution.
struct all_outputs {
  test_vector<float> losses, per_sample, grad_hidden, grad_values, grad_bias, log_prob, topk_lp, dist;
  test_vector<index_t> grad_rows, topk_cls;
};

template <class Head>
all_outputs compute_all(const Head& head, const problem& p, const test_vector<float>& grad_output, index_t k) {
  all_outputs o;
  const auto hb = make_hidden<float>(p.h, p.batch, p.dim);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const auto out = run_forward_backward(head, hb, p.targets, opt,
                                          r == reduction::none ? grad_output : test_vector<float>{});
    o.losses.push_back(out.loss);
    o.per_sample.insert(o.per_sample.end(), out.per_sample.begin(), out.per_sample.end());
    o.grad_hidden.insert(o.grad_hidden.end(), out.grad_hidden.begin(), out.grad_hidden.end());
    o.grad_rows.insert(o.grad_rows.end(), out.grad.rows.begin(), out.grad.rows.end());
    o.grad_values.insert(o.grad_values.end(), out.grad.values.begin(), out.grad.values.end());
    o.grad_bias.insert(o.grad_bias.end(), out.grad.bias_values.begin(), out.grad.bias_values.end());
  }
  test_vector<index_t> valid = p.targets;
  for (auto& t : valid) t = t < 0 ? 0 : t;
  o.log_prob.resize(static_cast<size_t>(p.batch));
  head.log_prob(hb.view(), cvec(valid), mvec(o.log_prob));
  o.topk_cls.resize(static_cast<size_t>(p.batch * k));
  o.topk_lp.resize(static_cast<size_t>(p.batch * k));
  head.topk(hb.view(), k, mview(o.topk_cls, p.batch, k), mview(o.topk_lp, p.batch, k));
  const index_t rows = std::min<index_t>(p.batch, 4), n = head.num_classes();
  o.dist.resize(static_cast<size_t>(rows * n));
  head.log_distribution(xsoftmax::matrix_view<const float>(p.h.data(), rows, p.dim), 0, n, mview(o.dist, rows, n));
  return o;
}

void check_same(const all_outputs& a, const all_outputs& b, const std::string& what) {
  CHECK_MESSAGE(bitwise_equal(a.losses, b.losses), what, ": losses differ");
  CHECK_MESSAGE(bitwise_equal(a.per_sample, b.per_sample), what, ": per-sample losses differ");
  CHECK_MESSAGE(bitwise_equal(a.grad_hidden, b.grad_hidden), what, ": grad_hidden differs");
  CHECK_MESSAGE(a.grad_rows == b.grad_rows, what, ": gradient rows differ");
  CHECK_MESSAGE(bitwise_equal(a.grad_values, b.grad_values), what, ": weight gradients differ");
  CHECK_MESSAGE(bitwise_equal(a.grad_bias, b.grad_bias), what, ": bias gradients differ");
  CHECK_MESSAGE(bitwise_equal(a.log_prob, b.log_prob), what, ": log_prob differs");
  CHECK_MESSAGE(a.topk_cls == b.topk_cls, what, ": topk classes differ");
  CHECK_MESSAGE(bitwise_equal(a.topk_lp, b.topk_lp), what, ": topk log-probabilities differ");
  CHECK_MESSAGE(bitwise_equal(a.dist, b.dist), what, ": log_distribution differs");
}

/// Runs `make(backend tag)` heads on serial, on omp, and on omp with 1, 2 and 3 threads (twice
/// each), and checks every output is the same bits.
template <class MakeHead>
void check_backends_and_threads(MakeHead make, const problem& p, const test_vector<float>& grad_output, index_t k,
                                const std::string& what) {
  const auto serial_out = compute_all(make(xsoftmax::serial{}), p, grad_output, k);
  const auto omp_out = compute_all(make(xsoftmax::omp{}), p, grad_output, k);
  check_same(serial_out, omp_out, what + ": omp vs serial");
  check_same(serial_out, compute_all(make(xsoftmax::serial{}), p, grad_output, k), what + ": serial run twice");
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 2}) {
    omp_set_num_threads(threads);
    check_same(serial_out, compute_all(make(xsoftmax::omp{}), p, grad_output, k),
               what + ": omp with " + std::to_string(threads) + " threads");
  }
  omp_set_num_threads(saved);
#else
  MESSAGE("built without OpenMP: thread-count repeatability not exercised");
#endif
}

#endif  // XSOFTMAX_TEST_HOST_BUILD

}  // namespace

#if XSOFTMAX_TEST_HOST_BUILD
TEST_CASE("equivalence: full_softmax on omp equals serial, bitwise, at every thread count") {
  test_rng rng(201);
  problem p = make_problem(rng, 300, 300, 16, 48, true, 0.1);
  const auto grad_output = random_grad_output(rng, p.batch);
  for (index_t chunk : {index_t(0), index_t(64), index_t(37)}) {
    auto make = [&](auto backend) {
      using B = decltype(backend);
      xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), p.b.data());
      head.set_chunk_size(chunk);
      return head;
    };
    check_backends_and_threads(make, p, grad_output, 5, "full_softmax chunk " + std::to_string(chunk));
  }
  // bf16 storage follows the same paths.
  auto wb = convert<__nv_bfloat16>(p.w);
  auto make_bf16 = [&](auto backend) {
    using B = decltype(backend);
    return xsoftmax::full_softmax<xsoftmax::bf16, B>(mview(wb, p.rows, p.dim));
  };
  check_backends_and_threads(make_bf16, p, grad_output, 3, "full_softmax bf16");
}

TEST_CASE("equivalence: hierarchical_softmax on omp equals serial, bitwise, at every thread count") {
  test_rng rng(202);
  // Uniform tree, 300 samples: the root's run (>= 256 samples) goes through the whole policy;
  // deeper runs go side by side, one thread each.
  {
    using tree_t = xsoftmax::uniform_tree<3, 5>;
    const tree_t tree(100);
    problem p = make_problem(rng, tree.num_rows(), 100, 16, 300, true, 0.05);
    const auto grad_output = random_grad_output(rng, p.batch);
    for (index_t min_run : {index_t(1), index_t(16), index_t(1) << 40}) {
      auto make = [&](auto backend) {
        using B = decltype(backend);
        xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> head(tree, mview(p.w, p.rows, p.dim), p.b.data());
        head.set_gemm_min_run(min_run);
        return head;
      };
      check_backends_and_threads(make, p, grad_output, 4, "HS uniform<3,5> gemm_min_run " + std::to_string(min_run));
    }
  }
  // Huffman tree (classes at many depths), softmax and sigmoid nodes.
  {
    const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 120), 2);
    problem p = make_problem(rng, tree.num_rows(), 120, 12, 280, true, 0.05);
    const auto grad_output = random_grad_output(rng, p.batch);
    auto make = [&](auto backend) {
      using B = decltype(backend);
      return xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B>(
          tree, mview(p.w, p.rows, p.dim), p.b.data());
    };
    check_backends_and_threads(make, p, grad_output, 4, "HS huffman");
    problem q = p;
    q.rows = tree.num_rows() / 2;
    q.w.resize(static_cast<size_t>(q.rows * q.dim));
    q.b.resize(static_cast<size_t>(q.rows));
    auto make_sigmoid = [&](auto backend) {
      using B = decltype(backend);
      return xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes>(
          tree, mview(q.w, q.rows, q.dim), q.b.data());
    };
    check_backends_and_threads(make_sigmoid, q, grad_output, 4, "HS huffman sigmoid");
  }
  // fp16 storage on a random runtime tree.
  {
    const auto t = random_parent_tree(rng, 4, 9, 200);
    const auto tree = xsoftmax::runtime_tree<4>::from_parents(t.parent, t.leaf_class, t.num_classes);
    problem p = make_problem(rng, tree.num_rows(), tree.num_classes(), 8, 100, false, 0.05);
    auto wh = convert<__half>(p.w);
    const auto grad_output = random_grad_output(rng, p.batch);
    auto make = [&](auto backend) {
      using B = decltype(backend);
      return xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<4>, xsoftmax::fp16, B>(tree,
                                                                                        mview(wh, p.rows, p.dim));
    };
    check_backends_and_threads(make, p, grad_output, 4, "HS fp16 runtime tree");
  }
}

#endif  // XSOFTMAX_TEST_HOST_BUILD

TEST_CASE_TEMPLATE("equivalence: hierarchical softmax of depth 1 equals full_softmax", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(203);
  for (index_t n : {index_t(2), index_t(33), index_t(64)}) {
    for (bool bias : {false, true}) {
      const xsoftmax::uniform_tree<1, 64> tree(n);
      REQUIRE(tree.num_rows() == n);
      problem p = make_problem(rng, n, n, 10, 40, bias, 0.1);
      xsoftmax::full_softmax<xsoftmax::fp32, B> full(mview(p.w, n, p.dim), bias ? p.b.data() : nullptr);
      full.set_chunk_size(7);
      xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<1, 64>, xsoftmax::fp32, B> hs(
          tree, mview(p.w, n, p.dim), bias ? p.b.data() : nullptr);
      const auto hb = make_hidden<float>(p.h, p.batch, p.dim);
      const auto grad_output = random_grad_output(rng, p.batch);
      for (index_t min_run : {index_t(1), index_t(1) << 40}) {
        hs.set_gemm_min_run(min_run);
        for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
          const std::string what = "N " + std::to_string(n) + (bias ? " bias" : "") + ", gemm_min_run " +
                                   std::to_string(min_run) + ", reduction " + reduction_name(r);
          loss_options opt;
          opt.reduce = r;
          const auto go = r == reduction::none ? grad_output : test_vector<float>{};
          const auto a = run_forward_backward(full, hb, p.targets, opt, go);
          const auto b = run_forward_backward(hs, hb, p.targets, opt, go);
          check_close(b.loss, a.loss, 1e-6, 1e-6, what + ": loss");
          check_close(b.per_sample, a.per_sample, 1e-6, 1e-6, what + ": per-sample");
          check_close(b.grad_hidden, a.grad_hidden, 1e-6, 1e-5, what + ": grad_hidden");
          const auto da = scatter_gradient(a.grad, n, p.dim, bias), db = scatter_gradient(b.grad, n, p.dim, bias);
          CHECK(da.touched == db.touched);  // every row, both heads
          check_close(db.w, da.w, 1e-6, 1e-5, what + ": weight gradient");
          check_close(db.b, da.b, 1e-6, 1e-5, what + ": bias gradient");
        }
      }
      test_vector<float> da(static_cast<size_t>(5 * n)), db(da.size());
      full.log_distribution(cview(p.h, 5, p.dim), 0, n, mview(da, 5, n));
      hs.log_distribution(cview(p.h, 5, p.dim), 0, n, mview(db, 5, n));
      check_close(db, da, 1e-6, 1e-6, "log_distribution");
      const index_t k = std::min<index_t>(n, 4);
      test_vector<index_t> ca(static_cast<size_t>(5 * k)), cb(ca.size());
      test_vector<float> la(ca.size()), lb(ca.size());
      full.topk(cview(p.h, 5, p.dim), k, mview(ca, 5, k), mview(la, 5, k));
      hs.topk(cview(p.h, 5, p.dim), k, mview(cb, 5, k), mview(lb, 5, k));
      CHECK(ca == cb);
      check_close(lb, la, 1e-6, 1e-6, "topk log-probabilities");
    }
  }
}

TEST_CASE_TEMPLATE("equivalence: an HS over a runtime tree shaped like uniform_tree<2, 7> equals the uniform HS", B,
                   XSOFTMAX_TEST_BACKENDS) {
  // uniform_tree<2, 7> over N = 40: root with ceil(40 / 7) = 6 children, child k holding classes
  // [7k, min(7k + 7, 40)). As a parent array (node 0 root, nodes 1..6 inner, then the classes in
  // order) its runtime layout (BFS blocks, children by node index) is the uniform layout.
  const index_t n = 40;
  std::vector<index_t> parent{-1}, leaf_class{-1};  // host-side tree description
  for (index_t k = 0; k < 6; ++k) {
    parent.push_back(0);
    leaf_class.push_back(-1);
  }
  for (index_t c = 0; c < n; ++c) {
    parent.push_back(1 + c / 7);
    leaf_class.push_back(c);
  }
  const auto rt = xsoftmax::runtime_tree<2>::from_parents(parent, leaf_class, n);
  const xsoftmax::uniform_tree<2, 7> ut(n);
  REQUIRE(rt.num_rows() == ut.num_rows());
  for (index_t c = 0; c < n; ++c)
    for (int l = 0; l < 2; ++l) {
      REQUIRE(rt.step(c, l).block_begin == ut.step(c, l).block_begin);
      REQUIRE(rt.step(c, l).child == ut.step(c, l).child);
    }
  test_rng rng(204);
  problem p = make_problem(rng, ut.num_rows(), n, 8, 50, true, 0.1);
  xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<2>, xsoftmax::fp32, B> a(rt, mview(p.w, p.rows, p.dim),
                                                                                p.b.data());
  xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<2, 7>, xsoftmax::fp32, B> b(ut, mview(p.w, p.rows, p.dim),
                                                                                   p.b.data());
  const auto hb = make_hidden<float>(p.h, p.batch, p.dim);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const auto oa = run_forward_backward(a, hb, p.targets, opt);
    const auto ob = run_forward_backward(b, hb, p.targets, opt);
    check_close(oa.per_sample, ob.per_sample, 1e-6, 1e-6, "per-sample");
    check_close(oa.grad_hidden, ob.grad_hidden, 1e-6, 1e-5, "grad_hidden");
    const auto da = scatter_gradient(oa.grad, p.rows, p.dim, true), db = scatter_gradient(ob.grad, p.rows, p.dim, true);
    CHECK(da.touched == db.touched);
    check_close(da.w, db.w, 1e-6, 1e-5, "weight gradient");
  }
}

TEST_CASE_TEMPLATE("equivalence: the HS GEMM path equals the gather-dot path", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(205);
  const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 200), 5);
  using head_t = xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B>;
  problem p = make_problem(rng, tree.num_rows(), 200, 12, 120, true, 0.1);
  head_t gemm(tree, mview(p.w, p.rows, p.dim), p.b.data()), gather = gemm;
  gemm.set_gemm_min_run(1);
  gather.set_gemm_min_run(index_t(1) << 40);
  const auto hb = make_hidden<float>(p.h, p.batch, p.dim);
  loss_options opt;
  const auto a = run_forward_backward(gemm, hb, p.targets, opt), b = run_forward_backward(gather, hb, p.targets, opt);
  check_close(a.per_sample, b.per_sample, 1e-6, 1e-6, "per-sample");
  check_close(a.grad_hidden, b.grad_hidden, 1e-7, 1e-5, "grad_hidden");
  CHECK(a.grad.rows == b.grad.rows);  // same rows in the same order
  check_close(a.grad.values, b.grad.values, 1e-7, 1e-5, "weight gradient");
  check_close(a.grad.bias_values, b.grad.bias_values, 1e-7, 1e-5, "bias gradient");
}
