// SPDX-License-Identifier: Apache-2.0
// The five classes of bad input an independent probe of the public API found crashing the process
// or passing silently, each fixed at its root in the validation layer the heads share
// (head_verbs.hpp, shape_checks.hpp, primitives/batch_rows.hpp, weight_store.hpp, error.hpp):
//  1. a view with a null data pointer and a non-zero size;
//  2. an enum argument holding a value outside its enumerators;
//  3. extreme int64 targets slipping through a verb's range check (log_prob's "no ignore_index");
//  4. apply_sgd with a non-finite gradient (or lr times it);
//  5. shapes whose element count overflows index_t.
// Every case checks the exception type, that the message names the argument and the value, and
// that the weights are bitwise unchanged. The heads and backends of the build are all covered.

#include "support/head_checks.hpp"

#include <xsoftmax/xsoftmax.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::test_vector;

namespace {

/// `f()` throws exactly an `E` whose message holds every needle, and the weights of `head` stay as
/// they were (compared bitwise through a host copy).
template <class E, class Head, class F>
void expect_rejected(const Head& head, F&& f, std::initializer_list<std::string> needles, const char* what) {
  using T = typename Head::storage_type;
  const auto before = xsoftmax_test::dense_copy(xs::matrix_view<const T>(head.weights()));
  INFO(what);
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    const std::string msg = e.what();
    for (const auto& needle : needles)
      CHECK_MESSAGE(msg.find(needle) != std::string::npos, what, ": message \"", msg, "\" lacks \"", needle, "\"");
  } catch (const std::exception& e) {
    FAIL_CHECK(what, ": threw the wrong type: ", e.what());
    thrown = true;
  }
  CHECK_MESSAGE(thrown, what, ": nothing was thrown");
  const auto after = xsoftmax_test::dense_copy(xs::matrix_view<const T>(head.weights()));
  CHECK_MESSAGE(xsoftmax_test::bitwise_equal(before, after), what, ": the weights changed");
}

/// A batch for a head with `classes` classes and width `d`.
struct batch {
  index_t rows, d;
  test_vector<float> h, gh;
  test_vector<index_t> t;
  batch(index_t rows_, index_t d_, index_t classes) : rows(rows_), d(d_), h(rows_ * d_), gh(rows_ * d_), t(rows_) {
    for (index_t i = 0; i < rows * d; ++i) h[i] = 0.01f * static_cast<float>(i % 17);
    for (index_t i = 0; i < rows; ++i) t[i] = i % classes;
  }
  [[nodiscard]] xs::matrix_view<const float> hv() const { return {h.data(), rows, d}; }
  [[nodiscard]] xs::vector_view<const index_t> tv() const { return {t.data(), rows}; }
  [[nodiscard]] xs::matrix_view<float> ghv() { return {gh.data(), rows, d}; }
};

template <class Head>
void every_class_of_bad_input(Head& head, const char* name) {
  const index_t n = head.num_classes(), d = head.dim();
  batch b(5, d, n);
  typename Head::gradient_type grad;
  const std::string verb = std::string(name) + "::";

  // 1. Null data with a non-zero size, for every view argument of the loss verbs.
  expect_rejected<xs::invalid_argument>(
      head, [&] { head.backward(b.hv(), b.tv(), b.ghv(), grad, {}, xs::vector_view<const float>(nullptr, 1)); },
      {verb + "backward", "grad_output.data is null"}, "null grad_output");
  xs::loss_options none;
  none.reduce = xs::reduction::none;
  expect_rejected<xs::invalid_argument>(
      head, [&] { (void)head.forward(b.hv(), b.tv(), none, xs::vector_view<float>(nullptr, b.rows)); },
      {"per_sample.data is null"}, "null per_sample");
  expect_rejected<xs::invalid_argument>(
      head, [&] { (void)head.forward(xs::matrix_view<const float>(nullptr, b.rows, d), b.tv()); },
      {"hidden.data is null"}, "null hidden");
  expect_rejected<xs::invalid_argument>(
      head, [&] { (void)head.forward(b.hv(), xs::vector_view<const index_t>(nullptr, b.rows)); },
      {"targets.data is null"}, "null targets");
  expect_rejected<xs::invalid_argument>(
      head,
      [&] {
        (void)head.forward_backward(b.hv(), b.tv(), xs::matrix_view<float>(nullptr, b.rows, d), grad);
      },
      {"grad_hidden.data is null"}, "null grad_hidden");
  test_vector<float> lp(static_cast<std::size_t>(b.rows));
  expect_rejected<xs::invalid_argument>(
      head, [&] { head.log_prob(b.hv(), b.tv(), xs::vector_view<float>(nullptr, b.rows)); },
      {verb + "log_prob", "out.data is null"}, "null log_prob out");
  test_vector<float> top_lp(static_cast<std::size_t>(b.rows * 2));
  expect_rejected<xs::invalid_argument>(
      head,
      [&] {
        head.topk(b.hv(), 2, xs::matrix_view<index_t>(nullptr, b.rows, 2),
                  xs::matrix_view<float>(top_lp.data(), b.rows, 2));
      },
      {"classes.data is null"}, "null topk classes");

  // 2. Enumerators out of range.
  xs::loss_options bad_reduce;
  bad_reduce.reduce = static_cast<xs::reduction>(7);
  expect_rejected<xs::invalid_argument>(head, [&] { (void)head.forward(b.hv(), b.tv(), bad_reduce); },
                                        {verb + "forward", "options.reduce = 7", "not a reduction"},
                                        "reduction 7");
  expect_rejected<xs::invalid_argument>(
      head, [&] { (void)head.forward_backward(b.hv(), b.tv(), b.ghv(), grad, bad_reduce); },
      {"options.reduce = 7"}, "reduction 7 (backward)");

  // 3. Extreme targets: log_prob ignores nothing, whatever value ignore_index has elsewhere.
  for (const index_t extreme : {std::numeric_limits<index_t>::min(), std::numeric_limits<index_t>::max(),
                                index_t(-100), index_t(-1), n}) {
    batch bad(5, d, n);
    bad.t[3] = extreme;
    expect_rejected<xs::out_of_range>(
        head, [&] { head.log_prob(bad.hv(), bad.tv(), xs::vector_view<float>(lp.data(), bad.rows)); },
        {verb + "log_prob", "targets[3] = " + std::to_string(extreme)}, "extreme target in log_prob");
    if (extreme != -100)
      expect_rejected<xs::out_of_range>(
          head, [&] { (void)head.forward_backward(bad.hv(), bad.tv(), bad.ghv(), grad); },
          {"targets[3] = " + std::to_string(extreme)}, "extreme target in forward_backward");
  }
  xs::loss_options extreme_ignore;
  extreme_ignore.ignore_index = std::numeric_limits<index_t>::min();
  {
    batch bad(5, d, n);
    bad.t[1] = std::numeric_limits<index_t>::max();
    expect_rejected<xs::out_of_range>(
        head, [&] { (void)head.forward(bad.hv(), bad.tv(), extreme_ignore); },
        {"targets[1] = " + std::to_string(std::numeric_limits<index_t>::max())}, "INT64_MAX with ignore INT64_MIN");
  }

  // 4. apply_sgd: a non-finite gradient value, or lr times a finite one past the float range.
  (void)head.forward_backward(b.hv(), b.tv(), b.ghv(), grad);
  REQUIRE(grad.num_rows() > 0);
  for (const float bad_value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto poisoned = grad;
    const index_t at = std::min<index_t>(grad.num_rows() - 1, 1) * d + (d - 1);
    xsoftmax_test::write_into(xs::detail::raw(poisoned.values) + at, std::vector<float>{bad_value});
    expect_rejected<xs::non_finite_error>(
        head, [&] { head.apply_sgd(poisoned, 0.1f); },
        {verb + "apply_sgd", "gradient values[" + std::to_string(at / d) + "][" + std::to_string(d - 1) + "]"},
        "non-finite gradient value");
  }
  {
    auto huge = grad;
    const float big = 3e38f;
    xsoftmax_test::write_into(xs::detail::raw(huge.values), std::vector<float>{big});
    expect_rejected<xs::non_finite_error>(head, [&] { head.apply_sgd(huge, 10.f); },
                                          {"gradient values[0][0]", "times lr = 10"}, "lr times gradient overflows");
  }
}

}  // namespace

TEST_CASE_TEMPLATE("bad input, five classes: full_softmax", B, XSOFTMAX_TEST_BACKENDS) {
  xs::full_softmax<xs::fp32, B> head(13, 4, true);
  every_class_of_bad_input(head, "full_softmax");
}

TEST_CASE_TEMPLATE("bad input, five classes: hierarchical_softmax (uniform, softmax nodes)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  using tree = xs::uniform_tree<2, 4>;
  xs::hierarchical_softmax<tree, xs::fp32, B> head(tree(13), 4, true);
  every_class_of_bad_input(head, "hierarchical_softmax");
  expect_rejected<xs::invalid_argument>(
      head, [&] { head.set_dense_grouping(static_cast<xs::dense_grouping>(9)); },
      {"set_dense_grouping", "mode = 9"}, "dense_grouping 9");
}

TEST_CASE_TEMPLATE("bad input, five classes: hierarchical_softmax (Huffman, sigmoid nodes)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::vector<double> counts(13);
  for (std::size_t c = 0; c < counts.size(); ++c) counts[c] = 1.0 + static_cast<double>(c * c);
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes> head(
      xs::runtime_tree<>::huffman(counts, 2), 4);
  every_class_of_bad_input(head, "hierarchical_softmax");
}

#if XSOFTMAX_TEST_HOST_BUILD
TEST_CASE_TEMPLATE("bad input, five classes: selective_softmax (sampled negatives)", B, XSOFTMAX_TEST_BACKENDS) {
  xs::sampling_options so;
  so.num_sampled = 4;
  xs::selective_softmax<xs::sampled_negatives, xs::fp32, B> head(xs::sampled_negatives::uniform(13, so), 13, 4,
                                                                   true);
  every_class_of_bad_input(head, "selective_softmax");
}
#endif

TEST_CASE_TEMPLATE("bad input, class 5: element counts that overflow index_t are rejected before allocating", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t huge = index_t(1) << 40;
  try {
    xs::full_softmax<xs::fp32, B> head(huge, huge);
    FAIL("constructed");
  } catch (const xs::invalid_argument& e) {
    CHECK(std::string(e.what()).find("weight rows x dim = 1099511627776 x 1099511627776 overflows") !=
          std::string::npos);
  }
  try {
    xs::full_softmax<xs::bf16, B> head(index_t(1) << 31, index_t(1) << 31);
    FAIL("constructed");
  } catch (const xs::invalid_argument& e) {
    CHECK(std::string(e.what()).find("exceed the largest possible allocation") != std::string::npos);
  }
  // A caller's view whose rows x stride overflows is refused too (it could never be addressed).
  float dummy = 0.f;
  CHECK_THROWS_AS((xs::full_softmax<xs::fp32, B>(xs::matrix_view<float>(&dummy, huge, 4, huge))),
                  xs::invalid_argument);
  CHECK(xs::detail::checked_product<index_t>("probe", "a x b", 3, 4) == 12);
}

#if XSOFTMAX_TEST_HOST_BUILD
TEST_CASE("bad input, class 2: enumerators of the selection options") {
  xs::knn_build_options o;
  o.metric = static_cast<xs::similarity>(5);
  CHECK_THROWS_WITH_AS(xs::knn_graph_builder{o}, doctest::Contains("metric = 5 is not a similarity"),
                       xs::invalid_argument);
  o.metric = xs::similarity::cosine;
  o.method = static_cast<xs::knn_build_method>(3);
  CHECK_THROWS_WITH_AS(xs::knn_graph_builder{o}, doctest::Contains("method = 3 is not a knn_build_method"),
                       xs::invalid_argument);
}
#endif
