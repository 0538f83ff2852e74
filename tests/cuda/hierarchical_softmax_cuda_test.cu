// SPDX-License-Identifier: Apache-2.0
// hierarchical_softmax on the cuda backend against the serial backend: uniform trees and Huffman
// runtime trees, softmax and sigmoid node forms, fp32 / bf16 / fp16, with gemm_min_run chosen so
// that the GEMM path, the gather-dot path and mixes of both run; beam search; apply_sgd.

#include "support.cuh"

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

/// Class counts with a long tail (a realistic Huffman tree: depths from 1-2 to ~log2 N + a few).
std::vector<double> zipf_counts(index_t n) {
  std::vector<double> c(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) c[static_cast<std::size_t>(i)] = 1e6 / static_cast<double>(i + 1);
  return c;
}

/// Serial and cuda heads of the same kind over the same weights, compared for several
/// gemm_min_run values (1: every softmax run through the GEMMs; huge: every run of a block up to
/// gather_max_block through gather-dot; 16: the default mix).
template <class Tree, class P, class Form>
void hs_against_serial(const Tree& tree, index_t dim, index_t rows, bool bias, unsigned long long seed,
                       const std::string& name) {
  using S = typename P::storage_type;
  using Ref = xs::hierarchical_softmax<Tree, P, xs::serial, Form>;
  using Dev = xs::hierarchical_softmax<Tree, P, xs::cuda, Form>;
  rng g(seed);
  weights<S> w(g, Ref::weight_rows(tree), dim, bias);
  const batch b = make_batch(g, rows, dim, tree.num_classes(), 0.15);
  const Ref ref(tree, w.host_view(), w.host_bias());
  for (index_t min_run : {index_t(1), index_t(16), index_t(1) << 40}) {
    Dev dev(tree, w.device_view(), w.device_bias());
    dev.set_gemm_min_run(min_run);
    const std::string what = name + "<" + xs::element_name<S>() + (Dev::sigmoid_form ? ", sigmoid" : ", softmax") +
                             "> d=" + std::to_string(dim) + " B=" + std::to_string(rows) + (bias ? " bias" : "") +
                             " gemm_min_run=" + std::to_string(min_run);
    check_head(ref, dev, b, tolerance_for<S>(), what, 4);
  }
}

TEST_CASE("cuda hierarchical_softmax over uniform trees equals serial") {
  using T2 = xs::uniform_tree<2, 32>;
  hs_against_serial<T2, xs::fp32, xs::softmax_nodes>(T2(1000), 16, 300, true, 21, "uniform<2,32>");
  hs_against_serial<T2, xs::fp32, xs::softmax_nodes>(T2(1000), 16, 7, false, 22, "uniform<2,32>");
  using T3 = xs::uniform_tree<3, 2>;  // binary: both node forms
  hs_against_serial<T3, xs::fp32, xs::softmax_nodes>(T3(7), 16, 40, true, 23, "uniform<3,2>");
  hs_against_serial<T3, xs::fp32, xs::sigmoid_nodes>(T3(8), 16, 40, true, 24, "uniform<3,2>");
  hs_against_serial<T2, xs::fp16, xs::softmax_nodes>(T2(1000), 16, 300, true, 25, "uniform<2,32>");
}

TEST_CASE("cuda hierarchical_softmax of depth 1 (one wide block) equals serial") {
  // Depth 1 is the full softmax: the root's block of 1001 rows, dense or gathered by run length;
  // 3000 classes exceed gather_max_block, so that block always takes the GEMM path.
  using T1 = xs::uniform_tree<1, 4096>;
  hs_against_serial<T1, xs::fp32, xs::softmax_nodes>(T1(1001), 17, 12, true, 26, "uniform<1,4096>");
  hs_against_serial<T1, xs::fp32, xs::softmax_nodes>(T1(3000), 17, 5, false, 27, "uniform<1,4096>");
}

TEST_CASE("cuda hierarchical_softmax over Huffman runtime trees equals serial") {
  using R = xs::runtime_tree<>;
  const R binary = R::huffman(zipf_counts(1000), 2);
  hs_against_serial<R, xs::fp32, xs::softmax_nodes>(binary, 16, 257, true, 31, "huffman2");
  hs_against_serial<R, xs::fp32, xs::sigmoid_nodes>(binary, 16, 257, true, 32, "huffman2");
  hs_against_serial<R, xs::bf16, xs::sigmoid_nodes>(binary, 16, 257, false, 33, "huffman2");
  const R ternary = R::huffman(zipf_counts(500), 3);
  hs_against_serial<R, xs::fp32, xs::softmax_nodes>(ternary, 130, 100, false, 34, "huffman3");
  const R tiny = R::huffman(std::vector<double>{5.0}, 2);  // one class: the root has one child
  hs_against_serial<R, xs::fp32, xs::softmax_nodes>(tiny, 3, 3, true, 35, "huffman(1 class)");
}

TEST_CASE("cuda hierarchical_softmax beam search equals serial") {
  using R = xs::runtime_tree<>;
  const R tree = R::huffman(zipf_counts(1000), 2);
  using Ref = xs::hierarchical_softmax<R, xs::fp32, xs::serial>;
  using Dev = xs::hierarchical_softmax<R, xs::fp32, xs::cuda>;
  rng g(41);
  weights<float> w(g, Ref::weight_rows(tree), 16, true);
  const batch b = make_batch(g, 50, 16, 1000, 0.0);
  const device_batch db(b);
  const Ref ref(tree, w.host_view(), w.host_bias());
  const Dev dev(tree, w.device_view(), w.device_bias());
  for (index_t beam : {index_t(1), index_t(3), index_t(8)}) {
    const index_t k = 5;
    xs::search_options so;
    so.beam_width = beam;
    std::vector<index_t> cls_ref(static_cast<std::size_t>(b.rows * k));
    std::vector<float> lp_ref(cls_ref.size());
    ref.topk(b.host_view(), k, matrix_view<index_t>(cls_ref.data(), b.rows, k),
             matrix_view<float>(lp_ref.data(), b.rows, k), so);
    thrust::device_vector<index_t> cls_dev(cls_ref.size());
    thrust::device_vector<float> lp_dev(cls_ref.size());
    dev.topk(db.view(), k, matrix_view<index_t>(raw(cls_dev), b.rows, k), matrix_view<float>(raw(lp_dev), b.rows, k),
             so);
    // fp32 random data: no near ties at the 1e-6 level, so the kept sets and the order are equal.
    CHECK_MESSAGE(to_host(cls_dev) == cls_ref, "beam ", beam, ": classes differ");
    std::vector<float> lp = to_host(lp_dev);
    for (std::size_t i = 0; i < lp.size(); ++i)  // a dry beam gives -inf on both sides
      if (std::isinf(lp_ref[i])) {
        CHECK(std::isinf(lp[i]));
        lp[i] = lp_ref[i] = 0.f;
      }
    check_close(lp, lp_ref, 1e-4, "beam " + std::to_string(beam) + ": log-probabilities");
  }
}

TEST_CASE("cuda hierarchical_softmax apply_sgd equals serial") {
  using T2 = xs::uniform_tree<2, 32>;
  const T2 tree(1000);
  using Ref = xs::hierarchical_softmax<T2, xs::fp32, xs::serial>;
  using Dev = xs::hierarchical_softmax<T2, xs::fp32, xs::cuda>;
  rng g(51);
  weights<float> w(g, Ref::weight_rows(tree), 16, true);
  const batch b = make_batch(g, 100, 16, 1000, 0.1);
  const device_batch db(b);
  Ref ref(tree, w.host_view(), w.host_bias());
  Dev dev(tree, w.device_view(), w.device_bias());
  for (int step = 0; step < 3; ++step) {
    Ref::gradient_type gh;
    Dev::gradient_type gd;
    std::vector<float> grad_h(static_cast<std::size_t>(b.rows * b.dim));
    thrust::device_vector<float> grad_d(grad_h.size());
    ref.backward(b.host_view(), vector_view<const index_t>(b.targets.data(), b.rows),
                 matrix_view<float>(grad_h.data(), b.rows, b.dim), gh);
    dev.backward(db.view(), db.target_view(), matrix_view<float>(raw(grad_d), b.rows, b.dim), gd);
    ref.apply_sgd(gh, 0.5f);
    dev.apply_sgd(gd, 0.5f);
  }
  check_close(to_host(w.dw), w.w, 1e-4, "weights after 3 SGD steps");
  check_close(to_host(w.db), w.b, 1e-4, "bias after 3 SGD steps");
}

}  // namespace
