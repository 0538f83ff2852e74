// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Test support for the heads: float64 references written as plainly as possible, random problem
/// generators, finite differences and comparison helpers.
///
/// The references know nothing of the library's kernels: a full softmax is a log-sum-exp over every
/// class; a hierarchical softmax walks each class's path through the tree contract
/// (`depth`, `step`) and sums -log p(child | node). Everything is double.

#include "support/test_memory.hpp"

#include <xsoftmax/precision.hpp>
#include <xsoftmax/tree/tree_types.hpp>
#include <xsoftmax/types.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax_test {

using xsoftmax::index_t;
using std::size_t;

// -------------------------------------------------------------------------------------------------
// Random numbers
// -------------------------------------------------------------------------------------------------

/// A seeded generator with the few draws the tests need.
struct test_rng {
  std::mt19937_64 gen;
  explicit test_rng(unsigned long long seed) : gen(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  index_t integer(index_t lo, index_t hi) {  // inclusive
    return std::uniform_int_distribution<index_t>(lo, hi)(gen);
  }
  bool coin(double p) { return uniform(0.0, 1.0) < p; }
};

/// `n` floats uniform in [-scale, scale].
inline test_vector<float> random_floats(test_rng& rng, index_t n, double scale) {
  test_vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.uniform(-scale, scale));
  return v;
}

/// `n` targets in [0, num_classes); about `ignore_fraction` of them set to `ignore_index`.
inline test_vector<index_t> random_targets(test_rng& rng, index_t n, index_t num_classes,
                                           double ignore_fraction = 0.0, index_t ignore_index = -100) {
  test_vector<index_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = rng.coin(ignore_fraction) ? ignore_index : rng.integer(0, num_classes - 1);
  return t;
}

// -------------------------------------------------------------------------------------------------
// Element conversions
// -------------------------------------------------------------------------------------------------

/// Converts floats to a supported element type (round-to-nearest-even for bf16/fp16).
template <class T>
test_vector<T> convert(const test_vector<float>& v) {
  test_vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = xsoftmax::from_float<T>(v[i]);
  return out;
}

/// The exact value of any supported element as a double.
template <class T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return static_cast<double>(xsoftmax::to_float(x));
}

template <class T>
test_vector<double> to_doubles(const test_vector<T>& v) {
  test_vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = as_double(v[i]);
  return out;
}

/// Rounds floats through `T` and back (what a head storing `T` actually sees).
template <class T>
test_vector<float> rounded_through(const test_vector<float>& v) {
  test_vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = xsoftmax::to_float(xsoftmax::from_float<T>(v[i]));
  return out;
}

/// Bitwise equality of two arrays of trivially copyable elements (NaN-safe, distinguishes -0).
template <class T>
bool bitwise_equal(const T* a, const T* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}
template <class V>
bool bitwise_equal(const V& a, const V& b) {
  return a.size() == b.size() && bitwise_equal(a.data(), b.data(), a.size());
}

// -------------------------------------------------------------------------------------------------
// Views
// -------------------------------------------------------------------------------------------------

template <class T>
xsoftmax::matrix_view<const T> cview(const test_vector<T>& v, index_t rows, index_t cols, index_t stride = -1) {
  return {v.data(), rows, cols, stride < 0 ? cols : stride};
}
template <class T>
xsoftmax::matrix_view<T> mview(test_vector<T>& v, index_t rows, index_t cols, index_t stride = -1) {
  return {v.data(), rows, cols, stride < 0 ? cols : stride};
}
template <class T>
xsoftmax::vector_view<const T> cvec(const test_vector<T>& v) {
  return {v.data(), static_cast<index_t>(v.size())};
}
template <class T>
xsoftmax::vector_view<T> mvec(test_vector<T>& v) {
  return {v.data(), static_cast<index_t>(v.size())};
}

// -------------------------------------------------------------------------------------------------
// float64 references
// -------------------------------------------------------------------------------------------------

/// Weights (rows x dim) and optional bias of a reference model, in double.
struct ref_params {
  index_t rows = 0, dim = 0;
  test_vector<double> w;  ///< rows x dim
  test_vector<double> b;  ///< rows entries, or empty for no bias

  [[nodiscard]] double score(index_t row, const double* h) const {
    double s = b.empty() ? 0.0 : b[static_cast<size_t>(row)];
    const double* wr = w.data() + row * dim;
    for (index_t p = 0; p < dim; ++p) s += wr[p] * h[p];
    return s;
  }
};

inline double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

inline double logsumexp(const test_vector<double>& s) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : s) m = std::max(m, x);
  double acc = 0;
  for (double x : s) acc += std::exp(x - m);
  return m + std::log(acc);
}

/// -log p(t | h) of the full softmax over all `p.rows` classes.
inline double full_sample_loss(const ref_params& p, const double* h, index_t t) {
  test_vector<double> s(static_cast<size_t>(p.rows));
  for (index_t c = 0; c < p.rows; ++c) s[static_cast<size_t>(c)] = p.score(c, h);
  return logsumexp(s) - s[static_cast<size_t>(t)];
}

/// -log p(c | h) of a hierarchical softmax: the sum over the internal nodes on c's path (through
/// the tree contract only) of -log p(child | node). Softmax nodes: softmax over the node's block of
/// child rows. Sigmoid nodes (binary trees): the node's one weight row is block_begin / 2 (blocks
/// of two rows stacked: row k of the sigmoid weights belongs to the node whose block is rows
/// [2k, 2k + 2)), and p(first child) = sigmoid(score), p(second child) = sigmoid(-score).
template <class TreeView>
double hs_sample_loss(const TreeView& tree, const ref_params& p, const double* h, index_t c, bool sigmoid) {
  double loss = 0;
  for (int l = 0; l < tree.depth(c); ++l) {
    const xsoftmax::path_step s = tree.step(c, l);
    if (sigmoid) {
      const double x = p.score(s.block_begin / 2, h);
      loss += s.child == 0 ? softplus(-x) : softplus(x);
    } else {
      test_vector<double> sc(static_cast<size_t>(s.block_size));
      for (index_t j = 0; j < s.block_size; ++j) sc[static_cast<size_t>(j)] = p.score(s.block_begin + j, h);
      loss += logsumexp(sc) - sc[static_cast<size_t>(s.child)];
    }
  }
  return loss;
}

/// A per-sample reference loss: (params, hidden row, target) -> -log p(target | row).
using sample_loss_fn = std::function<double(const ref_params&, const double*, index_t)>;

inline sample_loss_fn full_reference() { return full_sample_loss; }

/// The loss with logit soft-capping `cap` (every score c becomes cap tanh(c / cap); 0: none), label
/// smoothing `eps` and z-loss `z`: lse - (1 - eps) s_t - eps mean(s) + z lse^2 over the classes
/// `classes(t)` (all when empty). With `class_weight` (one per class) and eps > 0, PyTorch's
/// `F.cross_entropy(weight=w, label_smoothing=eps)` written out:
///   w_t ((1 - eps) (lse - s_t) + z lse^2) + eps / n sum_c w_c (lse - s_c)
/// (`reference_objective` then does not weigh the sample again).
inline sample_loss_fn softcapped_reference(double cap, double eps = 0, double z = 0,
                                           std::function<std::vector<index_t>(index_t)> classes = {},
                                           std::vector<double> class_weight = {}) {
  return [=](const ref_params& p, const double* h, index_t t) {
    std::vector<index_t> set;
    if (classes) set = classes(t);
    else
      for (index_t c = 0; c < p.rows; ++c) set.push_back(c);
    test_vector<double> s;
    double target = 0, sum = 0, weighted_sum = 0, weight = 0;
    for (index_t c : set) {
      const double score = p.score(c, h);
      s.push_back(cap > 0 ? cap * std::tanh(score / cap) : score);
      sum += s.back();
      if (!class_weight.empty()) {
        weighted_sum += class_weight[static_cast<size_t>(c)] * s.back();
        weight += class_weight[static_cast<size_t>(c)];
      }
      if (c == t) target = s.back();
    }
    const double lse = logsumexp(s), n = static_cast<double>(set.size());
    if (!class_weight.empty() && eps > 0)
      return class_weight[static_cast<size_t>(t)] * ((1 - eps) * (lse - target) + z * lse * lse) +
             eps / n * (weight * lse - weighted_sum);
    return lse - (1 - eps) * target - eps * sum / n + z * lse * lse;
  };
}

/// The loss with label smoothing `eps` and z-loss `z` (no cap); `class_weight` as `softcapped_reference`.
inline sample_loss_fn smoothed_reference(double eps, double z, std::function<std::vector<index_t>(index_t)> classes = {},
                                         std::vector<double> class_weight = {}) {
  return softcapped_reference(0, eps, z, std::move(classes), std::move(class_weight));
}

template <class TreeView>
sample_loss_fn hs_reference(TreeView tree, bool sigmoid = false) {
  return [tree, sigmoid](const ref_params& p, const double* h, index_t c) {
    return hs_sample_loss(tree, p, h, c, sigmoid);
  };
}

/// A batch in double: hidden (rows x dim) and targets.
struct ref_batch {
  index_t rows = 0, dim = 0;
  test_vector<double> h;
  test_vector<index_t> targets;
};

/// The scalar objective a head's gradients differentiate: with upstream gradient `grad_output`
/// (empty: 1; a scalar for mean/sum; one value per sample for none),
///   mean: g * sum_valid(loss_i) / count_valid,  sum: g * sum_valid(loss_i),  none: sum_i g_i loss_i.
/// Returns that value; `per_sample` (if given) receives each loss (0 for ignored samples), and
/// `reduced` (if given) the value `forward` returns (mean / sum / plain sum for none).
inline double reference_objective(const sample_loss_fn& loss, const ref_params& p, const ref_batch& b,
                                  xsoftmax::loss_options opt, const test_vector<float>& grad_output = {},
                                  test_vector<double>* per_sample = nullptr, double* reduced = nullptr) {
  double total = 0, weighted = 0;
  double count = 0;  // the mean's divisor: samples, or their total class weight
  if (per_sample) per_sample->assign(static_cast<size_t>(b.rows), 0.0);
  for (index_t i = 0; i < b.rows; ++i) {
    const index_t t = b.targets[static_cast<size_t>(i)];
    if (t == opt.ignore_index) continue;
    // Class weights (host-readable memory in the tests): the sample's loss times its class's weight;
    // with label smoothing PyTorch weighs each class of the loss instead, which the reference
    // loss does itself (`softcapped_reference` with class weights). The mean divides by the sum of w_t.
    const double cw = opt.class_weight.size ? static_cast<double>(opt.class_weight.data[t]) : 1.0;
    const double l = (opt.label_smoothing > 0 ? 1.0 : cw) * loss(p, b.h.data() + i * b.dim, t);
    if (per_sample) (*per_sample)[static_cast<size_t>(i)] = l;
    total += l;
    count += cw;
    const double g = opt.reduce == xsoftmax::reduction::none
                         ? (grad_output.empty() ? 1.0 : grad_output[static_cast<size_t>(i)])
                         : (grad_output.empty() ? 1.0 : grad_output[0]);
    weighted += g * l;
  }
  const bool mean = opt.reduce == xsoftmax::reduction::mean;
  if (reduced) *reduced = mean ? (count > 0 ? total / count : 0.0) : total;
  return mean ? (count > 0 ? weighted / count : 0.0) : weighted;
}

/// log p(c | h) for every class c of every row, in double (B x N).
inline test_vector<double> reference_log_distribution(const sample_loss_fn& loss, const ref_params& p,
                                                      const ref_batch& b, index_t num_classes) {
  test_vector<double> out(static_cast<size_t>(b.rows * num_classes));
  for (index_t i = 0; i < b.rows; ++i)
    for (index_t c = 0; c < num_classes; ++c)
      out[static_cast<size_t>(i * num_classes + c)] = -loss(p, b.h.data() + i * b.dim, c);
  return out;
}

/// Row i's classes of a B x n log-distribution (`reference_log_distribution`), best first, ties:
/// smaller class first (the heads' top-k order).
inline test_vector<index_t> reference_topk_order(const test_vector<double>& log_dist, index_t i, index_t n) {
  test_vector<index_t> order(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) order[static_cast<size_t>(c)] = c;
  const double* row = log_dist.data() + i * n;
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return row[a] > row[b]; });
  return order;
}

/// Central finite differences of `reference_objective` in double with respect to every weight,
/// every bias entry and every hidden value.
struct fd_gradients {
  test_vector<double> w, b, h;
};

inline fd_gradients finite_differences(const sample_loss_fn& loss, ref_params p, ref_batch b,
                                       xsoftmax::loss_options opt, const test_vector<float>& grad_output = {}) {
  // eps = 1e-5: truncation error ~ eps^2 * |f'''| ~ 1e-10, rounding ~ 1e-16 / eps ~ 1e-11.
  constexpr double eps = 1e-5;
  auto f = [&]() { return reference_objective(loss, p, b, opt, grad_output); };
  auto diff = [&](test_vector<double>& x) {
    test_vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double fp = f();
      x[i] = x0 - eps;
      const double fm = f();
      x[i] = x0;
      g[i] = (fp - fm) / (2 * eps);
    }
    return g;
  };
  fd_gradients g;
  g.w = diff(p.w);
  g.b = diff(p.b);
  g.h = diff(b.h);
  return g;
}

// -------------------------------------------------------------------------------------------------
// Sparse gradients
// -------------------------------------------------------------------------------------------------

/// A sparse weight gradient scattered to dense rows x dim (and bias, rows entries). Checks that the
/// gradient's rows are in range and unique.
struct dense_gradient {
  test_vector<double> w, b;
  test_vector<char> touched;
};

template <class Gradient>
dense_gradient scatter_gradient(const Gradient& device_or_host, index_t rows, index_t dim, bool bias) {
  struct {
    index_t dim;
    thrust::host_vector<index_t> rows;
    thrust::host_vector<float> values, bias_values;
    [[nodiscard]] index_t num_rows() const { return static_cast<index_t>(rows.size()); }
  } const g{device_or_host.dim, on_host(device_or_host.rows), on_host(device_or_host.values),
            on_host(device_or_host.bias_values)};
  dense_gradient out;
  out.w.assign(static_cast<size_t>(rows * dim), 0.0);
  out.b.assign(bias ? static_cast<size_t>(rows) : 0, 0.0);
  out.touched.assign(static_cast<size_t>(rows), 0);
  REQUIRE(g.dim == dim);
  REQUIRE(static_cast<index_t>(g.values.size()) == g.num_rows() * dim);
  REQUIRE(static_cast<index_t>(g.bias_values.size()) == (bias ? g.num_rows() : 0));
  for (index_t i = 0; i < g.num_rows(); ++i) {
    const index_t r = g.rows[static_cast<size_t>(i)];
    REQUIRE(r >= 0);
    REQUIRE(r < rows);
    INFO("gradient row ", r, " listed twice");
    REQUIRE(out.touched[static_cast<size_t>(r)] == 0);
    out.touched[static_cast<size_t>(r)] = 1;
    for (index_t j = 0; j < dim; ++j) out.w[static_cast<size_t>(r * dim + j)] = g.values[static_cast<size_t>(i * dim + j)];
    if (bias) out.b[static_cast<size_t>(r)] = g.bias_values[static_cast<size_t>(i)];
  }
  return out;
}

/// Bitwise equality of two sparse gradients (rows, values and bias values, in order).
template <class Gradient>
bool same_gradient(const Gradient& a, const Gradient& b) {
  // on_host: the vectors may be device vectors (cuda backend).
  return a.dim == b.dim && bitwise_equal(on_host(a.rows), on_host(b.rows)) &&
         bitwise_equal(on_host(a.values), on_host(b.values)) &&
         bitwise_equal(on_host(a.bias_values), on_host(b.bias_values));
}

// -------------------------------------------------------------------------------------------------
// Comparisons
// -------------------------------------------------------------------------------------------------

/// Checks |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for every i, with one doctest
/// assertion per array; on failure names the worst index and the number of violations.
template <class A, class E, class = std::enable_if_t<!std::is_arithmetic_v<A>>>
void check_close(const A& actual, const E& expected, double atol, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(actual.size() == expected.size(), what, ": sizes ", actual.size(), " vs ", expected.size());
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
    const double err = std::abs(a - e), tol = atol + rtol * std::abs(e);
    if (!(err <= tol)) {
      ++bad;
      if (!(err - tol <= worst_excess)) {
        worst_excess = err - tol;
        worst = i;
      }
    }
  }
  std::ostringstream msg;
  if (bad) {
    msg << what << ": " << bad << " of " << actual.size() << " entries outside atol " << atol << " + rtol "
        << rtol << "; worst [" << worst << "]: " << static_cast<double>(actual[worst]) << " vs expected "
        << static_cast<double>(expected[worst]);
  }
  CHECK_MESSAGE(bad == 0, msg.str());
}

/// The largest |x| of an array (0 when empty): the scale of a tolerance relative to a whole output.
template <class V>
double largest_magnitude(const V& v) {
  double m = 0;
  for (std::size_t i = 0; i < v.size(); ++i) m = std::max(m, std::abs(static_cast<double>(v[i])));
  return m;
}

inline void check_close(double actual, double expected, double atol, double rtol, const std::string& what) {
  check_close(test_vector<double>{actual}, test_vector<double>{expected}, atol, rtol, what);
}

/// A readable name for a backend / precision, for INFO lines.
template <class B>
const char* backend_name() {
  return xsoftmax::backend_traits<B>::name;
}

// -------------------------------------------------------------------------------------------------
// Random trees as parent arrays
// -------------------------------------------------------------------------------------------------

/// A tree given as a parent array over nodes with a class on every leaf (the input of
/// `runtime_tree::from_parents(parent, leaf_class, num_classes)`).
struct parent_array_tree {
  std::vector<index_t> parent;      // host-side tree description (runtime_tree takes std::vector)
  std::vector<index_t> leaf_class;
  index_t num_classes = 0;
  int height = 0;
};

/// A random tree of height exactly `height`: every internal node has 2..max_branching children
/// (rarely just one); the first node of every level is internal so the height is reached; other
/// nodes are internal with probability 0.5 while fewer than `node_budget` nodes exist. Node ids and
/// class ids are shuffled, so neither follows the layout.
inline parent_array_tree random_parent_tree(test_rng& rng, int height, int max_branching, index_t node_budget) {
  std::vector<index_t> parent{-1};
  std::vector<int> level{0};
  std::vector<char> internal;
  for (size_t head = 0; head < parent.size(); ++head) {
    const int l = level[head];
    const bool first_of_level = head == 0 || level[head - 1] != l;
    const bool make_internal =
        l < height && (first_of_level || (static_cast<index_t>(parent.size()) < node_budget && rng.coin(0.5)));
    internal.push_back(make_internal ? 1 : 0);
    if (!make_internal) continue;
    const index_t kids = rng.coin(0.05) ? 1 : rng.integer(2, max_branching);
    for (index_t k = 0; k < kids; ++k) {
      parent.push_back(static_cast<index_t>(head));
      level.push_back(l + 1);
    }
  }
  const auto m = static_cast<index_t>(parent.size());
  std::vector<index_t> perm(static_cast<size_t>(m));
  std::iota(perm.begin(), perm.end(), index_t(0));
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  parent_array_tree t;
  t.height = height;
  t.parent.assign(static_cast<size_t>(m), -1);
  t.leaf_class.assign(static_cast<size_t>(m), -1);
  std::vector<index_t> leaves;
  for (index_t i = 0; i < m; ++i) {
    const index_t p = parent[static_cast<size_t>(i)];
    t.parent[static_cast<size_t>(perm[static_cast<size_t>(i)])] = p < 0 ? -1 : perm[static_cast<size_t>(p)];
    if (!internal[static_cast<size_t>(i)]) leaves.push_back(perm[static_cast<size_t>(i)]);
  }
  std::shuffle(leaves.begin(), leaves.end(), rng.gen);
  t.num_classes = static_cast<index_t>(leaves.size());
  for (index_t c = 0; c < t.num_classes; ++c)
    t.leaf_class[static_cast<size_t>(leaves[static_cast<size_t>(c)])] = c;
  return t;
}

/// Zipf-like class counts with some noise (a realistic input for Huffman trees).
inline std::vector<long long> zipf_counts(test_rng& rng, index_t n) {
  std::vector<long long> counts(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c)
    counts[static_cast<size_t>(c)] = 1 + static_cast<long long>(10000.0 / (c + 1)) + rng.integer(0, 5);
  std::shuffle(counts.begin(), counts.end(), rng.gen);
  return counts;
}

/// The rows a hierarchical softmax's sparse gradient must hold: every row of every block on the
/// path of some non-ignored target (softmax nodes), or each such node's one row (sigmoid nodes).
template <class TreeView>
test_vector<index_t> expected_touched_rows(const TreeView& tree, const test_vector<index_t>& targets,
                                           index_t ignore_index, bool sigmoid) {
  test_vector<index_t> rows;
  for (index_t t : targets) {
    if (t == ignore_index) continue;
    for (int l = 0; l < tree.depth(t); ++l) {
      const xsoftmax::path_step s = tree.step(t, l);
      if (sigmoid) rows.push_back(s.block_begin / 2);
      else
        for (index_t j = 0; j < s.block_size; ++j) rows.push_back(s.block_begin + j);
    }
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace xsoftmax_test
