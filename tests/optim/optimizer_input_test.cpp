// SPDX-License-Identifier: Apache-2.0
// Issue 28: every sparse optimizer (momentum, Adagrad, Adam, sparse LARS and LAMB; fp32, bf16 and
// fp16 state) checks the weights view as the heads do (null data, a stride smaller than the
// columns) and applies one learning-rate rule (finite and >= 0), through `step(weights, bias, g,
// lr)` and `step(head, g, lr)`: a typed error naming the argument and the value, and nothing
// written. Every backend of the build.

#include "support/check_throws.hpp"
#include "support/test_memory.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/optim/large_batch.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

using xsoftmax_test::check_throws;

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::read_back;
using xsoftmax_test::test_vector;

constexpr index_t rows = 10, dim = 4;

/// The bytes of n values at p (host or device memory): compares 16-bit state without its operators.
template <class T>
std::vector<unsigned char> bytes(T* p, index_t n) {
  const auto v = read_back(p, n);
  std::vector<unsigned char> out(static_cast<std::size_t>(n) * sizeof(T));
  if (n > 0) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <class R, class B, class S>
const xs::sparse_optimizer<R, B, S>& base_of(const xs::sparse_optimizer<R, B, S>& o) {
  return o;
}
template <class R, class B, class S>
const xs::sparse_optimizer<R, B, S>& base_of(const xs::sparse_trust_ratio_optimizer<R, B, S>& o) {
  return o.base();
}

/// Everything a step may write: weights, bias, state, bias state, update counts.
template <class Opt>
struct snapshot {
  std::vector<unsigned char> w, b, s, bs, c;
  snapshot(const Opt& opt, float* w_data, float* b_data) {
    const auto& o = base_of(opt);
    constexpr int slots = Opt::rule_type::slots;
    w = bytes(w_data, rows * dim);
    b = bytes(b_data, rows);
    s = bytes(o.state(), rows * dim * slots);
    bs = bytes(o.bias_state(), rows * slots);
    c = bytes(o.update_counts(), rows);
  }
  bool operator==(const snapshot& x) const { return w == x.w && b == x.b && s == x.s && bs == x.bs && c == x.c; }
};


template <class Opt, class B>
void check_optimizer() {
  xs::full_softmax<xs::fp32, B> head(rows, dim, true);
  using gradient = typename xs::full_softmax<xs::fp32, B>::gradient_type;
  gradient g;
  g.dim = dim;
  const std::vector<index_t> touched{1, 3, 7};
  const std::vector<float> values(touched.size() * static_cast<std::size_t>(dim), 0.25f);
  const std::vector<float> bias_values(touched.size(), -0.5f);
  g.rows.assign(touched.begin(), touched.end());
  g.values.assign(values.begin(), values.end());
  g.bias_values.assign(bias_values.begin(), bias_values.end());

  Opt opt(rows, dim, true);
  test_vector<float> w(static_cast<std::size_t>(rows * dim), 0.5f), b(static_cast<std::size_t>(rows), 0.1f);
  const snapshot<Opt> before(opt, w.data(), b.data());
  const snapshot<Opt> head_before(opt, head.weights().data, head.bias());

  // A null weights pointer with a non-zero size (it crashed).
  check_throws<xs::invalid_argument>(
      [&] { opt.step(xs::matrix_view<float>(nullptr, rows, dim), b.data(), g, 0.1f); }, "weights.data is null");
  check_throws<xs::invalid_argument>(
      [&] { opt.step(xs::matrix_view<float>(nullptr, rows, dim), head.bias(), g, 0.1f); }, "weights.data is null");
  // A stride smaller than the columns (it was accepted and wrote overlapping rows).
  check_throws<xs::shape_error>(
      [&] { opt.step(xs::matrix_view<float>(w.data(), rows, dim, 2), b.data(), g, 0.1f); }, "weights.stride = 2");
  // The learning rate: finite and >= 0, for every optimizer and both overloads.
  check_throws<xs::invalid_argument>([&] { opt.step(head, g, -0.1f); }, "-0.1");
  check_throws<xs::invalid_argument>(
      [&] { opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), g, -0.1f); }, "must be >= 0");
  check_throws<xs::invalid_argument>(
      [&] { opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), g, -0.f - 1e-30f); }, "must be >= 0");
  check_throws<xs::non_finite_error>([&] { opt.step(head, g, std::numeric_limits<float>::quiet_NaN()); },
                                            "not finite");
  check_throws<xs::non_finite_error>(
      [&] { opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), g, -std::numeric_limits<float>::infinity()); },
      "not finite");

  CHECK(snapshot<Opt>(opt, w.data(), b.data()) == before);
  CHECK(snapshot<Opt>(opt, head.weights().data, head.bias()) == head_before);
  CHECK(opt.steps() == 0);

  // The boundary and an ordinary rate are accepted.
  opt.step(xs::matrix_view<float>(w.data(), rows, dim), b.data(), g, 0.f);
  opt.step(head, g, 0.1f);
  CHECK(opt.steps() == 2);
  CHECK(bytes(head.weights().data, rows * dim) != head_before.w);
}

template <class B, class State>
void check_all_rules() {
  SUBCASE("momentum") { check_optimizer<xs::sparse_momentum<B, State>, B>(); }
  SUBCASE("adagrad") { check_optimizer<xs::sparse_adagrad<B, State>, B>(); }
  SUBCASE("adam") { check_optimizer<xs::sparse_adam<B, State>, B>(); }
  SUBCASE("lars") { check_optimizer<xs::sparse_lars<B, State>, B>(); }
  SUBCASE("lamb") { check_optimizer<xs::sparse_lamb<B, State>, B>(); }
}

}  // namespace

TEST_CASE_TEMPLATE("optimizer input: null or overlapping weights and a negative or non-finite lr are rejected", B,
                   XSOFTMAX_TEST_BACKENDS) {
  SUBCASE("fp32 state") { check_all_rules<B, float>(); }
  SUBCASE("bf16 state") { check_all_rules<B, __nv_bfloat16>(); }
  SUBCASE("fp16 state") { check_all_rules<B, __half>(); }
}

TEST_CASE("optimizer input: the dense large-batch optimizers keep the same learning-rate rule") {
  xs::lars<> opt({4});
  test_vector<float> w(4, 1.f), g(4, 0.5f);
  const std::vector<xs::dense_layer> layers{{xs::vector_view<float>(w.data(), 4), xs::vector_view<const float>(g.data(), 4)}};
  CHECK_THROWS_AS(opt.step(layers, -0.1f), xs::invalid_argument);
  CHECK_THROWS_AS(opt.step(layers, std::numeric_limits<float>::quiet_NaN()), xs::non_finite_error);
  CHECK(read_back(w.data(), 4) == test_vector<float>(4, 1.f));
  CHECK(opt.steps() == 0);
}
