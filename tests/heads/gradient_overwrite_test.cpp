// SPDX-License-Identifier: Apache-2.0
// A training step writes every value of its weight gradient: the results do not depend on what the
// gradient's buffers held before. The contract a caller that reuses one `sparse_gradient` object
// relies on, and what a gradient that is not value-initialised when sized would need (the PyTorch
// package's device gradients are fresh per step, and Thrust's fill of them waits for the stream:
// bench/RESULTS.md, stop 51). Checked for every head's step on every backend (cuda in the GPU test
// binary: its tuned kernels are the ones a no-fill gradient would rely on): a step into a
// gradient whose buffers already have the step's sizes and hold NaN (so that resizing keeps them)
// gives bitwise the gradient, loss and hidden gradient of the same step into a fresh object.
// Heads: full softmax (with bias), hierarchical softmax (uniform 2 levels, softmax nodes; binary
// Huffman, sigmoid nodes), sampled, KNN and per-sample selective softmax.

#include "support/head_checks.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include "support/per_sample_lists.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;

/// The step into a fresh gradient, then into one that already holds that step's sizes, all NaN.
template <class Head>
void check_overwrites(const Head& head, index_t rows, index_t dim, index_t classes, const std::string& what) {
  test_rng rng(3);
  const test_vector<float> h = random_floats(rng, rows * dim, 1.0);
  const test_vector<index_t> t = random_targets(rng, rows, classes, 0.1);
  const auto hv = xsoftmax::matrix_view<const float>(h.data(), rows, dim);
  test_vector<float> gh_fresh(static_cast<std::size_t>(rows * dim)), gh_reused(gh_fresh.size());
  typename Head::gradient_type fresh, reused;
  const float loss_fresh = head.forward_backward(hv, cvec(t), mview(gh_fresh, rows, dim), fresh);
  reused.rows.resize(fresh.rows.size());
  reused.values.resize(fresh.values.size());
  reused.bias_values.resize(fresh.bias_values.size());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  thrust::fill(reused.values.begin(), reused.values.end(), nan);
  thrust::fill(reused.bias_values.begin(), reused.bias_values.end(), nan);
  thrust::fill(reused.rows.begin(), reused.rows.end(), index_t(-7));
  const float loss_reused = head.forward_backward(hv, cvec(t), mview(gh_reused, rows, dim), reused);
  CHECK_MESSAGE(bitwise_equal(&loss_reused, &loss_fresh, 1), what, ": loss");
  CHECK_MESSAGE(bitwise_equal(gh_reused, gh_fresh), what, ": grad_hidden");
  CHECK_MESSAGE(same_gradient(reused, fresh), what, ": the weight gradient depends on its buffers' earlier contents");
  CHECK_MESSAGE(fresh.num_rows() > 0, what, ": a step touches rows");
}

}  // namespace

TEST_CASE_TEMPLATE("a training step writes every value of its weight gradient, every head", B, XSOFTMAX_TEST_BACKENDS) {
  const index_t rows = 48, dim = 8, classes = 300;
  {
    const xsoftmax::full_softmax<xsoftmax::fp32, B> head(classes, dim, /*with_bias=*/true);
    check_overwrites(head, rows, dim, classes, "full softmax");
  }
  {
    const xsoftmax::hierarchical_softmax<xsoftmax::uniform_tree<2, 20>, xsoftmax::fp32, B> head(
        xsoftmax::uniform_tree<2, 20>(classes), dim, /*with_bias=*/true);
    check_overwrites(head, rows, dim, classes, "HS, uniform 2 levels");
  }
  {
    std::vector<double> counts(static_cast<std::size_t>(classes));
    for (index_t c = 0; c < classes; ++c) counts[static_cast<std::size_t>(c)] = 1000.0 / static_cast<double>(c + 1);
    const xsoftmax::hierarchical_softmax<xsoftmax::runtime_tree<>, xsoftmax::fp32, B, xsoftmax::sigmoid_nodes> head(
        xsoftmax::runtime_tree<>::huffman(counts, 2), dim);
    check_overwrites(head, rows, dim, classes, "HS, binary Huffman, sigmoid nodes");
  }
  {
    xsoftmax::sampling_options so;
    so.num_sampled = 30;
    const xsoftmax::selective_softmax<xsoftmax::sampled_negatives, xsoftmax::fp32, B> head(
        xsoftmax::sampled_negatives::log_uniform(classes, so), classes, dim);
    check_overwrites(head, rows, dim, classes, "sampled softmax");
  }
  {
    xsoftmax::knn_options ko;
    ko.graph.k = 6;
    const xsoftmax::knn_softmax<xsoftmax::fp32, B> head(classes, dim, ko);
    check_overwrites(head, rows, dim, classes, "KNN softmax");
  }
  {
    const xsoftmax::explicit_candidates lists = xsoftmax_test::per_sample_lists(rows, classes, 5);
    const xsoftmax::selective_softmax<xsoftmax::explicit_candidates, xsoftmax::fp32, B> head(lists, classes, dim);
    check_overwrites(head, rows, dim, classes, "per-sample selective softmax");
  }
}
