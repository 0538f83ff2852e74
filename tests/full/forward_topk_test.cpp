// SPDX-License-Identifier: Apache-2.0
// full_softmax::forward_topk (the loss and the top-k from one pass over the scores): its loss and
// per-sample losses are forward's bit for bit, its top-k that of the float64 distribution the loss is
// taken over (soft-capped logits with a cap), ignored rows get -1 / -inf, and its inputs are checked
// as forward's and topk's are. Every backend of the build (nvcc compiles it for cuda too).

#include "support/check_throws.hpp"
#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

template <class B>
using fs32 = xsoftmax::full_softmax<xsoftmax::fp32, B>;

}  // namespace

TEST_CASE_TEMPLATE("forward_topk: forward's loss bitwise and the reference's top-k (chunks, bias, ignore, softcap)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(4101);
  const index_t n = 57, d = 8, batch = 13;
  for (bool bias : {false, true}) {
    problem p = make_problem(rng, n, n, d, batch, bias, 0.25);
    p.targets[2] = -100;  // at least one ignored row
    fs32<B> head(mview(p.w, n, d), bias ? p.b.data() : nullptr);
    const auto hb = make_hidden<float>(p.h, batch, d, 2);
    for (double cap : {0.0, 2.0}) {
      // The distribution the loss is taken over: cap tanh(z / cap) logits with a cap.
      const auto ref = reference_log_distribution(cap > 0 ? softcapped_reference(cap) : full_reference(), p.params(),
                                                  hb.reference(p.targets), n);
      for (index_t chunk : {index_t(0), index_t(6), index_t(20)}) {
        head.set_chunk_size(chunk);
        for (index_t k : {index_t(1), index_t(4), n}) {
          for (reduction r : {reduction::mean, reduction::none}) {
            INFO("bias ", bias, " cap ", cap, " chunk ", chunk, " k ", k, " reduction ", reduction_name(r));
            loss_options opt;
            opt.reduce = r;
            opt.softcap = static_cast<float>(cap);
            opt.label_smoothing = r == reduction::mean ? 0.1f : 0.f;  // a loss term: the distribution is the same
            test_vector<float> per(static_cast<size_t>(batch), 7.f), per_alone(per);
            test_vector<index_t> cls(static_cast<size_t>(batch * k), 99);
            test_vector<float> lps(static_cast<size_t>(batch * k), 99.f);
            const float loss =
                head.forward_topk(hb.view(), cvec(p.targets), k, mview(cls, batch, k), mview(lps, batch, k), opt,
                                  mvec(per));
            const float alone = head.forward(hb.view(), cvec(p.targets), opt, mvec(per_alone));
            CHECK(bitwise_equal(&loss, &alone, 1));
            CHECK(bitwise_equal(per, per_alone));
            for (index_t i = 0; i < batch; ++i) {
              const bool ignored = p.targets[static_cast<size_t>(i)] == opt.ignore_index;
              const test_vector<index_t> order = reference_topk_order(ref, i, n);
              for (index_t j = 0; j < k; ++j) {
                const index_t c = cls[static_cast<size_t>(i * k + j)];
                const float lp = lps[static_cast<size_t>(i * k + j)];
                if (ignored) {
                  CHECK(c == -1);
                  CHECK(lp == -std::numeric_limits<float>::infinity());
                  continue;
                }
                INFO("row ", i, " rank ", j);
                CHECK(c == order[static_cast<size_t>(j)]);  // random scores: far apart relative to fp32 error
                check_close(lp, ref[static_cast<size_t>(i * n + c)], loss_atol, loss_rtol, "log-probability");
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("forward_topk: without a cap its top-k is topk's; every row ignored gives loss 0 and -1 / -inf", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(4102);
  const index_t n = 40, d = 6, batch = 9, k = 5;
  problem p = make_problem(rng, n, n, d, batch, true);
  fs32<B> head(mview(p.w, n, d), p.b.data());
  head.set_chunk_size(16);
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> cls(static_cast<size_t>(batch * k)), cls_alone(cls.size());
  test_vector<float> lps(cls.size()), lps_alone(cls.size());
  head.forward_topk(hb.view(), cvec(p.targets), k, mview(cls, batch, k), mview(lps, batch, k));
  head.topk(hb.view(), k, mview(cls_alone, batch, k), mview(lps_alone, batch, k));
  CHECK(cls == cls_alone);
  for (size_t i = 0; i < lps.size(); ++i) CHECK(lps[i] == doctest::Approx(lps_alone[i]).epsilon(1e-6));

  test_vector<index_t> none(static_cast<size_t>(batch), -100);
  const float loss = head.forward_topk(hb.view(), cvec(none), k, mview(cls, batch, k), mview(lps, batch, k));
  CHECK(loss == 0.f);
  for (size_t i = 0; i < cls.size(); ++i) {
    CHECK(cls[i] == -1);
    CHECK(lps[i] == -std::numeric_limits<float>::infinity());
  }
}

TEST_CASE_TEMPLATE("forward_topk: a bf16 head (cuda: the tuned score GEMM) gives its forward and topk", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 3000, d = 32, batch = 24, k = 10;  // several chunks
  xsoftmax::full_softmax<xsoftmax::bf16, B> head(n, d, true, xsoftmax::init_options{5});
  test_rng rng(4105);
  const auto hb = make_hidden<float>(random_floats(rng, batch * d, 1.0), batch, d);
  test_vector<index_t> t = random_targets(rng, batch, n, 0.2);
  for (index_t chunk : {index_t(0), index_t(512)}) {
    head.set_chunk_size(chunk);
    test_vector<index_t> cls(static_cast<size_t>(batch * k)), cls_alone(cls.size());
    test_vector<float> lps(cls.size()), lps_alone(cls.size());
    const float loss = head.forward_topk(hb.view(), cvec(t), k, mview(cls, batch, k), mview(lps, batch, k));
    const float alone = head.forward(hb.view(), cvec(t));
    head.topk(hb.view(), k, mview(cls_alone, batch, k), mview(lps_alone, batch, k));
    CAPTURE(chunk);
    CHECK(bitwise_equal(&loss, &alone, 1));
    for (index_t i = 0; i < batch; ++i) {
      if (t[static_cast<size_t>(i)] == -100) continue;
      for (index_t j = 0; j < k; ++j) {
        const size_t e = static_cast<size_t>(i * k + j);
        CHECK(cls[e] == cls_alone[e]);  // the same scores, the same order
        CHECK(lps[e] == doctest::Approx(lps_alone[e]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE_TEMPLATE("forward_topk: the async form writes what the blocking one returns", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(4103);
  const index_t n = 30, d = 6, batch = 7, k = 3;
  problem p = make_problem(rng, n, n, d, batch, false, 0.2);
  fs32<B> head(mview(p.w, n, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> cls(static_cast<size_t>(batch * k)), cls_async(cls.size());
  test_vector<float> lps(cls.size()), lps_async(cls.size()), loss_async(1);
  const float loss = head.forward_topk(hb.view(), cvec(p.targets), k, mview(cls, batch, k), mview(lps, batch, k));
  head.forward_topk_async(hb.view(), cvec(p.targets), k, mview(cls_async, batch, k), mview(lps_async, batch, k),
                          mvec(loss_async));
  xsoftmax::detail::backend_ops<B>::synchronize(head.resources());  // cuda: the queued work
  CHECK(bitwise_equal(&loss, loss_async.data(), 1));
  CHECK(cls == cls_async);
  CHECK(bitwise_equal(lps, lps_async));
}

TEST_CASE_TEMPLATE("forward_topk: bad input is refused with the verb's name, nothing written", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(4104);
  const index_t n = 20, d = 4, batch = 5, k = 2;
  problem p = make_problem(rng, n, n, d, batch, false);
  fs32<B> head(mview(p.w, n, d));
  const auto hb = make_hidden<float>(p.h, batch, d);
  test_vector<index_t> cls(static_cast<size_t>(batch * k), 99);
  test_vector<float> lps(cls.size(), 99.f);
  auto call = [&](index_t kk, const test_vector<index_t>& targets, loss_options opt, index_t out_rows) {
    return head.forward_topk(hb.view(), cvec(targets), kk, mview(cls, out_rows, kk), mview(lps, out_rows, kk), opt);
  };
  const loss_options plain;
  check_throws<xsoftmax::invalid_argument>([&] { call(0, p.targets, plain, batch); },
                                           {"full_softmax::forward_topk: k = 0"});
  check_throws<xsoftmax::invalid_argument>([&] { call(n + 1, p.targets, plain, batch); },
                                           {"k = 21 must be in [1, num_classes = 20]"});
  check_throws<xsoftmax::shape_error>([&] { call(k, p.targets, plain, batch - 1); },
                                      {"full_softmax::forward_topk", "classes"});
  test_vector<index_t> bad = p.targets;
  bad[3] = n;
  check_throws<xsoftmax::out_of_range>([&] { call(k, bad, plain, batch); },
                                       {"full_softmax::forward_topk: targets[3] = 20"});
  loss_options margin;
  margin.margin = xsoftmax::margin_options::cosface(16.f, 0.2f);
  check_throws<xsoftmax::invalid_argument>([&] { call(k, p.targets, margin, batch); },
                                           {"full_softmax::forward_topk", "angular margin"});
  CHECK(std::all_of(cls.begin(), cls.end(), [](index_t c) { return c == 99; }));
  CHECK(std::all_of(lps.begin(), lps.end(), [](float v) { return v == 99.f; }));
}
