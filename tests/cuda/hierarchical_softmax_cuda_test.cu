// SPDX-License-Identifier: Apache-2.0
// hierarchical_softmax on the cuda backend against the serial backend: uniform trees and Huffman
// runtime trees, softmax and sigmoid node forms, fp32 / bf16 / fp16, with gemm_min_run chosen so
// that the GEMM path, the gather-dot path and mixes of both run; the grouped and per-run dense paths
// (dense_grouping) on trees with many nodes per level; the cached device copy of a runtime tree;
// beam search; apply_sgd.

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

/// Serial and cuda heads compared with the dense runs of every level forced through each
/// dense_grouping, and the grouped path compared with the per-run path directly. gemm_min_run 1
/// makes every softmax run dense, so a level holds many small dense runs (the grouped path's
/// case); 16 mixes dense and gathered runs within a level.
template <class Tree, class P>
void hs_grouping_against_serial(const Tree& tree, index_t dim, index_t rows, bool bias, unsigned long long seed,
                                const std::string& name) {
  using S = typename P::storage_type;
  using Ref = xs::hierarchical_softmax<Tree, P, xs::serial>;
  using Dev = xs::hierarchical_softmax<Tree, P, xs::cuda>;
  rng g(seed);
  weights<S> w(g, Ref::weight_rows(tree), dim, bias);
  const batch b = make_batch(g, rows, dim, tree.num_classes(), 0.1);
  const device_batch db(b);
  const Ref ref(tree, w.host_view(), w.host_bias());
  std::vector<float> grad_output(static_cast<std::size_t>(b.rows));
  for (auto& x : grad_output) x = g.uniform(0.1f, 2.f);
  loss_options none;
  none.reduce = reduction::none;
  const xs::dense_grouping modes[] = {xs::dense_grouping::per_run, xs::dense_grouping::grouped,
                                      xs::dense_grouping::automatic};
  const char* mode_names[] = {"per_run", "grouped", "automatic"};
  for (index_t min_run : {index_t(1), index_t(16)}) {
    const std::string what = name + "<" + xs::element_name<S>() + "> d=" + std::to_string(dim) +
                             " B=" + std::to_string(rows) + (bias ? " bias" : "") +
                             " gemm_min_run=" + std::to_string(min_run);
    fb_outputs out[3];
    for (int m = 0; m < 3; ++m) {
      Dev dev(tree, w.device_view(), w.device_bias());
      dev.set_gemm_min_run(min_run);
      CHECK(dev.dense_grouping() == xs::dense_grouping::automatic);  // the default
      dev.set_dense_grouping(modes[m]);
      CHECK(dev.dense_grouping() == modes[m]);
      const std::string wm = what + " " + mode_names[m];
      check_head(ref, dev, b, tolerance_for<S>(), wm, 3);
      out[m] = forward_backward_device(dev, db, none, grad_output);
    }
    // grouped and automatic against per_run: same meaning, only the summation order may differ.
    check_same_outputs(out[1], out[0], tolerance_for<S>(), what + ": grouped vs per_run");
    check_same_outputs(out[2], out[0], tolerance_for<S>(), what + ": automatic vs per_run");
  }
}

TEST_CASE("cuda hierarchical_softmax dense grouping over uniform trees equals serial") {
  using T2 = xs::uniform_tree<2, 32>;  // level 1: ~32 nodes of 32 children
  hs_grouping_against_serial<T2, xs::fp32>(T2(1000), 16, 300, true, 61, "uniform<2,32>");
  hs_grouping_against_serial<T2, xs::bf16>(T2(1000), 16, 300, true, 62, "uniform<2,32>");
  hs_grouping_against_serial<T2, xs::fp16>(T2(1000), 16, 300, false, 63, "uniform<2,32>");
  using T3 = xs::uniform_tree<3, 8>;  // level 2: 64 nodes of 8 children
  hs_grouping_against_serial<T3, xs::fp32>(T3(512), 24, 400, false, 64, "uniform<3,8>");
  hs_grouping_against_serial<T3, xs::bf16>(T3(512), 24, 400, true, 65, "uniform<3,8>");
  // One level, one wide block (3000 > one warp's reach): a single run forced through the grouped
  // path (automatic keeps it per run).
  using T1 = xs::uniform_tree<1, 4096>;
  hs_grouping_against_serial<T1, xs::fp32>(T1(3000), 17, 12, true, 66, "uniform<1,4096>");
}

TEST_CASE("cuda hierarchical_softmax dense grouping over Huffman runtime trees equals serial") {
  using R = xs::runtime_tree<>;
  const R binary = R::huffman(zipf_counts(1000), 2);  // levels of very different run lengths
  hs_grouping_against_serial<R, xs::fp32>(binary, 16, 257, true, 71, "huffman2");
  hs_grouping_against_serial<R, xs::fp16>(binary, 16, 257, true, 72, "huffman2");
  const R ternary = R::huffman(zipf_counts(500), 3);
  hs_grouping_against_serial<R, xs::fp32>(ternary, 40, 300, false, 73, "huffman3");
}

TEST_CASE("cuda hierarchical_softmax caches the device copy of a runtime tree") {
  using R = xs::runtime_tree<>;
  const R tree = R::huffman(zipf_counts(1000), 2);
  using Ref = xs::hierarchical_softmax<R, xs::fp32, xs::serial>;
  using Dev = xs::hierarchical_softmax<R, xs::fp32, xs::cuda>;
  rng g(81);
  weights<float> w(g, Ref::weight_rows(tree), 16, true);
  const batch b = make_batch(g, 200, 16, 1000, 0.1);
  const device_batch db(b);
  const Ref ref(tree, w.host_view(), w.host_bias());
  Dev dev(tree, w.device_view(), w.device_bias());
  dev.set_gemm_min_run(1);
  CHECK(dev.backend_cache().get() == nullptr);  // nothing copied before the first verb
  loss_options opt;
  opt.reduce = reduction::sum;
  const std::vector<float> up{1.f};
  const fb_outputs first = forward_backward_device(dev, db, opt, up);
  const void* mirror = dev.backend_cache().get();
  CHECK(mirror != nullptr);
  const fb_outputs second = forward_backward_device(dev, db, opt, up);
  CHECK_MESSAGE(dev.backend_cache().get() == mirror, "the second call rebuilt the device tree");
  CHECK_MESSAGE(bitwise_equal(first, second), "a call with the cached tree differs from the first call");
  check_same_outputs(second, forward_backward_host(ref, b, opt, up), 1e-4, "cached tree vs serial");
  // The other verbs use the same copy; a copy of the head shares it (its tree is equal).
  thrust::device_vector<float> dist(static_cast<std::size_t>(b.rows * 10));
  dev.log_distribution(db.view(), 0, 10, matrix_view<float>(raw(dist), b.rows, 10));
  CHECK(dev.backend_cache().get() == mirror);
  const Dev copy = dev;
  CHECK(copy.backend_cache().get() == mirror);
  const fb_outputs third = forward_backward_device(copy, db, opt, up);
  CHECK(copy.backend_cache().get() == mirror);
  CHECK_MESSAGE(bitwise_equal(first, third), "a copy of the head gives different results");
  // A uniform tree needs no device memory: nothing is cached.
  using T2 = xs::uniform_tree<2, 32>;
  using Dev2 = xs::hierarchical_softmax<T2, xs::fp32, xs::cuda>;
  weights<float> w2(g, T2(1000).num_rows(), 16, false);
  const Dev2 u(T2(1000), w2.device_view());
  const fb_outputs u1 = forward_backward_device(u, db, opt, up);
  CHECK(u.backend_cache().get() == nullptr);
  CHECK(bitwise_equal(u1, forward_backward_device(u, db, opt, up)));
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
