// SPDX-License-Identifier: Apache-2.0
// The full softmax's training verbs into a dense weight gradient (`dense_gradient<G>`): with G =
// float the gradient, loss, per-sample losses and grad_hidden are bitwise the sparse-gradient
// verbs' (which the float64 reference and finite-difference tests check), on fp32 and bf16 heads,
// with a bias, ignored rows, chunks, row blocks with and without a score cache, every reduction and
// an upstream gradient, blocking and `_async`; with G = bf16 the gradient is the fp32 one rounded
// once (one block: bitwise on the host, within one rounding on a device, whose GEMM rounds
// itself) or once per block (row blocks: within a rounding per block); every sample ignored gives
// zeros; a wrong shape, stride, bias or null pointer throws naming it, and writes nothing. Host
// backends (serial, omp), and cuda in the GPU test binary (tests/cuda/CMakeLists.txt).

#include "support/check_throws.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
template <class G>
using dense_out = xsoftmax::dense_gradient<G>;  // (xsoftmax_test has a dense_gradient of its own)
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;
using bf16_t = xsoftmax::bf16::storage_type;

/// `v` rounded to bf16, and widened back to float (what a bf16 head holds, as floats).
test_vector<bf16_t> to_bf16(const test_vector<float>& v) {
  test_vector<bf16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = xsoftmax::from_float<bf16_t>(v[i]);
  return out;
}
test_vector<float> widened(const test_vector<bf16_t>& v) {
  test_vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = xsoftmax::to_float(v[i]);
  return out;
}

/// A backend vector's values in a test_vector.
template <class V>
test_vector<float> host_copy(const V& v) {
  const auto h = on_host(v);
  return test_vector<float>(h.begin(), h.end());
}

/// A head's sparse gradient (every class, in order) as a dense num_classes x d matrix on the host.
template <class Gradient>
test_vector<float> dense_values(const Gradient& g, index_t n, index_t d) {
  test_vector<float> out(static_cast<std::size_t>(n * d), 0.f);
  const auto rows = on_host(g.rows);
  const auto values = on_host(g.values);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(i) * d, d,
                out.begin() + static_cast<std::ptrdiff_t>(rows[i]) * d);
  return out;
}

/// What the four dense verbs give for one configuration (the blocking forward_backward's outputs;
/// the others are checked equal to them).
template <class G>
struct dense_run {
  float loss = 0;
  test_vector<float> per_sample, grad_hidden, bias;
  test_vector<G> weights;
};

template <class G, class Head, class H>
dense_run<G> run_dense(const Head& head, const hidden_batch<H>& hb, const test_vector<index_t>& targets,
                       const loss_options& opt, const test_vector<float>& up, const std::string& what) {
  const index_t n = head.num_classes(), d = head.dim(), rows = hb.rows;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dense_run<G> r;
  r.per_sample.assign(static_cast<std::size_t>(rows), nan);
  r.grad_hidden.assign(static_cast<std::size_t>(rows * d), nan);
  r.weights.assign(static_cast<std::size_t>(n * d), xsoftmax::from_float<G>(nan));
  r.bias.assign(head.has_bias() ? static_cast<std::size_t>(n) : 0, nan);
  r.loss = head.forward_backward(hb.view(), cvec(targets), mview(r.grad_hidden, rows, d),
                                 dense_out<G>{mview(r.weights, n, d), mvec(r.bias)}, opt, mvec(r.per_sample),
                                 cvec(up));
  // backward, forward_backward_async and backward_async write the same bits.
  for (int verb = 0; verb < 3; ++verb) {
    test_vector<float> gh(r.grad_hidden.size(), nan), b(r.bias.size(), nan), loss(1, nan), per(r.per_sample.size(), nan);
    test_vector<G> w(r.weights.size(), xsoftmax::from_float<G>(nan));
    const dense_out<G> g{mview(w, n, d), mvec(b)};
    if (verb == 0) {
      head.backward(hb.view(), cvec(targets), mview(gh, rows, d), g, opt, cvec(up));
    } else if (verb == 1) {
      head.forward_backward_async(hb.view(), cvec(targets), mview(gh, rows, d), g, mvec(loss), opt, mvec(per),
                                  cvec(up));
    } else {
      head.backward_async(hb.view(), cvec(targets), mview(gh, rows, d), g, opt, cvec(up));
    }
    xsoftmax::detail::backend_ops<typename Head::backend_type>::synchronize(head.resources());  // cuda: the queue
    const std::string verb_name = verb == 0 ? "backward" : verb == 1 ? "forward_backward_async" : "backward_async";
    CHECK_MESSAGE(bitwise_equal(gh, r.grad_hidden), what, ": ", verb_name, "'s grad_hidden");
    CHECK_MESSAGE(bitwise_equal(w, r.weights), what, ": ", verb_name, "'s weight gradient");
    CHECK_MESSAGE(bitwise_equal(b, r.bias), what, ": ", verb_name, "'s bias gradient");
    if (verb == 1) {
      CHECK_MESSAGE(bitwise_equal(loss.data(), &r.loss, 1), what, ": forward_backward_async's loss");
      CHECK_MESSAGE(bitwise_equal(per, r.per_sample), what, ": forward_backward_async's per-sample losses");
    }
  }
  return r;
}

/// The configurations: one block, then row blocks without and with a block's every score kept;
/// `f(name, block)` (block 0: one block).
template <class Head>
void for_each_layout(Head& head, index_t batch, const std::function<void(const std::string&, index_t)>& f) {
  head.use_automatic_plan();
  head.set_chunk_size(7);
  f("one block", 0);
  for (index_t block : {index_t(4), batch - 1}) {
    head.set_row_block(block);
    head.set_score_cache_bytes(0);
    f("row block " + std::to_string(block) + ", nothing kept", block);
    head.keep_scores_in_row_blocks(block);
    f("row block " + std::to_string(block) + ", every score kept", block);
  }
  head.use_automatic_plan();
}

/// For the mean loss of weights `w` (n x d, bias `b` or empty) over the rows of `h` whose target is
/// not ignored, solved in blocks of `block` such rows (0: one block): per weight-gradient entry,
/// the sum over blocks of |the gradient summed up to that block| (float64). A gradient stored in a
/// type of unit roundoff u after each block is within u times this of the exact one.
test_vector<double> block_rounding_bound(const test_vector<float>& w, const test_vector<float>& b,
                                         const test_vector<float>& h, const test_vector<index_t>& targets, index_t n,
                                         index_t d, index_t block) {
  std::vector<index_t> kept;
  for (index_t r = 0; r < static_cast<index_t>(targets.size()); ++r)
    if (targets[static_cast<std::size_t>(r)] >= 0) kept.push_back(r);
  const index_t rows = static_cast<index_t>(kept.size());
  if (block <= 0 || block > rows) block = rows;
  const double u = 1.0 / static_cast<double>(rows);
  std::vector<double> sum(static_cast<std::size_t>(n * d), 0.0), scores(static_cast<std::size_t>(n));
  test_vector<double> bound(sum.size(), 0.0);
  for (index_t k = 0; k < rows; ++k) {
    const index_t r = kept[static_cast<std::size_t>(k)];
    const float* hr = h.data() + r * d;
    double mx = -INFINITY, z = 0.0;
    for (index_t c = 0; c < n; ++c) {
      double s = b.empty() ? 0.0 : b[static_cast<std::size_t>(c)];
      for (index_t j = 0; j < d; ++j) s += static_cast<double>(hr[j]) * w[static_cast<std::size_t>(c * d + j)];
      scores[static_cast<std::size_t>(c)] = s;
      mx = std::max(mx, s);
    }
    for (double s : scores) z += std::exp(s - mx);
    for (index_t c = 0; c < n; ++c) {
      const double g = u * (std::exp(scores[static_cast<std::size_t>(c)] - mx) / z -
                            (targets[static_cast<std::size_t>(r)] == c ? 1.0 : 0.0));
      for (index_t j = 0; j < d; ++j) sum[static_cast<std::size_t>(c * d + j)] += g * hr[j];
    }
    if ((k + 1) % block == 0 || k + 1 == rows)
      for (std::size_t i = 0; i < sum.size(); ++i) bound[i] += std::fabs(sum[i]);
  }
  return bound;
}

}  // namespace

TEST_CASE_TEMPLATE("full_softmax dense gradient: float is bitwise the sparse gradient, every verb and layout", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(91);
  // 70 rows over 40 classes of 6: the host backends' exponential form of the backward (>= 64 rows,
  // >= 4 d classes); 13 rows: the plain one.
  for (const auto& size : {std::array<index_t, 3>{29, 6, 13}, std::array<index_t, 3>{40, 6, 70}})
  for (bool bias : {false, true}) {
    const index_t n = size[0], d = size[1], batch = size[2];
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    const auto hb = make_hidden<float>(p.h, batch, d, 2);
    const test_vector<float> up = random_grad_output(rng, batch);
    // fp32 weights, and the same values stored in bf16 (a bf16 head's float gradient).
    test_vector<bf16_t> w16 = to_bf16(p.w), b16 = to_bf16(p.b);
    xsoftmax::full_softmax<xsoftmax::fp32, B> head32(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    xsoftmax::full_softmax<xsoftmax::bf16, B> head16(mview(w16, n, d), bias ? b16.data() : nullptr);
    for (reduction red : {reduction::mean, reduction::sum, reduction::none}) {
      loss_options opt;
      opt.reduce = red;
      const test_vector<float> upstream = red == reduction::none ? up : test_vector<float>{};
      const auto check = [&](auto& head, const char* kind) {
        for_each_layout(head, batch, [&](const std::string& layout, index_t) {
          const std::string what = std::string(kind) + (bias ? ", bias, " : ", no bias, ") + reduction_name(red) +
                                   ", " + layout;
          const auto sparse = run_forward_backward(head, hb, p.targets, opt, upstream);
          const auto dense = run_dense<float>(head, hb, p.targets, opt, upstream, what);
          CHECK_MESSAGE(bitwise_equal(&dense.loss, &sparse.loss, 1), what, ": loss ", dense.loss, " vs ", sparse.loss);
          CHECK_MESSAGE(bitwise_equal(dense.per_sample, sparse.per_sample), what, ": per-sample losses");
          CHECK_MESSAGE(bitwise_equal(dense.grad_hidden, sparse.grad_hidden), what, ": grad_hidden");
          CHECK_MESSAGE(bitwise_equal(dense.weights, dense_values(sparse.grad, n, d)), what, ": weight gradient");
          CHECK_MESSAGE(bitwise_equal(dense.bias, host_copy(sparse.grad.bias_values)), what, ": bias gradient");
        });
      };
      check(head32, "fp32 weights");
      check(head16, "bf16 weights");
    }
  }
}

TEST_CASE_TEMPLATE("full_softmax dense gradient: bf16 is the fp32 gradient rounded once per row block", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(92);
  for (const auto& size : {std::array<index_t, 3>{37, 8, 15}, std::array<index_t, 3>{40, 6, 70}})
  for (bool bias : {false, true}) {
    const index_t n = size[0], d = size[1], batch = size[2];
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    test_vector<bf16_t> w16 = to_bf16(p.w), b16 = to_bf16(p.b);
    xsoftmax::full_softmax<xsoftmax::bf16, B> head(mview(w16, n, d), bias ? b16.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d);
    // The weights as the head holds them (rounded to bf16), for the rounding bound.
    const test_vector<float> w_held = widened(w16), b_held = widened(b16);
    for_each_layout(head, batch, [&](const std::string& layout, index_t block) {
      const std::string what = std::string(bias ? "bias, " : "no bias, ") + layout;
      const loss_options opt;
      const auto sparse = run_forward_backward(head, hb, p.targets, opt);
      const auto dense = run_dense<bf16_t>(head, hb, p.targets, opt, {}, what);
      CHECK_MESSAGE(bitwise_equal(&dense.loss, &sparse.loss, 1), what, ": loss");
      CHECK_MESSAGE(bitwise_equal(dense.grad_hidden, sparse.grad_hidden), what, ": grad_hidden");
      CHECK_MESSAGE(bitwise_equal(dense.bias, host_copy(sparse.grad.bias_values)), what, ": bias gradient");
      // One block on the host: the fp32 value the sparse verb gives, rounded once (the generic
      // kernels round that very value). Otherwise within bf16's unit roundoff (2^-8) of each block's
      // running sum (a device GEMM rounds its own accumulator), plus fp32's share.
      const test_vector<float> exact = dense_values(sparse.grad, n, d);
      const bool bitwise = block == 0 && xsoftmax::is_host_backend<B>;
      const test_vector<double> bound = block_rounding_bound(w_held, b_held, p.h, p.targets, n, d, block);
      int bad = 0;
      for (std::size_t i = 0; i < exact.size(); ++i) {
        const float got = xsoftmax::to_float(dense.weights[i]);
        const float rounded = xsoftmax::to_float(xsoftmax::from_float<bf16_t>(exact[i]));
        const bool ok = bitwise ? bitwise_equal(&got, &rounded, 1)
                                : std::fabs(got - exact[i]) <= 0x1p-8 * bound[i] * 1.01 + 1e-6 * std::fabs(exact[i]);
        if (!ok && bad++ < 5)
          FAIL_CHECK(what, ": weight gradient entry ", i, " = ", got, ", fp32 ", exact[i], " (rounded ", rounded,
                     ", bound ", 0x1p-8 * bound[i], ")");
      }
      CHECK_MESSAGE(bad == 0, what, ": ", bad, " weight-gradient entries off");
    });
  }
}

TEST_CASE_TEMPLATE("full_softmax dense gradient: every sample ignored gives zeros", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(93);
  const index_t n = 11, d = 4, batch = 5;
  problem p = make_problem(rng, n, n, d, batch, true);
  std::fill(p.targets.begin(), p.targets.end(), index_t(-100));
  test_vector<bf16_t> w16 = to_bf16(p.w), b16 = to_bf16(p.b);
  xsoftmax::full_softmax<xsoftmax::bf16, B> head(mview(w16, n, d), b16.data());
  const auto hb = make_hidden<float>(p.h, batch, d);
  const auto f = run_dense<float>(head, hb, p.targets, {}, {}, "float");
  const auto h = run_dense<bf16_t>(head, hb, p.targets, {}, {}, "bf16");
  CHECK(f.loss == 0.f);
  CHECK(std::all_of(f.weights.begin(), f.weights.end(), [](float v) { return v == 0.f; }));
  CHECK(std::all_of(f.bias.begin(), f.bias.end(), [](float v) { return v == 0.f; }));
  CHECK(std::all_of(h.weights.begin(), h.weights.end(), [](bf16_t v) { return xsoftmax::to_float(v) == 0.f; }));
  CHECK(std::all_of(h.bias.begin(), h.bias.end(), [](float v) { return v == 0.f; }));
  CHECK(std::all_of(f.grad_hidden.begin(), f.grad_hidden.end(), [](float v) { return v == 0.f; }));
}

TEST_CASE_TEMPLATE("full_softmax dense gradient: a wrong shape, stride, bias or pointer throws and writes nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(94);
  const index_t n = 9, d = 4, batch = 3;
  problem p = make_problem(rng, n, n, d, batch, true);
  xsoftmax::full_softmax<xsoftmax::fp32, B> with_bias(mview(p.w, n, d), p.b.data());
  xsoftmax::full_softmax<xsoftmax::fp32, B> no_bias(mview(p.w, n, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> gh(static_cast<std::size_t>(batch * d), 7.f), w(static_cast<std::size_t>(n * (d + 1)), 7.f),
      b(static_cast<std::size_t>(n + 1), 7.f);
  const auto step = [&](const auto& head, dense_out<float> g) {
    (void)head.forward_backward(hb.view(), cvec(p.targets), mview(gh, batch, d), g);
  };
  const xsoftmax::vector_view<float> bias_n(b.data(), n);
  check_throws<xsoftmax::shape_error>([&] { step(with_bias, {mview(w, n - 1, d), bias_n}); },
                                      {"full_softmax::forward_backward", "grad_weights.weights is 8 x 4, expected 9 x 4"});
  check_throws<xsoftmax::shape_error>([&] { step(with_bias, {mview(w, n, d - 1), bias_n}); },
                                      {"grad_weights.weights is 9 x 3, expected 9 x 4"});
  check_throws<xsoftmax::shape_error>([&] { step(with_bias, {mview(w, n, d, d + 1), bias_n}); },
                                      {"grad_weights.weights.stride = 5 must be dim = 4"});
  check_throws<xsoftmax::shape_error>([&] { step(with_bias, {mview(w, n, d), {}}); },
                                      {"grad_weights.bias has 0 entries, expected 9"});
  check_throws<xsoftmax::shape_error>([&] { step(no_bias, {mview(w, n, d), bias_n}); },
                                      {"grad_weights.bias has 9 entries, expected 0"});
  check_throws<xsoftmax::invalid_argument>(
      [&] { step(with_bias, {xsoftmax::matrix_view<float>(nullptr, n, d), bias_n}); },
      {"grad_weights.weights.data is null"});
  check_throws<xsoftmax::invalid_argument>(
      [&] { step(with_bias, {mview(w, n, d), xsoftmax::vector_view<float>(nullptr, n)}); },
      {"grad_weights.bias.data is null"});
  CHECK(std::all_of(gh.begin(), gh.end(), [](float v) { return v == 7.f; }));
  CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v == 7.f; }));
  CHECK(std::all_of(b.begin(), b.end(), [](float v) { return v == 7.f; }));
}
