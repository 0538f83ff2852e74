// SPDX-License-Identifier: Apache-2.0
// kmeans_label_tree (balanced hierarchical k-means over class vectors) and
// init_tree_weights_from_class_vectors, on every backend of the build. Checked: the tree honours the
// tree contract (every class one leaf, paths from the root block, contiguous leaf ranges) for
// N = 1 .. 1000, branching 2 .. 16 and depth limits; siblings' subtrees differ by at most one
// class; the height is ceil(log_b N) (or the depth limit) and every class sits at the height or
// one above; 64 well-separated clusters of 16 classes are recovered (a cluster's classes share
// one node of the tree level that holds 16 or 64 classes: purity >= 0.9, where the same measure on
// a tree over unrelated vectors stays below 0.35); the same seed gives the same tree on serial and
// on omp with 1, 2 and 3 threads; bad arguments throw typed errors naming the value; the weight
// initialisation equals a float64 reference (softmax nodes: each row the mean of its child's
// class vectors; sigmoid nodes: the difference of the two children's means; masked rows of a
// uniform_tree zero; a bias through N x 1 matrices), and a hierarchical_softmax over the new tree
// with those weights gives finite losses, lower than with zero weights on hidden rows near their
// class's vector (and, for a binary tree, equal to the softmax form's: sigmoid(h . (m1 - m2)) is the
// softmax over h . m1 and h . m2).

#include "support/check_throws.hpp"
#include "support/head_checks.hpp"
#include "support/tree_contract.hpp"

#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/kmeans_tree.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using tree_t = xsoftmax::runtime_tree<>;

/// ceil(log_b n) by integer powers (1 for n <= b), sharing no code with the builder.
int ceil_log(index_t n, index_t b) {
  int h = 1;
  for (index_t cap = b; cap < n; cap *= b) ++h;
  return h;
}

test_vector<float> gaussian(test_rng& rng, index_t count) {
  std::normal_distribution<double> normal;
  test_vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = static_cast<float>(normal(rng.gen));
  return v;
}

/// `clusters` well-separated clusters of `per` classes each in d dimensions: centres N(0, I),
/// classes = centre + N(0, noise^2 I); class c is in cluster c % clusters (interleaved, so that
/// class order says nothing about the clusters).
test_vector<float> clustered(test_rng& rng, index_t clusters, index_t per, index_t d, double noise) {
  const auto centres = gaussian(rng, clusters * d);
  const index_t n = clusters * per;
  auto v = gaussian(rng, n * d);
  for (index_t c = 0; c < n; ++c)
    for (index_t p = 0; p < d; ++p)
      v[static_cast<size_t>(c * d + p)] = static_cast<float>(centres[static_cast<size_t>((c % clusters) * d + p)] +
                                                             noise * v[static_cast<size_t>(c * d + p)]);
  return v;
}

/// Mean over clusters of the largest share of a cluster's classes that one node at `level` holds
/// (1: every cluster lies inside one node of that level).
double cluster_purity(const tree_t& t, index_t clusters, int level) {
  const index_t n = t.num_classes(), per = n / clusters;
  double total = 0;
  for (index_t k = 0; k < clusters; ++k) {
    std::map<index_t, index_t> count;
    index_t best = 0;
    for (index_t c = k; c < n; c += clusters) best = std::max(best, ++count[t.step(c, level).block_begin]);
    total += static_cast<double>(best) / static_cast<double>(per);
  }
  return total / static_cast<double>(clusters);
}

bool same_tree(const tree_t& a, const tree_t& b) {
  return a.path_offsets() == b.path_offsets() && a.path_rows() == b.path_rows() && a.leaf_ranks() == b.leaf_ranks() &&
         a.row_children() == b.row_children() && a.block_offsets() == b.block_offsets();
}

/// Rows of `weights` (R x d, fp32) against the float64 means of the class vectors below each row
/// (softmax nodes) or the difference of the two children's means (sigmoid nodes); zero for rows no
/// path reaches. The largest error relative to 1 + |reference|.
template <class Tree>
double worst_init_error(const Tree& t, const test_vector<float>& x, index_t d, const std::vector<float>& weights,
                        bool sigmoid) {
  const index_t rows = t.num_rows();
  std::vector<double> sum(static_cast<size_t>(rows * d), 0.0);
  std::vector<index_t> count(static_cast<size_t>(rows), 0);
  for (index_t c = 0; c < t.num_classes(); ++c)
    for (int l = 0; l < t.depth(c); ++l) {
      const auto s = t.step(c, l);
      const index_t r = s.block_begin + s.child;
      ++count[static_cast<size_t>(r)];
      for (index_t p = 0; p < d; ++p) sum[static_cast<size_t>(r * d + p)] += x[static_cast<size_t>(c * d + p)];
    }
  const auto mean = [&](index_t r, index_t p) {
    return count[static_cast<size_t>(r)] ? sum[static_cast<size_t>(r * d + p)] / count[static_cast<size_t>(r)] : 0.0;
  };
  double worst = 0;
  const index_t out_rows = sigmoid ? rows / 2 : rows;
  for (index_t r = 0; r < out_rows; ++r)
    for (index_t p = 0; p < d; ++p) {
      const double want = sigmoid ? mean(2 * r, p) - mean(2 * r + 1, p) : mean(r, p);
      worst = std::max(worst, std::abs(weights[static_cast<size_t>(r * d + p)] - want) / (1.0 + std::abs(want)));
    }
  return worst;
}

}  // namespace

TEST_CASE_TEMPLATE("kmeans_label_tree: valid, balanced trees of height ceil(log_b N) or the depth limit", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(2901);
  const index_t d = 6;
  for (const index_t n : {index_t(1), index_t(2), index_t(3), index_t(5), index_t(17), index_t(100), index_t(1000)})
    for (const index_t b : {index_t(2), index_t(3), index_t(4), index_t(16)})
      for (const int max_depth : {0, 1, 2})
        for (const bool spherical : {true, false}) {
          const auto x = gaussian(rng, n * d);
          xsoftmax::kmeans_tree_options o;
          o.branching = b;
          o.max_depth = max_depth;
          o.spherical = spherical;
          o.iterations = 3;
          o.seed = static_cast<unsigned long long>(n * 31 + b);
          INFO("N = ", n, ", b = ", b, ", max_depth = ", max_depth, ", spherical = ", spherical);
          const tree_t t = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
          REQUIRE(t.num_classes() == n);
          const auto below = check_tree_contract(t);
          const int natural = ceil_log(n, b), height = max_depth == 0 ? natural : std::min(natural, max_depth);
          CHECK(t.height() == height);
          CHECK(xsoftmax::kmeans_tree_height(n, o) == height);
          for (index_t c = 0; c < n; ++c) CHECK(t.depth(c) >= height - 1);
          // Siblings differ by at most one class; at most b children except at the depth limit.
          const auto& off = t.block_offsets();
          for (size_t k = 0; k + 1 < off.size(); ++k) {
            const auto first = below.begin() + off[k], last = below.begin() + off[k + 1];
            CHECK(*std::max_element(first, last) - *std::min_element(first, last) <= 1);
            if (max_depth == 0) CHECK(off[k + 1] - off[k] <= b);
          }
          if (max_depth == 1 || n <= b) CHECK(t.root_block_size() == n);
          if (n > b && max_depth != 1) {
            CHECK(t.root_block_size() == b);
            // The root's children hold ceil(n / b) then floor(n / b) classes, in that order.
            for (index_t j = 0; j < b; ++j) CHECK(below[static_cast<size_t>(j)] == n / b + (j < n % b ? 1 : 0));
          }
        }
}

TEST_CASE_TEMPLATE("kmeans_label_tree recovers well-separated clusters", B, XSOFTMAX_TEST_BACKENDS) {
  // 64 clusters of 16 classes (N = 1024, d = 32). b = 4: the level-3 nodes hold 16 classes, one
  // cluster each when it is recovered; b = 16: the level-1 nodes hold 64 classes (4 clusters).
  test_rng rng(2902);
  const index_t clusters = 64, per = 16, n = clusters * per, d = 32;
  const auto x = clustered(rng, clusters, per, d, 0.1);
  const auto noise = gaussian(rng, n * d);
  for (const bool spherical : {true, false})
    for (const index_t b : {index_t(4), index_t(16)}) {
      xsoftmax::kmeans_tree_options o;
      o.branching = b;
      o.spherical = spherical;
      o.seed = 7;
      const int level = b == 4 ? 3 : 1;
      const tree_t t = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
      check_tree_contract(t);
      const double purity = cluster_purity(t, clusters, level);
      // The same measure on a tree built from vectors unrelated to the clusters: what chance gives.
      const double chance = cluster_purity(xsoftmax::kmeans_label_tree<B>(cview(noise, n, d), o), clusters, level);
      INFO("b = ", b, ", spherical = ", spherical, ": purity ", purity, ", unrelated vectors ", chance);
      CHECK(purity >= 0.9);
      CHECK(chance < 0.35);
      // With max_depth = 2 and b = 64 (the two-level sqrt(N) shape), the 64 nodes of 16 classes are
      // the clusters.
      if (b == 16) {
        o.branching = 64;
        o.max_depth = 2;
        const tree_t two = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
        CHECK(two.height() == 2);
        CHECK(cluster_purity(two, clusters, 1) >= 0.9);
      }
    }
}

TEST_CASE_TEMPLATE("kmeans_label_tree: the same seed gives the same tree, on serial and omp at any thread count", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(2903);
  const index_t n = 3000, d = 24;
  const auto x = clustered(rng, 50, 60, d, 0.5);
  for (const index_t b : {index_t(2), index_t(5)})
    for (const bool spherical : {true, false}) {
      xsoftmax::kmeans_tree_options o;
      o.branching = b;
      o.spherical = spherical;
      o.seed = 11;
      INFO("b = ", b, ", spherical = ", spherical);
      const tree_t want = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
      CHECK(same_tree(want, xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o)));
#if XSOFTMAX_TEST_HOST_BUILD
      CHECK(same_tree(want, xsoftmax::kmeans_label_tree<xsoftmax::serial>(cview(x, n, d), o)));
      CHECK(same_tree(want, xsoftmax::kmeans_label_tree<xsoftmax::omp>(cview(x, n, d), o)));
      CHECK(same_tree(want, xsoftmax::kmeans_label_tree_on(thrust::omp::par, cview(x, n, d), o)));
#ifdef _OPENMP
      const int saved = omp_get_max_threads();
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        CHECK_MESSAGE(same_tree(want, xsoftmax::kmeans_label_tree<xsoftmax::omp>(cview(x, n, d), o)), threads,
                      " threads");
      }
      omp_set_num_threads(saved);
#endif
#endif
      o.seed = 12;  // another seed draws other initial centroids: some class moves
      CHECK_FALSE(same_tree(want, xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o)));
    }
}

TEST_CASE_TEMPLATE("kmeans_label_tree: bad arguments throw typed errors naming the value", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(2904);
  const index_t n = 40, d = 3;
  auto x = gaussian(rng, n * d);
  xsoftmax::kmeans_tree_options o;
  const auto build = [&](xsoftmax::matrix_view<const float> v, const xsoftmax::kmeans_tree_options& opt) {
    return xsoftmax::kmeans_label_tree<B>(v, opt);
  };
  check_throws<xsoftmax::invalid_argument>([&] { (void)build(cview(x, 0, d), o); }, {"kmeans_label_tree", "0 rows"});
  check_throws<xsoftmax::invalid_argument>([&] { (void)build(cview(x, n, 0), o); }, {"0 columns"});
  check_throws<xsoftmax::invalid_argument>([&] { (void)build({nullptr, n, d}, o); }, {"null"});
  check_throws<xsoftmax::shape_error>([&] { (void)build({x.data(), n, d, d - 1}, o); }, {"stride = 2"});
  auto bad = o;
  bad.branching = 1;
  check_throws<xsoftmax::invalid_argument>([&] { (void)build(cview(x, n, d), bad); }, {"branching = 1"});
  bad = o;
  bad.max_depth = -1;
  check_throws<xsoftmax::invalid_argument>([&] { (void)build(cview(x, n, d), bad); }, {"max_depth = -1"});
  bad = o;
  bad.iterations = -2;
  check_throws<xsoftmax::invalid_argument>([&] { (void)build(cview(x, n, d), bad); }, {"iterations = -2"});
  check_throws<xsoftmax::invalid_argument>([&] { (void)xsoftmax::kmeans_tree_height(0, o); }, {"num_classes = 0"});
  // Deeper than MaxDepth: 40 classes, binary, need height 6.
  check_throws<xsoftmax::tree_error>([&] { (void)xsoftmax::kmeans_label_tree<B, 3>(cview(x, n, d), o); },
                                     {"height 6", "MaxDepth = 3"});
  bad.max_depth = 3;  // ... unless limited
  bad.iterations = 1;
  CHECK(xsoftmax::kmeans_label_tree<B, 3>(cview(x, n, d), bad).height() == 3);
  x[static_cast<size_t>(7 * d + 2)] = std::numeric_limits<float>::quiet_NaN();
  check_throws<xsoftmax::non_finite_error>([&] { (void)build(cview(x, n, d), o); }, {"class_vectors(7, 2)", "nan"});
  x[static_cast<size_t>(7 * d + 2)] = 0.f;
  x[static_cast<size_t>(39 * d + 0)] = -std::numeric_limits<float>::infinity();
  check_throws<xsoftmax::non_finite_error>([&] { (void)build(cview(x, n, d), o); }, {"class_vectors(39, 0)", "inf"});
}

TEST_CASE_TEMPLATE("kmeans_label_tree: degenerate inputs give defined trees", B, XSOFTMAX_TEST_BACKENDS) {
  // Identical vectors (every score ties), zero vectors under spherical k-means, one class.
  const index_t n = 37, d = 4;
  test_vector<float> same(static_cast<size_t>(n * d), 0.5f), zeros(static_cast<size_t>(n * d), 0.f);
  for (const bool spherical : {true, false}) {
    xsoftmax::kmeans_tree_options o;
    o.branching = 3;
    o.spherical = spherical;
    for (const auto* v : {&same, &zeros}) {
      const tree_t t = xsoftmax::kmeans_label_tree<B>(cview(*v, n, d), o);
      check_tree_contract(t);
      CHECK(t.height() == ceil_log(n, 3));
    }
  }
  const tree_t one = xsoftmax::kmeans_label_tree<B>(cview(same, 1, d));
  CHECK(one.num_classes() == 1);
  CHECK(one.root_block_size() == 1);
  CHECK(one.depth(0) == 1);
}

TEST_CASE_TEMPLATE("init_tree_weights_from_class_vectors: rows are the means of the children's class vectors", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(2905);
  const index_t n = 61, d = 21;  // d: a full 16-column block and a partial one
  const auto x = gaussian(rng, n * d);
  const auto check_softmax = [&](const auto& t, const char* what) {
    INFO(what);
    test_vector<float> w(static_cast<size_t>(t.num_rows() * d), 123.f);
    xsoftmax::init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(w, t.num_rows(), d));
    CHECK(worst_init_error(t, x, d, std::vector<float>(w.begin(), w.end()), false) <= 1e-6);
  };
  xsoftmax::kmeans_tree_options o;
  o.branching = 3;
  check_softmax(xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o), "k-means tree, b = 3");
  std::vector<double> counts(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) counts[static_cast<size_t>(c)] = 1.0 + static_cast<double>((c * 7) % 13);
  check_softmax(tree_t::huffman(counts, 4), "Huffman tree, arity 4");
  // A uniform tree over 61 of 64 slots: the masked rows stay zero (the reference's empty rows).
  check_softmax(xsoftmax::uniform_tree<3, 4>(n), "uniform_tree<3, 4>");

  // Sigmoid nodes over a binary k-means tree: row k = mean(first child) - mean(second child).
  o.branching = 2;
  const tree_t binary = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
  REQUIRE(binary.is_binary());
  test_vector<float> w(static_cast<size_t>(binary.num_rows() / 2 * d));
  xsoftmax::init_tree_weights_from_class_vectors<B>(binary, cview(x, n, d), mview(w, binary.num_rows() / 2, d),
                                                    xsoftmax::sigmoid_nodes{});
  CHECK(worst_init_error(binary, x, d, std::vector<float>(w.begin(), w.end()), true) <= 1e-6);

  // A bias: the class biases as N x 1, the head's bias as R x 1.
  const auto class_bias = gaussian(rng, n);
  test_vector<float> bias(static_cast<size_t>(binary.num_rows()));
  xsoftmax::init_tree_weights_from_class_vectors<B>(binary, cview(class_bias, n, 1), mview(bias, binary.num_rows(), 1));
  CHECK(worst_init_error(binary, class_bias, 1, std::vector<float>(bias.begin(), bias.end()), false) <= 1e-6);

  // Strided output and bf16 storage: rounded once from the same means.
  test_vector<__nv_bfloat16> wb(static_cast<size_t>(binary.num_rows() * (d + 3)));
  xsoftmax::init_tree_weights_from_class_vectors<B>(binary, cview(x, n, d), mview(wb, binary.num_rows(), d, d + 3));
  std::vector<float> wf(static_cast<size_t>(binary.num_rows() * d));
  for (index_t r = 0; r < binary.num_rows(); ++r)
    for (index_t p = 0; p < d; ++p)
      wf[static_cast<size_t>(r * d + p)] = xsoftmax::to_float(wb[static_cast<size_t>(r * (d + 3) + p)]);
  CHECK(worst_init_error(binary, x, d, wf, false) <= 1.0 / 128);  // bf16: 8 significant bits
}

TEST_CASE_TEMPLATE("init_tree_weights_from_class_vectors: bad arguments throw and write nothing", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(2906);
  const index_t n = 20, d = 4;
  auto x = gaussian(rng, n * d);
  xsoftmax::kmeans_tree_options o;
  o.branching = 3;
  const tree_t t = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
  const index_t rows = t.num_rows();
  test_vector<float> w(static_cast<size_t>(rows * d), 5.f);
  const auto untouched = [&] { return std::all_of(w.begin(), w.end(), [](float v) { return v == 5.f; }); };
  using xsoftmax::init_tree_weights_from_class_vectors;
  check_throws<xsoftmax::shape_error>(
      [&] { init_tree_weights_from_class_vectors<B>(t, cview(x, n - 1, d), mview(w, rows, d)); },
      {"init_tree_weights_from_class_vectors", "19 rows", "20 classes"});
  check_throws<xsoftmax::shape_error>(
      [&] { init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(w, rows - 1, d)); },
      {"weights is", "expected"});
  check_throws<xsoftmax::shape_error>(
      [&] { init_tree_weights_from_class_vectors<B>(t, cview(x, n, d - 1), mview(w, rows, d)); }, {"weights is"});
  check_throws<xsoftmax::tree_error>(
      [&] {
        init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(w, rows / 2, d), xsoftmax::sigmoid_nodes{});
      },
      {"binary tree"});
  x[static_cast<size_t>(3 * d + 1)] = std::numeric_limits<float>::infinity();
  check_throws<xsoftmax::non_finite_error>(
      [&] { init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(w, rows, d)); }, {"class_vectors(3, 1)"});
  CHECK(untouched());
}

TEST_CASE_TEMPLATE("a hierarchical_softmax over a k-means tree, initialised from the class vectors, runs", B,
                   XSOFTMAX_TEST_BACKENDS) {
  // Class vectors from "a full softmax": clustered weights. Hidden rows near their target's vector
  // (scaled): a head whose nodes start at the subtrees' means must already beat zero weights.
  test_rng rng(2907);
  const index_t clusters = 16, per = 8, n = clusters * per, d = 16, batch = 64;
  const auto x = clustered(rng, clusters, per, d, 0.3);
  const auto targets = random_targets(rng, batch, n);
  test_vector<float> hidden(static_cast<size_t>(batch * d));
  for (index_t i = 0; i < batch; ++i)
    for (index_t p = 0; p < d; ++p)
      hidden[static_cast<size_t>(i * d + p)] = 3.f * x[static_cast<size_t>(targets[static_cast<size_t>(i)] * d + p)];
  const auto loss_of = [&](const auto& head) {
    test_vector<float> per_sample(static_cast<size_t>(batch));
    xsoftmax::loss_options lo;
    lo.reduce = xsoftmax::reduction::none;
    const float sum = head.forward(cview(hidden, batch, d), cvec(targets), lo, mvec(per_sample));
    CHECK(std::isfinite(sum));
    CHECK(std::all_of(per_sample.begin(), per_sample.end(), [](float v) { return std::isfinite(v) && v >= 0.f; }));
    return sum / static_cast<float>(batch);
  };
  for (const index_t b : {index_t(2), index_t(4)}) {
    xsoftmax::kmeans_tree_options o;
    o.branching = b;
    const tree_t t = xsoftmax::kmeans_label_tree<B>(cview(x, n, d), o);
    test_vector<float> w(static_cast<size_t>(t.num_rows() * d)), zero(w.size(), 0.f);
    xsoftmax::init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(w, t.num_rows(), d));
    const xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> head(t, mview(w, t.num_rows(), d));
    const xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B> flat(t, mview(zero, t.num_rows(), d));
    const float initialised = loss_of(head), uniform = loss_of(flat);
    INFO("b = ", b, ": mean loss ", initialised, " initialised, ", uniform, " with zero weights");
    CHECK(uniform == doctest::Approx(std::log(static_cast<double>(n))).epsilon(1e-4));
    // The levels above the clusters are where the class vectors' means separate anything: they
    // should take most of log(16) off the loss (measured: 2.91 of 4.85 for b = 2).
    const float gain = static_cast<float>(0.5 * std::log(static_cast<double>(clusters)));
    CHECK(initialised < uniform - gain);
    if (b == 2) {  // the word2vec form over the same binary tree
      test_vector<float> v(static_cast<size_t>(t.num_rows() / 2 * d));
      xsoftmax::init_tree_weights_from_class_vectors<B>(t, cview(x, n, d), mview(v, t.num_rows() / 2, d),
                                                        xsoftmax::sigmoid_nodes{});
      const xsoftmax::hierarchical_softmax<tree_t, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes> sig(
          t, mview(v, t.num_rows() / 2, d));
      const float s = loss_of(sig);
      INFO("sigmoid nodes: ", s);
      CHECK(s == doctest::Approx(initialised).epsilon(1e-5));  // sigmoid(h . (m1 - m2)): the same model
    }
  }
}
