// SPDX-License-Identifier: Apache-2.0
// The full softmax's score cache (full_softmax::set_score_cache_bytes, dense_softmax_args::
// score_cache_bytes): the backward pass takes the kept chunks' first-pass scores instead of
// recomputing them, so every output must be bitwise that of no cache, at a budget that holds no
// chunk, some chunks and all of them; kept chunks must really not be recomputed (a probe that
// changes the weights between the two passes sees which chunks were); the setter's contract.
// Host backends (serial, omp).

#include "support/head_checks.hpp"

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

/// Budgets for `rows` packed rows and chunks of `chunk` columns over n classes: none, two full
/// chunks exactly, two and a half (still two kept), every chunk.
std::vector<index_t> budgets(index_t rows, index_t chunk) {
  const index_t one = rows * chunk * index_t(sizeof(float));
  return {0, 2 * one, 2 * one + one / 2, index_t(1) << 40};
}

index_t counted_rows(const test_vector<index_t>& targets, index_t ignore_index) {
  index_t r = 0;
  for (index_t t : targets) r += t != ignore_index;
  return r;
}

/// forward_backward (mean) and backward (none, per-sample upstream) at each budget against budget 0.
template <class Head>
void check_budgets(Head& head, const hidden_batch<float>& hb, const test_vector<index_t>& targets, loss_options opt,
                   const test_vector<float>& grad_output, index_t chunk, const std::string& what) {
  head.set_chunk_size(chunk);
  const index_t rows = counted_rows(targets, opt.ignore_index);
  loss_options none = opt;
  none.reduce = reduction::none;
  auto backward = [&](test_vector<float>& gh, typename Head::gradient_type& g) {
    gh.assign(static_cast<size_t>(hb.rows * hb.dim), 0.f);
    head.backward(hb.view(), cvec(targets), mview(gh, hb.rows, hb.dim), g, none, cvec(grad_output));
  };
  head.set_score_cache_bytes(0);
  const auto base = run_forward_backward(head, hb, targets, opt);
  test_vector<float> base_gh;
  typename Head::gradient_type base_g;
  backward(base_gh, base_g);
  for (index_t bytes : budgets(rows, chunk)) {
    INFO(what, ", chunk ", chunk, ", budget ", bytes, " bytes");
    head.set_score_cache_bytes(bytes);
    CHECK(same_outputs(run_forward_backward(head, hb, targets, opt), base));
    test_vector<float> gh;
    typename Head::gradient_type g;
    backward(gh, g);
    CHECK(bitwise_equal(gh, base_gh));
    CHECK(same_gradient(g, base_g));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("full_softmax score cache: bitwise the same results at every budget (loss terms, margin, bf16)",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(71);
  // 17 rows; then 96 (about 77 counted), enough for the host's exponential form of the plain loss's
  // backward (dense_softmax.hpp: rows >= 64, n >= 4 d), whose kept and recomputed chunks must agree
  // to the bit as well.
  const index_t n = 53, d = 8;
  for (index_t batch : {index_t(17), index_t(96)})
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    const test_vector<float> up = random_grad_output(rng, batch);
    loss_options plain;
    loss_options terms;
    terms.label_smoothing = 0.1f;
    terms.z_loss = 1e-3f;
    const std::string b = std::string(bias ? "bias" : "no bias") + ", batch " + std::to_string(batch);
    for (index_t chunk : {index_t(7), index_t(13)}) {  // 8 chunks (last of 4), 5 chunks (last of 1)
      check_budgets(head, hb, p.targets, plain, up, chunk, "fp32, " + b);
      check_budgets(head, hb, p.targets, terms, up, chunk, "fp32, label smoothing + z-loss, " + b);
      if (!bias) {
        loss_options arc;
        arc.margin = xsoftmax::margin_options::arcface(12.f);
        check_budgets(head, hb, p.targets, arc, up, chunk, "fp32, ArcFace");
      }
    }
    // bf16 storage: the kept chunks' backward GEMMs read the same widened rows.
    xsoftmax::full_softmax<xsoftmax::bf16, B> h16(n, d, bias, xsoftmax::init_options{5, 0.5f, false});
    check_budgets(h16, hb, p.targets, plain, up, 7, "bf16, " + b);
  }
}

TEST_CASE_TEMPLATE("full_softmax score cache: gradients at a budget holding every score match finite differences", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(72);
  const index_t n = 29, d = 6;
  for (index_t batch : {index_t(11), index_t(80)}) {  // 80: the host's exponential form (rows >= 64)
    problem p = make_problem(rng, n, n, d, batch, true, 0.1);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head(mview(p.w, p.rows, p.dim), p.b.data());
    head.set_chunk_size(5);
    head.set_score_cache_bytes(index_t(1) << 30);
    const auto hb = make_hidden<float>(p.h, batch, d, 2);
    loss_options opt;
    opt.reduce = reduction::sum;
    check_gradients(head, full_reference(), p.params(), hb, p.targets, opt, {},
                    "all scores kept, batch " + std::to_string(batch));
  }
}

// The probe: combine_rows runs between the passes; it changes the weights, so a recomputed chunk's
// gradient differs from a kept one's. With k chunks kept, chunk c's weight-gradient rows must equal
// those of the all-kept run for c < k and those of the none-kept run otherwise (a chunk's weight
// gradient depends on its own scores only). Contiguous classes and gathered (non-contiguous) ones.
TEST_CASE_TEMPLATE("dense_softmax score cache: kept chunks are taken from the cache, the rest recomputed", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(73);
  const index_t rows = 6, d = 5, n = 23, chunk = 4, weight_rows = 2 * n;  // 6 chunks, the last of 3
  const test_vector<float> h = random_floats(rng, rows * d, 1.0);
  const test_vector<float> w0 = random_floats(rng, weight_rows * d, 1.0);
  test_vector<index_t> t = random_targets(rng, rows, n, 0.0);
  test_vector<index_t> columns(static_cast<size_t>(n));
  for (index_t j = 0; j < n; ++j) columns[static_cast<size_t>(j)] = 2 * j + (j % 3 == 0);  // ascending, gaps
  const test_vector<float> up(static_cast<size_t>(rows), 1.f);
  const xsoftmax::backend_resources<B> res{};
  const xsoftmax::detail::execution<B> ex{res};
  const index_t one = rows * chunk * index_t(sizeof(float));
  for (bool gathered : {false, true}) {
    auto run = [&](index_t bytes) {
      test_vector<float> w = w0, loss(static_cast<size_t>(rows), 0.f), gh(static_cast<size_t>(rows * d), 0.f);
      test_vector<float> gw(static_cast<size_t>(n * d), 0.f);
      xsoftmax::detail::dense_softmax_args a;
      a.h = xsoftmax::matrix_view<const float>(h.data(), rows, d);
      a.target = t.data();
      a.n = n;
      a.chunk = chunk;
      a.loss = loss.data();
      a.upstream = up.data();
      a.grad_h = gh.data();
      a.grad_w = gw.data();
      a.columns = gathered ? columns.data() : nullptr;
      a.score_cache_bytes = bytes;
      a.combine_rows = [&](const xsoftmax::detail::dense_row_statistics&) {
        for (auto& x : w) x = 0.5f * x + 0.25f;
      };
      xsoftmax::detail::dense_softmax_generic(ex, xsoftmax::matrix_view<const float>(w.data(), weight_rows, d),
                                              static_cast<const float*>(nullptr), a);
      return gw;
    };
    const test_vector<float> none = run(0), all = run(index_t(1) << 30);
    for (index_t kept : {index_t(1), index_t(3)}) {
      const test_vector<float> some = run(kept * one + one / 3);
      for (index_t c = 0; c * chunk < n; ++c) {
        INFO("gathered ", gathered, ", ", kept, " chunks kept, chunk ", c);
        const index_t r0 = c * chunk * d, len = std::min(chunk, n - c * chunk) * d;
        const test_vector<float>& expected = c < kept ? all : none;
        CHECK(bitwise_equal(some.data() + r0, expected.data() + r0, static_cast<size_t>(len)));
        // and the probe is able to tell: kept and recomputed differ
        CHECK_FALSE(bitwise_equal(all.data() + r0, none.data() + r0, static_cast<size_t>(len)));
      }
    }
  }
}

TEST_CASE("full_softmax::set_score_cache_bytes: default, round trip, negative rejected naming the value") {
  xsoftmax::full_softmax<xsoftmax::fp32, xsoftmax::serial> head(10, 4);
  CHECK(head.score_cache_bytes() == head.default_score_cache_bytes);
  head.set_score_cache_bytes(0);
  CHECK(head.score_cache_bytes() == 0);
  head.set_score_cache_bytes(12345);
  CHECK(head.score_cache_bytes() == 12345);
  try {
    head.set_score_cache_bytes(-1);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("bytes = -1") != std::string::npos);
  }
  CHECK(head.score_cache_bytes() == 12345);  // unchanged after the error
}
