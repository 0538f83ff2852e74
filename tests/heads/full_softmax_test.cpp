// SPDX-License-Identifier: Apache-2.0
// full_softmax against its float64 reference on small random problems: every reduction, ignore
// indices, bias or not, hidden as float / double / bf16, chunk sizes that do not divide N, owned
// weights and views; gradients against central finite differences; log_prob, log_distribution,
// topk and apply_sgd. One source, instantiated for the serial and omp backends.

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

constexpr reduction all_reductions[] = {reduction::none, reduction::mean, reduction::sum};

template <class B>
using fs32 = xsoftmax::full_softmax<xsoftmax::fp32, B>;

/// A view head over the problem's weights (kept alive by the problem).
template <class B>
fs32<B> view_head(problem& p) {
  return fs32<B>(mview(p.w, p.rows, p.dim), p.has_bias() ? p.b.data() : nullptr);
}

}  // namespace

TEST_CASE_TEMPLATE("full_softmax: forward matches the float64 reference (reductions, ignore, bias, chunks)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(11);
  const index_t n = 53, d = 8, batch = 17;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    p.targets[3] = -100;  // at least one ignored sample
    p.targets[4] = 0;     // and the first and last class
    p.targets[5] = n - 1;
    auto head = view_head<B>(p);
    const auto hb = make_hidden<float>(p.h, batch, d, 3);  // strided hidden rows
    // 0 (automatic), 53 (= N) and 1000 (> N) all mean one chunk; 1, 7 and 13 leave a ragged last one.
    for (index_t chunk : {index_t(0), index_t(1), index_t(7), index_t(13), index_t(1000)}) {
      // One class per chunk is ~50 parallel regions per call: serial only (slow under a loaded OpenMP).
      if (chunk == 1 && std::is_same_v<B, xsoftmax::omp>) continue;
      head.set_chunk_size(chunk);
      for (reduction r : all_reductions) {
        loss_options opt;
        opt.reduce = r;
        check_forward(head, full_reference(), p.params(), hb, p.targets, opt,
                      std::string("bias ") + (bias ? "yes" : "no") + ", chunk " + std::to_string(chunk) +
                          ", reduction " + reduction_name(r));
      }
    }
    // A custom ignore_index that is a valid class: samples with that target are skipped.
    auto targets = p.targets;
    for (auto& t : targets) t = t < 0 ? 7 : t;
    targets[0] = targets[6] = 7;
    loss_options opt;
    opt.ignore_index = 7;
    check_forward(head, full_reference(), p.params(), hb, targets, opt, "ignore_index = a valid class");
  }
}

TEST_CASE_TEMPLATE("full_softmax: hidden given as float, double and bf16", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(12);
  const index_t n = 40, d = 12, batch = 9;
  problem p = make_problem(rng, n, n, d, batch, true, 0.1);
  auto head = view_head<B>(p);
  head.set_chunk_size(9);
  loss_options opt;
  opt.reduce = reduction::sum;
  // double hidden values that fp32 cannot represent: the head must read them as doubles.
  auto hd = make_hidden<double>(p.h, batch, d);
  for (auto& x : hd.storage) x += 1e-9 * std::sin(x * 1e3);
  check_forward(head, full_reference(), p.params(), hd, p.targets, opt, "double hidden");
  check_forward(head, full_reference(), p.params(), make_hidden<float>(p.h, batch, d), p.targets, opt, "float hidden");
  check_forward(head, full_reference(), p.params(), make_hidden<__nv_bfloat16>(p.h, batch, d, 1), p.targets, opt,
                "bf16 hidden");
  check_forward(head, full_reference(), p.params(), make_hidden<__half>(p.h, batch, d), p.targets, opt, "fp16 hidden");
}

TEST_CASE_TEMPLATE("full_softmax: owned weights and non-owning views agree", B, XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 31, d = 10, batch = 8;
  xsoftmax::init_options init;
  init.seed = 5;
  fs32<B> owned(n, d, true, init);
  CHECK(owned.num_classes() == n);
  CHECK(owned.dim() == d);
  CHECK(owned.has_bias());
  // Default init: uniform in [-1/sqrt(dim), 1/sqrt(dim)], zero bias, not all equal.
  const auto w = dense_copy(xsoftmax::matrix_view<const float>(owned.weights()));
  const float bound = 1.f / std::sqrt(static_cast<float>(d));
  CHECK(std::all_of(w.begin(), w.end(), [&](float x) { return std::abs(x) <= bound; }));
  CHECK(*std::max_element(w.begin(), w.end()) - *std::min_element(w.begin(), w.end()) > bound);
  const auto b0 = read_back(owned.bias(), n);
  CHECK(std::all_of(b0.begin(), b0.end(), [](float x) { return x == 0.f; }));
  // Same seed, same weights; zero init gives zeros.
  fs32<B> same(n, d, true, init);
  CHECK(bitwise_equal(w, dense_copy(xsoftmax::matrix_view<const float>(same.weights()))));
  xsoftmax::init_options zero;
  zero.zero = true;
  fs32<B> zeros(n, d, false, zero);
  const auto wz = dense_copy(xsoftmax::matrix_view<const float>(zeros.weights()));
  CHECK(std::all_of(wz.begin(), wz.end(), [](float x) { return x == 0.f; }));
  CHECK_FALSE(zeros.has_bias());

  // Give the owned head a non-zero bias, then view the same values through a strided caller buffer.
  test_rng rng(13);
  test_vector<float> new_bias(static_cast<size_t>(n));
  for (auto& x : new_bias) x = static_cast<float>(rng.uniform(-1, 1));
  write_into(owned.bias(), new_bias);
  const index_t stride = d + 5;
  test_vector<float> buffer(static_cast<size_t>(n * stride), std::numeric_limits<float>::quiet_NaN());
  test_vector<float> bias = read_back(owned.bias(), n);
  for (index_t c = 0; c < n; ++c)
    for (index_t j = 0; j < d; ++j) buffer[static_cast<size_t>(c * stride + j)] = w[static_cast<size_t>(c * d + j)];
  fs32<B> view(mview(buffer, n, d, stride), bias.data());
  CHECK(view.weights().data == buffer.data());  // no copy
  CHECK(view.bias() == bias.data());

  ref_params params;
  params.rows = n;
  params.dim = d;
  params.w = to_doubles(w);
  params.b = to_doubles(bias);
  const auto h = random_floats(rng, batch * d, 1.0);
  const auto hb = make_hidden<float>(h, batch, d);
  const auto targets = random_targets(rng, batch, n);
  for (reduction r : all_reductions) {
    loss_options opt;
    opt.reduce = r;
    check_forward(owned, full_reference(), params, hb, targets, opt, "owned");
    check_forward(view, full_reference(), params, hb, targets, opt, "strided view");
    const auto a = run_forward_backward(owned, hb, targets, opt);
    const auto v = run_forward_backward(view, hb, targets, opt);
    CHECK(a.loss == doctest::Approx(v.loss).epsilon(1e-6));
    check_close(v.grad_hidden, a.grad_hidden, 1e-6, 1e-5, "view vs owned grad_hidden");
    check_close(v.grad.values, a.grad.values, 1e-6, 1e-5, "view vs owned weight gradient");
  }
  // A copy of an owning head owns its own weights; a copy of a view head still views the buffer.
  fs32<B> owned_copy = owned;
  CHECK(owned_copy.weights().data != owned.weights().data);
  write_into(owned_copy.weights().data, test_vector<float>{w[0] + 1.f});
  CHECK(read_back(owned.weights().data, 1)[0] == w[0]);
  CHECK(read_back(owned_copy.weights().data, 1)[0] == w[0] + 1.f);
  fs32<B> view_copy = view;
  CHECK(view_copy.weights().data == buffer.data());
}

TEST_CASE_TEMPLATE("owned weights are initial_weight(seed, element): uniform, seeded, the same on every backend", B,
                   XSOFTMAX_TEST_BACKENDS) {
  // The contract every backend's constructor keeps (the GPU tests compare the cuda head with serial).
  const index_t n = 257, d = 48;
  const xsoftmax::full_softmax<xsoftmax::bf16, B> head(n, d, false, xsoftmax::init_options{11});
  const auto w = read_back(head.weights().data, n * d);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (index_t e = 0; e < n * d; ++e) {
    const float want = xsoftmax::to_float(xsoftmax::from_float<__nv_bfloat16>(
        xsoftmax::detail::initial_weight(11, static_cast<unsigned long long>(e), scale)));
    const float got = xsoftmax::to_float(w[static_cast<size_t>(e)]);
    if (got != want) FAIL("weight element " << e << " is " << got << ", initial_weight gives " << want);
  }
  // The generator: in [-scale, scale), mean 0 and variance scale^2 / 3 over many elements (the
  // bounds are > 6 standard errors wide), another seed gives other values.
  const index_t m = 1 << 20;
  double sum = 0, sum2 = 0;
  index_t same = 0;
  for (index_t e = 0; e < m; ++e) {
    const float x = xsoftmax::detail::initial_weight(3, static_cast<unsigned long long>(e), 0.5f);
    REQUIRE(x >= -0.5f);
    REQUIRE(x < 0.5f);
    sum += x, sum2 += static_cast<double>(x) * x;
    same += x == xsoftmax::detail::initial_weight(4, static_cast<unsigned long long>(e), 0.5f) ? 1 : 0;
  }
  CHECK(std::abs(sum / m) < 2e-3);
  CHECK(std::abs(sum2 / m - 0.25 / 3) < 1e-3);
  CHECK(same < 100);
}

TEST_CASE_TEMPLATE("full_softmax: gradients match central finite differences", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(21);
  const index_t n = 23, d = 6, batch = 11;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.2);
    p.targets[1] = -100;
    auto head = view_head<B>(p);
    head.set_chunk_size(5);  // 23 = 4 * 5 + 3
    for (reduction r : all_reductions) {
      loss_options opt;
      opt.reduce = r;
      const std::string what = std::string("bias ") + (bias ? "yes" : "no") + ", reduction " + reduction_name(r);
      // Upstream gradient: none -> one per sample (signed); mean -> a scalar; sum -> default (1).
      test_vector<float> grad_output;
      if (r == reduction::none) grad_output = random_grad_output(rng, batch);
      if (r == reduction::mean) grad_output = {0.7f};
      const auto out = check_gradients(head, full_reference(), p.params(), make_hidden<float>(p.h, batch, d, 2),
                                       p.targets, opt, grad_output, what);
      // The exact softmax touches every class: rows 0..N-1 in order.
      test_vector<index_t> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), index_t(0));
      const auto rows_listed = on_host(out.grad.rows);
    CHECK(test_vector<index_t>(rows_listed.begin(), rows_listed.end()) == all);
      // Ignored samples get a zero hidden gradient and loss.
      for (index_t j = 0; j < d; ++j) CHECK(out.grad_hidden[static_cast<size_t>(1 * d + j)] == 0.f);
      CHECK(out.per_sample[1] == 0.f);
    }
    // Hidden as double and bf16: the gradient is that of the loss at the values the head read.
    loss_options opt;
    opt.reduce = reduction::sum;
    check_gradients(head, full_reference(), p.params(), make_hidden<double>(p.h, batch, d), p.targets, opt, {},
                    "double hidden");
    check_gradients(head, full_reference(), p.params(), make_hidden<__nv_bfloat16>(p.h, batch, d), p.targets, opt, {},
                    "bf16 hidden");
  }
}

TEST_CASE_TEMPLATE("full_softmax: every sample ignored gives zero loss and zero gradients", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(22);
  problem p = make_problem(rng, 12, 12, 4, 5, true);
  auto head = view_head<B>(p);
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

TEST_CASE_TEMPLATE("full_softmax: a reused gradient object gives the same result as a fresh one", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(23);
  problem p = make_problem(rng, 30, 30, 8, 20, true);
  auto head = view_head<B>(p);
  head.set_chunk_size(7);
  typename fs32<B>::gradient_type g;
  test_vector<float> gh(static_cast<size_t>(20 * 8));
  head.backward(cview(p.h, 20, 8), cvec(p.targets), mview(gh, 20, 8), g);  // fills g for 20 samples
  const test_vector<index_t> t2 = {3, 3, 29};
  test_vector<float> h2(p.h.begin(), p.h.begin() + 3 * 8), gh2(3 * 8);
  head.backward(cview(h2, 3, 8), cvec(t2), mview(gh2, 3, 8), g);
  typename fs32<B>::gradient_type fresh;
  test_vector<float> gh3(3 * 8);
  head.backward(cview(h2, 3, 8), cvec(t2), mview(gh3, 3, 8), fresh);
  CHECK(same_gradient(g, fresh));
  CHECK(bitwise_equal(gh2, gh3));
}

TEST_CASE_TEMPLATE("full_softmax: log_prob equals minus the per-sample forward; log_distribution matches the reference",
                   B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(31);
  const index_t n = 45, d = 8, batch = 7;
  problem p = make_problem(rng, n, n, d, batch, true);
  auto head = view_head<B>(p);
  head.set_chunk_size(10);
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<float> lp(static_cast<size_t>(batch)), per(static_cast<size_t>(batch));
  head.log_prob(hb.view(), cvec(p.targets), mvec(lp));
  loss_options none;
  none.reduce = reduction::none;
  head.forward(hb.view(), cvec(p.targets), none, mvec(per));
  for (index_t i = 0; i < batch; ++i) CHECK(lp[static_cast<size_t>(i)] == -per[static_cast<size_t>(i)]);

  const auto ref = reference_log_distribution(full_reference(), p.params(), hb.reference(p.targets), n);
  test_vector<float> dist(static_cast<size_t>(batch * n));
  head.log_distribution(hb.view(), 0, n, mview(dist, batch, n));
  check_close(dist, ref, loss_atol, loss_rtol, "log_distribution [0, N)");
  for (index_t i = 0; i < batch; ++i) {
    double total = 0;
    for (index_t c = 0; c < n; ++c) total += std::exp(static_cast<double>(dist[static_cast<size_t>(i * n + c)]));
    CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
    check_close(lp[static_cast<size_t>(i)], ref[static_cast<size_t>(i * n + p.targets[static_cast<size_t>(i)])],
                loss_atol, loss_rtol, "log_prob vs reference");
  }
  // A sub-range, written into a strided output.
  const index_t lo = 13, hi = 38, stride = (hi - lo) + 4;
  test_vector<float> part(static_cast<size_t>(batch * stride), 123.f);
  head.log_distribution(hb.view(), lo, hi, mview(part, batch, hi - lo, stride));
  for (index_t i = 0; i < batch; ++i) {
    for (index_t c = lo; c < hi; ++c)
      CHECK(part[static_cast<size_t>(i * stride + c - lo)] ==
            doctest::Approx(dist[static_cast<size_t>(i * n + c)]).epsilon(1e-6));
    for (index_t j = hi - lo; j < stride; ++j) CHECK(part[static_cast<size_t>(i * stride + j)] == 123.f);
  }
}

TEST_CASE_TEMPLATE("full_softmax: topk equals sorting the full distribution", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(41);
  const index_t n = 60, d = 8, batch = 6;
  problem p = make_problem(rng, n, n, d, batch, true);
  auto head = view_head<B>(p);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const auto ref = reference_log_distribution(full_reference(), p.params(), hb.reference(p.targets), n);
  for (index_t chunk : {index_t(0), index_t(7)}) {
    head.set_chunk_size(chunk);
    for (index_t k : {index_t(1), index_t(5), n}) {
      test_vector<index_t> cls(static_cast<size_t>(batch * k));
      test_vector<float> lps(static_cast<size_t>(batch * k));
      head.topk(hb.view(), k, mview(cls, batch, k), mview(lps, batch, k));
      for (index_t i = 0; i < batch; ++i) {
        const test_vector<index_t> order = reference_topk_order(ref, i, n);
        const double* row = ref.data() + i * n;
        for (index_t j = 0; j < k; ++j) {
          const index_t c = cls[static_cast<size_t>(i * k + j)];
          INFO("row ", i, " rank ", j, " k ", k, " chunk ", chunk);
          // Random scores are far apart relative to fp32 error: the order is the reference's.
          CHECK(c == order[static_cast<size_t>(j)]);
          CHECK(lps[static_cast<size_t>(i * k + j)] == doctest::Approx(row[c]).epsilon(1e-5));
        }
      }
    }
  }
  // Ties: identical class rows tie; the smaller class comes first.
  test_vector<float> w(static_cast<size_t>(5 * 2), 0.f);
  const float rows[5][2] = {{1, 0}, {2, 0}, {1, 0}, {2, 0}, {0, 1}};
  for (int c = 0; c < 5; ++c)
    for (int j = 0; j < 2; ++j) w[static_cast<size_t>(c * 2 + j)] = rows[c][j];
  fs32<B> tie(mview(w, 5, 2));
  tie.set_chunk_size(2);
  const test_vector<float> h = {1.f, 0.5f};
  test_vector<index_t> cls(5);
  test_vector<float> lps(5);
  tie.topk(cview(h, 1, 2), 5, mview(cls, 1, 5), mview(lps, 1, 5));
  CHECK(cls == test_vector<index_t>{1, 3, 0, 2, 4});
  CHECK(lps[0] == lps[1]);
  CHECK(lps[2] == lps[3]);
}

TEST_CASE_TEMPLATE("full_softmax: apply_sgd updates exactly the gradient rows by -lr * g", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(51);
  const index_t n = 19, d = 5, batch = 6;
  problem p = make_problem(rng, n, n, d, batch, true);
  auto head = view_head<B>(p);
  typename fs32<B>::gradient_type g;
  test_vector<float> gh(static_cast<size_t>(batch * d));
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(gh, batch, d), g);
  // Keep only a few rows (a gradient need not cover every row).
  typename fs32<B>::gradient_type part;
  part.dim = d;
  for (index_t r : {index_t(17), index_t(2), index_t(9)}) {
    part.rows.push_back(r);
    for (index_t j = 0; j < d; ++j) part.values.push_back(g.values[static_cast<size_t>(r * d + j)]);
    part.bias_values.push_back(g.bias_values[static_cast<size_t>(r)]);
  }
  const auto w0 = p.w, b0 = p.b;
  const float lr = 0.37f;
  head.apply_sgd(part, lr);
  test_vector<char> updated(static_cast<size_t>(n), 0);
  for (index_t i = 0; i < part.num_rows(); ++i) {
    const index_t r = part.rows[static_cast<size_t>(i)];
    updated[static_cast<size_t>(r)] = 1;
    for (index_t j = 0; j < d; ++j) {
      const size_t at = static_cast<size_t>(r * d + j);
      const float expect = w0[at] - lr * part.values[static_cast<size_t>(i * d + j)];
      CHECK(p.w[at] == expect);
      CHECK(p.w[at] != w0[at]);
    }
    CHECK(p.b[static_cast<size_t>(r)] == b0[static_cast<size_t>(r)] - lr * part.bias_values[static_cast<size_t>(i)]);
  }
  for (index_t r = 0; r < n; ++r) {
    if (updated[static_cast<size_t>(r)]) continue;
    CHECK(bitwise_equal(w0.data() + r * d, p.w.data() + r * d, static_cast<size_t>(d)));
    CHECK(bitwise_equal(&b0[static_cast<size_t>(r)], &p.b[static_cast<size_t>(r)], 1));
  }
  // The full gradient through an owned head: every row moves, and the loss goes down.
  fs32<B> owned(n, d, true);
  const auto hb = make_hidden<float>(p.h, batch, d);
  const float before = owned.forward(hb.view(), cvec(p.targets));
  owned.backward(hb.view(), cvec(p.targets), mview(gh, batch, d), g);
  owned.apply_sgd(g, 0.1f);
  CHECK(owned.forward(hb.view(), cvec(p.targets)) < before);
}

TEST_CASE_TEMPLATE("full_softmax: strided grad_hidden and topk outputs leave their padding alone", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(61);
  const index_t n = 25, d = 6, batch = 5, pad = 2;
  problem p = make_problem(rng, n, n, d, batch, true, 0.2);
  auto head = view_head<B>(p);
  head.set_chunk_size(4);
  test_vector<float> dense(static_cast<size_t>(batch * d)), strided(static_cast<size_t>(batch * (d + pad)), 9.f);
  typename fs32<B>::gradient_type g1, g2;
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(dense, batch, d), g1);
  head.backward(cview(p.h, batch, d), cvec(p.targets), mview(strided, batch, d, d + pad), g2);
  for (index_t i = 0; i < batch; ++i) {
    CHECK(bitwise_equal(dense.data() + i * d, strided.data() + i * (d + pad), static_cast<size_t>(d)));
    for (index_t j = d; j < d + pad; ++j) CHECK(strided[static_cast<size_t>(i * (d + pad) + j)] == 9.f);
  }
  CHECK(same_gradient(g1, g2));
  const index_t k = 4, ks = k + 3;
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
