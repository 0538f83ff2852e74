// SPDX-License-Identifier: Apache-2.0
// The full softmax solved in row blocks (full_softmax::set_row_block, dense_softmax_args::
// row_block): each block of rows is a complete softmax and the weight gradients are added up, so
// every output must match the float64 reference and its finite differences at every block size
// (one row, uneven blocks, all but one row), with and without a score cache holding a block's
// every score, with bias, loss terms, an angular margin and ignored rows; the primitive with
// blocks must agree with the primitive without, within rounding, on gathered columns with logit
// offsets too (the selective softmax's use); forward-only verbs ignore the blocks; the setter's
// contract. Host backends (serial, omp), and cuda in the GPU test binary (tests/cuda/CMakeLists.txt).

#include "support/head_checks.hpp"

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

}  // namespace

TEST_CASE_TEMPLATE("full_softmax row blocks: loss and gradients match the float64 reference and finite differences",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(81);
  const index_t n = 31, d = 6, batch = 13;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);  // about a fifth of the rows ignored
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), bias ? p.b.data() : nullptr);
    head.set_chunk_size(7);
    const auto hb = make_hidden<float>(p.h, batch, d, 3);
    const test_vector<float> up = random_grad_output(rng, batch);
    loss_options mean;
    loss_options terms;
    terms.reduce = reduction::sum;
    terms.label_smoothing = 0.1f;
    terms.z_loss = 1e-3f;
    loss_options none;
    none.reduce = reduction::none;
    for (index_t block : {index_t(1), index_t(4), index_t(batch - 1)}) {
      for (index_t cache : {index_t(0), block * n * index_t(sizeof(float))}) {  // none kept; a block's every score
        head.set_row_block(block);
        head.set_score_cache_bytes(cache);
        const std::string what = std::string(bias ? "bias" : "no bias") + ", row block " + std::to_string(block) +
                                 ", cache " + std::to_string(cache) + " bytes";
        check_gradients(head, full_reference(), p.params(), hb, p.targets, mean, {}, what + ", mean");
        check_gradients(head, smoothed_reference(0.1, 1e-3), p.params(), hb, p.targets, terms, {},
                        what + ", smoothing + z-loss");
        check_gradients(head, full_reference(), p.params(), hb, p.targets, none, up, what + ", per-sample upstream");
        if (!bias) {  // a margin's weight-gradient projection, applied to an accumulated gradient
          // (tests/heads/margin_test.cpp checks the margin against its definition; here blocks
          // against no blocks, within rounding)
          loss_options arc;
          arc.margin = xsoftmax::margin_options::arcface(4.f, 0.2f);
          const auto blocked = run_forward_backward(head, hb, p.targets, arc);
          head.set_row_block(0);
          const auto one = run_forward_backward(head, hb, p.targets, arc);
          check_close(blocked.per_sample, one.per_sample, loss_atol, loss_rtol, what + ", ArcFace: losses");
          check_close(blocked.grad_hidden, one.grad_hidden, grad_atol, grad_rtol, what + ", ArcFace: grad_hidden");
          check_close(scatter_gradient(blocked.grad, n, d, false).w, scatter_gradient(one.grad, n, d, false).w,
                      grad_atol, grad_rtol, what + ", ArcFace: weight gradient");
        }
      }
    }
  }
}

// The primitive itself, as the selective softmax calls it (gathered, non-contiguous columns; logit
// offsets; bias): blocks of 1, 3 and 5 rows against one block, within rounding.
TEST_CASE_TEMPLATE("dense_softmax row blocks: the same results as one block, within rounding", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(82);
  const index_t rows = 11, d = 5, n = 19, chunk = 6, weight_rows = 2 * n;
  const test_vector<float> h = random_floats(rng, rows * d, 1.0);
  const test_vector<float> w = random_floats(rng, weight_rows * d, 1.0);
  const test_vector<float> bias = random_floats(rng, weight_rows, 0.5);
  const test_vector<float> neg = random_floats(rng, n, 0.3), tgt = random_floats(rng, n, 0.3);
  const test_vector<index_t> t = random_targets(rng, rows, n, 0.0);
  const test_vector<float> up = random_grad_output(rng, rows);
  test_vector<index_t> columns(static_cast<size_t>(n));
  for (index_t j = 0; j < n; ++j) columns[static_cast<size_t>(j)] = 2 * j + (j % 3 == 0);  // ascending, gaps
  const xsoftmax::backend_resources<B> res{};
  const xsoftmax::detail::execution<B> ex{res};
  struct outputs {
    test_vector<float> loss, gh, gw, gb;
  };
  for (bool gathered : {false, true}) {
    auto run = [&](index_t block) {
      outputs o{test_vector<float>(static_cast<size_t>(rows), 0.f), test_vector<float>(static_cast<size_t>(rows * d), 0.f),
                test_vector<float>(static_cast<size_t>(n * d), -1.f), test_vector<float>(static_cast<size_t>(n), -1.f)};
      xsoftmax::detail::dense_softmax_args a;
      a.h = xsoftmax::matrix_view<const float>(h.data(), rows, d);
      a.target = t.data();
      a.n = n;
      a.chunk = chunk;
      a.loss = o.loss.data();
      a.upstream = up.data();
      a.grad_h = o.gh.data();
      a.grad_w = o.gw.data();
      a.grad_b = o.gb.data();
      a.columns = gathered ? columns.data() : nullptr;
      a.negative_offset = neg.data();
      a.target_offset = tgt.data();
      a.label_smoothing = 0.05f;
      a.row_block = block;
      a.score_cache_bytes = block * chunk * index_t(sizeof(float));  // one chunk of each block kept
      xsoftmax::detail::dense_softmax_generic(ex, xsoftmax::matrix_view<const float>(w.data(), weight_rows, d),
                                              bias.data(), a);
      // The primitive only queues its work on the backend's stream (the heads wait at the end of
      // a verb); on cuda the outputs are read here only after that work is done.
      xsoftmax::detail::backend_ops<B>::synchronize(res);
      return o;
    };
    const outputs one = run(0);
    for (index_t block : {index_t(1), index_t(3), index_t(5)}) {
      const outputs blocked = run(block);
      const std::string what = std::string(gathered ? "gathered" : "contiguous") + " columns, row block " +
                               std::to_string(block);
      check_close(blocked.loss, one.loss, 1e-6, 1e-6, what + ": losses");
      check_close(blocked.gh, one.gh, 1e-6, 1e-5, what + ": grad_h");
      check_close(blocked.gw, one.gw, 1e-6, 1e-5, what + ": grad_w (overwritten by the first block, then added to)");
      check_close(blocked.gb, one.gb, 1e-6, 1e-5, what + ": grad_b");
    }
  }
}

TEST_CASE_TEMPLATE("full_softmax row blocks: forward-only verbs give what they give without blocks", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(83);
  const index_t n = 23, d = 5, batch = 9;
  problem p = make_problem(rng, n, n, d, batch, true, 0.0);
  xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), p.b.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> per0(static_cast<size_t>(batch)), per1(static_cast<size_t>(batch));
  const float l0 = head.forward(hb.view(), cvec(p.targets), {}, mvec(per0));
  head.set_row_block(2);
  const float l1 = head.forward(hb.view(), cvec(p.targets), {}, mvec(per1));
  CHECK(bitwise_equal(&l0, &l1, 1));
  CHECK(bitwise_equal(per0, per1));
}

TEST_CASE("full_softmax::set_row_block: default 0, round trip, negative rejected naming the value") {
  xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> head(10, 4);
  CHECK(head.row_block() == 0);
  head.set_row_block(256);
  CHECK(head.row_block() == 256);
  try {
    head.set_row_block(-3);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("rows = -3") != std::string::npos);
  }
  CHECK(head.row_block() == 256);  // unchanged after the error
}

TEST_CASE("full_softmax::keep_scores_in_row_blocks: the row block and a cache of its every score; errors change nothing") {
  xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> head(10, 4);
  head.keep_scores_in_row_blocks(3);
  CHECK(head.row_block() == 3);
  CHECK(head.score_cache_bytes() == 3 * 10 * 4);
  head.keep_scores_in_row_blocks(0);  // one block, nothing kept
  CHECK(head.row_block() == 0);
  CHECK(head.score_cache_bytes() == 0);
  head.keep_scores_in_row_blocks(5);
  try {
    head.keep_scores_in_row_blocks(-1);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("rows = -1") != std::string::npos);
  }
  CHECK(head.row_block() == 5);
  CHECK(head.score_cache_bytes() == 5 * 10 * 4);
}
