// SPDX-License-Identifier: Apache-2.0
// Bad input raises a typed exception whose message names the argument and the offending value,
// and leaves the weights (and bias) bitwise unchanged: the weights are copied before every call
// that must throw and compared after it.

#include "support/head_checks.hpp"

#include <xsoftmax/error.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::reduction;

/// The head's weights and bias, copied.
template <class Head>
struct weight_snapshot {
  using T = typename Head::storage_type;
  test_vector<T> w, b;
  explicit weight_snapshot(const Head& head) : w(dense_copy(xsoftmax::matrix_view<const T>(head.weights()))) {
    if (head.has_bias()) b = read_back(head.bias(), head.weights().rows);
  }
  bool same_as(const Head& head) const {
    const weight_snapshot now(head);
    return bitwise_equal(w, now.w) && bitwise_equal(b, now.b);
  }
};

/// `f()` must throw exactly an `E` (or a subclass) whose what() contains every needle, and leave
/// `head`'s weights unchanged.
template <class E, class Head, class F>
void expect_throw(const Head& head, F&& f, std::initializer_list<std::string> needles, const std::string& what) {
  const weight_snapshot<Head> before(head);
  INFO(what);
  CHECK_THROWS_AS(f(), E);
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& needle : needles)
      CHECK_MESSAGE(msg.find(needle) != std::string::npos, what, ": message \"", msg, "\" lacks \"", needle, "\"");
  } catch (...) {
  }
  CHECK_MESSAGE(before.same_as(head), what, ": the weights changed");
}

/// Input errors every head must reject the same way; `head` has num_classes() == n, dim() == 8, and
/// `targets` are 4 valid targets.
template <class Head>
void check_common_errors(Head& head, const test_vector<float>& h_in, const test_vector<index_t>& targets_in,
                         const std::string& name) {
  const index_t n = head.num_classes(), d = head.dim(), batch = 4;
  REQUIRE(d == 8);
  test_vector<float> h = h_in;
  test_vector<index_t> t = targets_in;
  test_vector<float> per(static_cast<size_t>(batch)), gh(static_cast<size_t>(batch * d));
  typename Head::gradient_type g;
  loss_options none;
  none.reduce = reduction::none;
  auto hv = [&]() { return cview(h, batch, d); };
  auto fwd = [&]() { head.forward(hv(), cvec(t)); };
  auto fwd_bwd = [&]() { head.forward_backward(hv(), cvec(t), mview(gh, batch, d), g); };
  auto bwd = [&]() { head.backward(hv(), cvec(t), mview(gh, batch, d), g); };
  auto logp = [&]() { head.log_prob(hv(), cvec(t), mvec(per)); };

  // Labels out of range, negative labels that are not the ignore index.
  t[2] = n + 7;
  const std::string big = "targets[2] = " + std::to_string(n + 7);
  expect_throw<xsoftmax::out_of_range>(head, fwd, {name + "::forward", big}, "label out of range: forward");
  expect_throw<xsoftmax::out_of_range>(head, fwd_bwd, {name + "::forward_backward", big}, "label out of range: forward_backward");
  expect_throw<xsoftmax::out_of_range>(head, bwd, {name + "::backward", big}, "label out of range: backward");
  expect_throw<xsoftmax::out_of_range>(head, logp, {name + "::log_prob", big}, "label out of range: log_prob");
  t[2] = n;  // one past the end
  expect_throw<xsoftmax::out_of_range>(head, fwd, {"targets[2] = " + std::to_string(n)}, "label == N");
  t = targets_in;
  t[1] = -3;
  expect_throw<xsoftmax::out_of_range>(head, fwd, {"targets[1] = -3"}, "negative label");
  expect_throw<xsoftmax::out_of_range>(head, bwd, {"targets[1] = -3"}, "negative label: backward");
  t[1] = -100;  // the default ignore index is fine for the loss, but log_prob has no ignore index
  CHECK_NOTHROW(fwd());
  expect_throw<xsoftmax::out_of_range>(head, logp, {"targets[1] = -100"}, "ignore index in log_prob");
  t = targets_in;
  {
    loss_options other;
    other.ignore_index = -1;
    t[3] = -100;  // not the ignore index under these options
    expect_throw<xsoftmax::out_of_range>(
        head, [&]() { head.forward(hv(), cvec(t), other); }, {"targets[3] = -100"}, "-100 with ignore_index -1");
    t = targets_in;
  }

  // NaN and Inf hidden values, in every verb that reads hidden.
  test_vector<index_t> top_c(static_cast<size_t>(batch * 2));
  test_vector<float> top_l(static_cast<size_t>(batch * 2)), dist(static_cast<size_t>(batch * n));
  auto topk = [&]() { head.topk(hv(), 2, mview(top_c, batch, 2), mview(top_l, batch, 2)); };
  auto distr = [&]() { head.log_distribution(hv(), 0, n, mview(dist, batch, n)); };
  h[1 * d + 2] = std::numeric_limits<float>::quiet_NaN();
  const test_vector<std::pair<std::function<void()>, std::string>> readers = {
      {fwd, "forward"}, {fwd_bwd, "forward_backward"}, {bwd, "backward"},
      {logp, "log_prob"}, {topk, "topk"},         {distr, "log_distribution"}};
  for (const auto& [f, verb] : readers)
    expect_throw<xsoftmax::non_finite_error>(head, f, {name + "::" + verb, "hidden[1][2] = nan"}, "NaN: " + verb);
  h = h_in;
  h[0 * d + 3] = std::numeric_limits<float>::infinity();
  expect_throw<xsoftmax::non_finite_error>(head, fwd, {"hidden[0][3] = inf"}, "+Inf hidden");
  expect_throw<xsoftmax::non_finite_error>(head, bwd, {"hidden[0][3] = inf"}, "+Inf hidden: backward");
  h = h_in;
  h[3 * d + 7] = -std::numeric_limits<float>::infinity();
  expect_throw<xsoftmax::non_finite_error>(head, fwd, {"hidden[3][7] = -inf"}, "-Inf hidden");
  h = h_in;
  {
    // Non-finite values in double and bf16 hidden (a double too large for fp32 is Inf to the head).
    test_vector<double> hd(h.begin(), h.end());
    hd[2 * d + 5] = 1e300;
    expect_throw<xsoftmax::non_finite_error>(
        head, [&]() { head.forward(cview(hd, batch, d), cvec(t)); }, {"hidden[2][5] = inf"}, "double 1e300 hidden");
    auto hb = convert<__nv_bfloat16>(h);
    hb[1] = xsoftmax::from_float<__nv_bfloat16>(std::numeric_limits<float>::quiet_NaN());
    expect_throw<xsoftmax::non_finite_error>(
        head, [&]() { head.forward(cview(hb, batch, d), cvec(t)); }, {"hidden[0][1] = nan"}, "bf16 NaN hidden");
  }

  // Shapes.
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.forward(cview(h, batch, d - 1, d), cvec(t)); },
      {"hidden has " + std::to_string(d - 1) + " columns", "dim is " + std::to_string(d)}, "hidden width");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.topk(cview(h, batch, d + 1, d + 1), 1, mview(top_c, batch, 1), mview(top_l, batch, 1)); },
      {"hidden has 9 columns"}, "hidden width: topk");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.forward(hv(), xsoftmax::vector_view<const index_t>(t.data(), 3)); },
      {"targets has 3 entries", "hidden has 4 rows"}, "targets length");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.backward(hv(), xsoftmax::vector_view<const index_t>(t.data(), 5), mview(gh, batch, d), g); },
      {"targets has 5 entries"}, "targets length: backward");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.forward_backward(hv(), cvec(t), mview(gh, batch - 1, d), g); },
      {"grad_hidden is 3 x 8, expected 4 x 8"}, "grad_hidden rows");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.backward(hv(), cvec(t), mview(gh, batch, d - 2, d), g); },
      {"grad_hidden is 4 x 6, expected 4 x 8"}, "grad_hidden cols");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.forward(hv(), cvec(t), none, xsoftmax::vector_view<float>(per.data(), 3)); },
      {"per_sample has 3 entries, expected 4"}, "per_sample length");
  expect_throw<xsoftmax::shape_error>(head, [&]() { head.forward(hv(), cvec(t), none); },
                                      {"per_sample has 0 entries, expected 4"}, "reduction none without per_sample");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.log_prob(hv(), cvec(t), xsoftmax::vector_view<float>(per.data(), 2)); }, {"has 2 entries"},
      "log_prob output length");
  {
    test_vector<float> go(2, 1.f);
    expect_throw<xsoftmax::shape_error>(
        head, [&]() { head.backward(hv(), cvec(t), mview(gh, batch, d), g, none, cvec(go)); },
        {"grad_output has 2 entries"}, "grad_output length, reduction none");
    expect_throw<xsoftmax::shape_error>(
        head, [&]() { head.backward(hv(), cvec(t), mview(gh, batch, d), g, loss_options{}, cvec(go)); },
        {"grad_output has 2 entries"}, "grad_output length, reduction mean");
    test_vector<float> bad(static_cast<size_t>(batch), 1.f);
    bad[2] = std::numeric_limits<float>::quiet_NaN();
    expect_throw<xsoftmax::non_finite_error>(
        head, [&]() { head.backward(hv(), cvec(t), mview(gh, batch, d), g, none, cvec(bad)); }, {"grad_output"},
        "NaN grad_output");
  }

  // Empty batch.
  auto empty = xsoftmax::matrix_view<const float>(h.data(), 0, d);
  expect_throw<xsoftmax::invalid_argument>(
      head, [&]() { head.forward(empty, xsoftmax::vector_view<const index_t>(t.data(), 0)); },
      {"empty batch", "hidden.rows = 0"}, "empty batch: forward");
  expect_throw<xsoftmax::invalid_argument>(
      head,
      [&]() { head.backward(empty, xsoftmax::vector_view<const index_t>(t.data(), 0), mview(gh, 0, d), g); },
      {"empty batch"}, "empty batch: backward");
  expect_throw<xsoftmax::invalid_argument>(
      head, [&]() { head.topk(empty, 1, mview(top_c, 0, 1), mview(top_l, 0, 1)); }, {"empty batch"}, "empty batch: topk");

  // topk: k out of [1, N]; output shapes.
  for (index_t k : {index_t(0), n + 1, index_t(-2)}) {
    test_vector<index_t> c(static_cast<size_t>(batch * (n + 1)));
    test_vector<float> l(c.size());
    const index_t cols = k > 0 ? k : 1;
    expect_throw<xsoftmax::invalid_argument>(
        head, [&]() { head.topk(hv(), k, mview(c, batch, cols), mview(l, batch, cols)); },
        {name + "::topk", "k = " + std::to_string(k), "num_classes = " + std::to_string(n)}, "topk k");
  }
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.topk(hv(), 2, mview(top_c, batch, 1), mview(top_l, batch, 2)); },
      {"classes is 4 x 1, expected 4 x 2"}, "topk classes shape");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.topk(hv(), 2, mview(top_c, batch, 2), mview(top_l, batch - 1, 2)); },
      {"log_probs is 3 x 2, expected 4 x 2"}, "topk log_probs shape");

  // log_distribution: the class range must be a non-empty part of [0, N).
  const std::string range_end = std::to_string(n + 1);
  expect_throw<xsoftmax::out_of_range>(
      head, [&]() { head.log_distribution(hv(), 3, n + 1, mview(dist, batch, n - 2)); },
      {name + "::log_distribution", "class range [3, " + range_end + ")"}, "log_distribution end > N");
  expect_throw<xsoftmax::out_of_range>(
      head, [&]() { head.log_distribution(hv(), -1, 2, mview(dist, batch, 3)); }, {"class range [-1, 2)"},
      "log_distribution negative begin");
  expect_throw<xsoftmax::out_of_range>(
      head, [&]() { head.log_distribution(hv(), 2, 2, mview(dist, batch, 0)); }, {"class range [2, 2)"},
      "log_distribution empty range");
  expect_throw<xsoftmax::shape_error>(
      head, [&]() { head.log_distribution(hv(), 0, 2, mview(dist, batch, 3)); }, {"out is 4 x 3, expected 4 x 2"},
      "log_distribution output shape");

  // apply_sgd: a valid gradient with one thing wrong at a time. The bad row is not the first, so a
  // half-applied update would show.
  REQUIRE_NOTHROW(bwd());
  REQUIRE(g.num_rows() >= 2);
  {
    auto bad = g;
    bad.rows[1] = head.weights().rows + 3;
    expect_throw<xsoftmax::out_of_range>(
        head, [&]() { head.apply_sgd(bad, 0.1f); },
        {name + "::apply_sgd", "row[1] = " + std::to_string(head.weights().rows + 3)}, "apply_sgd row out of range");
    bad.rows[1] = -1;
    expect_throw<xsoftmax::out_of_range>(head, [&]() { head.apply_sgd(bad, 0.1f); }, {"row[1] = -1"},
                                         "apply_sgd negative row");
  }
  {
    // A duplicated row would be updated twice, racing with itself on omp: rejected, nothing applied.
    auto bad = g;
    bad.rows[1] = bad.rows[0];
    expect_throw<xsoftmax::invalid_argument>(
        head, [&]() { head.apply_sgd(bad, 0.1f); },
        {name + "::apply_sgd", "not unique (row " + std::to_string(bad.rows[0]) + " appears more than once)"},
        "apply_sgd duplicate rows");
  }
  {
    auto bad = g;
    bad.dim = d - 1;
    expect_throw<xsoftmax::shape_error>(head, [&]() { head.apply_sgd(bad, 0.1f); },
                                        {"gradient dim = 7", "8 columns"}, "apply_sgd gradient dim");
    bad = g;
    bad.values.pop_back();
    expect_throw<xsoftmax::shape_error>(head, [&]() { head.apply_sgd(bad, 0.1f); }, {"values for"},
                                        "apply_sgd values size");
  }
  for (float lr : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    expect_throw<xsoftmax::non_finite_error>(head, [&]() { head.apply_sgd(g, lr); },
                                             {"learning rate", std::isnan(lr) ? "nan" : "inf"}, "apply_sgd lr");
}

template <class B>
using fs32 = xsoftmax::full_softmax<xsoftmax::fp32, B>;

}  // namespace

TEST_CASE_TEMPLATE("errors: full_softmax rejects bad input with typed, named errors and unchanged weights", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(401);
  const index_t n = 10, d = 8;
  problem p = make_problem(rng, n, n, d, 4, true);
  fs32<B> head(mview(p.w, n, d), p.b.data());
  head.set_chunk_size(3);
  check_common_errors(head, p.h, p.targets, "full_softmax");
  fs32<B> owned(n, d, false);
  check_common_errors(owned, p.h, p.targets, "full_softmax");

  // Constructors and options.
  CHECK_THROWS_AS(fs32<B>(0, d), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS(fs32<B>(0, d), doctest::Contains("weight rows = 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS(fs32<B>(n, -2), doctest::Contains("dim = -2"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS(fs32<B>(xsoftmax::matrix_view<float>(nullptr, n, d)), doctest::Contains("weights.data is null"),
                       xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS(fs32<B>(mview(p.w, n, d, d - 1)), doctest::Contains("weights.stride = 7"), xsoftmax::shape_error);
  CHECK_THROWS_WITH_AS(head.set_chunk_size(-1), doctest::Contains("classes = -1"), xsoftmax::invalid_argument);

  // A gradient with bias values applied to a head without a bias.
  typename fs32<B>::gradient_type g;
  test_vector<float> gh(static_cast<size_t>(4 * d));
  head.backward(cview(p.h, 4, d), cvec(p.targets), mview(gh, 4, d), g);
  expect_throw<xsoftmax::invalid_argument>(owned, [&]() { owned.apply_sgd(g, 0.1f); }, {"bias"},
                                           "bias gradient on a head without bias");
}

TEST_CASE_TEMPLATE("errors: hierarchical_softmax rejects bad input with typed, named errors and unchanged weights", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(402);
  const index_t d = 8;
  {
    using tree_t = xsoftmax::uniform_tree<2, 3>;
    const tree_t tree(8);
    problem p = make_problem(rng, tree.num_rows(), 8, d, 4, true);
    xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> head(tree, mview(p.w, p.rows, d), p.b.data());
    check_common_errors(head, p.h, p.targets, "hierarchical_softmax");
    head.set_gemm_min_run(1);
    check_common_errors(head, p.h, p.targets, "hierarchical_softmax");
    // Beam width must not be negative.
    test_vector<index_t> c(4);
    test_vector<float> l(4);
    xsoftmax::search_options so;
    so.beam_width = -1;
    expect_throw<xsoftmax::invalid_argument>(
        head, [&]() { head.topk(cview(p.h, 4, d), 1, mview(c, 4, 1), mview(l, 4, 1), so); }, {"beam_width = -1"},
        "negative beam width");
  }
  {
    const auto tree = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 30), 2);
    problem p = make_problem(rng, tree.num_rows() / 2, 30, d, 4, false);
    xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes> head(
        tree, mview(p.w, p.rows, d));
    check_common_errors(head, p.h, p.targets, "hierarchical_softmax");
  }
}

// Construction-time checks of host-side objects (trees, views): once, in the host build.
#if XSOFTMAX_TEST_HOST_BUILD
TEST_CASE("errors: trees that do not fit, weight views of the wrong size, sigmoid nodes on non-binary trees") {
  // uniform_tree cannot hold more than Branching^Depth classes, nor fewer than one.
  using u23 = xsoftmax::uniform_tree<2, 3>;
  CHECK_THROWS_AS(u23(10), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH(u23(10), doctest::Contains("num_classes = 10 exceeds Branching^Depth = 9"));
  CHECK_THROWS_WITH_AS(u23(0), doctest::Contains("num_classes = 0"), xsoftmax::invalid_argument);
  CHECK_THROWS_WITH_AS(u23(-4), doctest::Contains("num_classes = -4"), xsoftmax::invalid_argument);
  CHECK_NOTHROW(u23(9));
  CHECK_THROWS_WITH_AS((xsoftmax::uniform_tree<1, 64>(65)), doctest::Contains("num_classes = 65"),
                       xsoftmax::invalid_argument);

  // A weight view whose row count is not the tree's.
  const u23 tree(9);  // 9 + 3 = 12 rows
  REQUIRE(tree.num_rows() == 12);
  test_vector<float> w(13 * 4, 0.5f);
  const auto w0 = w;
  using hs_t = xsoftmax::hierarchical_softmax<u23>;
  CHECK_THROWS_AS(hs_t(tree, mview(w, 11, 4)), xsoftmax::shape_error);
  CHECK_THROWS_WITH(hs_t(tree, mview(w, 11, 4)), doctest::Contains("weights.rows = 11 but the tree needs 12 rows"));
  CHECK_THROWS_WITH_AS(hs_t(tree, mview(w, 13, 4)), doctest::Contains("weights.rows = 13"), xsoftmax::shape_error);
  CHECK_NOTHROW(hs_t(tree, mview(w, 12, 4)));
  CHECK(bitwise_equal(w, w0));
  CHECK_THROWS_WITH_AS(hs_t(tree, 0), doctest::Contains("dim = 0"), xsoftmax::invalid_argument);

  // Sigmoid nodes need every node to have exactly two children.
  using sig_t = xsoftmax::hierarchical_softmax<u23, xsoftmax::fp32, xsoftmax::serial, xsoftmax::sigmoid_nodes>;
  CHECK_THROWS_AS(sig_t(tree, 4), xsoftmax::tree_error);
  CHECK_THROWS_WITH(sig_t(tree, 4), doctest::Contains("has 3 children"));
  CHECK_THROWS_WITH_AS(sig_t(tree, mview(w, 6, 4)), doctest::Contains("binary"), xsoftmax::tree_error);
  CHECK(bitwise_equal(w, w0));
  // A binary uniform tree whose N is not a power of two has a node with a single live child.
  using sig2_t =
      xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<3, 2>, xsoftmax::fp32, xsoftmax::serial, xsoftmax::sigmoid_nodes>;
  CHECK_THROWS_WITH_AS(sig2_t(xsoftmax::uniform_tree<3, 2>(5), 4), doctest::Contains("has 1 children"),
                       xsoftmax::tree_error);
  CHECK_NOTHROW(sig2_t(xsoftmax::uniform_tree<3, 2>(8), 4));
  // A ternary Huffman tree.
  test_rng rng(403);
  const auto ternary = xsoftmax::runtime_tree<>::huffman(zipf_counts(rng, 20), 3);
  using sig3_t =
      xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, xsoftmax::serial, xsoftmax::sigmoid_nodes>;
  CHECK_THROWS_AS(sig3_t(ternary, 4), xsoftmax::tree_error);
}
#endif  // XSOFTMAX_TEST_HOST_BUILD
