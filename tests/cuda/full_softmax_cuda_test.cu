// SPDX-License-Identifier: Apache-2.0
// full_softmax on the cuda backend against the serial backend: every verb, fp32 / bf16 / fp16,
// with and without bias, ignore_index, several chunk sizes, row blocks; apply_sgd (the workspace: cuda_specific_test.cu).

#include "support.cuh"

#include <xsoftmax/cuda.cuh>

#include <doctest/doctest.h>

#include <string>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

template <class P>
void full_against_serial(index_t n, index_t dim, index_t rows, bool bias, index_t chunk, unsigned long long seed,
                         index_t row_block = 0) {
  using S = typename P::storage_type;
  rng g(seed);
  weights<S> w(g, n, dim, bias);
  const batch b = make_batch(g, rows, dim, n, 0.2);
  const xs::full_softmax<P, xs::serial> ref(w.host_view(), w.host_bias());
  xs::full_softmax<P, xs::cuda> dev(w.device_view(), w.device_bias());
  dev.set_chunk_size(chunk);
  if (row_block > 0) dev.keep_scores_in_row_blocks(row_block);  // nothing recomputed
  const std::string what = std::string("full_softmax<") + xs::element_name<S>() + "> N=" + std::to_string(n) +
                           " d=" + std::to_string(dim) + " B=" + std::to_string(rows) + (bias ? " bias" : "") +
                           " chunk=" + std::to_string(chunk) + " row block=" + std::to_string(row_block);
  check_head(ref, dev, b, tolerance_for<S>(), what, 5);
}

TEST_CASE("cuda full_softmax fp32 equals serial") {
  full_against_serial<xs::fp32>(1000, 16, 37, false, 0, 1);
  full_against_serial<xs::fp32>(1000, 16, 37, true, 0, 2);
  full_against_serial<xs::fp32>(1000, 16, 37, true, 97, 3);  // chunks that do not divide N
  full_against_serial<xs::fp32>(300, 64, 200, true, 64, 4);
}

TEST_CASE("cuda full_softmax bf16 and fp16 equal serial within their tolerance") {
  full_against_serial<xs::bf16>(1000, 16, 37, true, 0, 5);
  full_against_serial<xs::bf16>(513, 33, 70, false, 100, 6);
  full_against_serial<xs::fp16>(1000, 16, 37, true, 0, 7);
  full_against_serial<xs::fp16>(513, 33, 70, false, 100, 8);
}

TEST_CASE("cuda full_softmax in row blocks equals serial without (generic fp32 and tuned bf16 paths)") {
  full_against_serial<xs::fp32>(1000, 16, 37, true, 97, 9, 10);  // blocks of 10, 10, 10, 7 packed rows or fewer
  full_against_serial<xs::bf16>(513, 33, 70, false, 100, 10, 16);
  full_against_serial<xs::bf16>(1000, 16, 37, true, 0, 11, 5);
}

TEST_CASE("cuda full_softmax: every target ignored") {
  rng g(11);
  weights<float> w(g, 50, 8, true);
  batch b = make_batch(g, 6, 8, 50, 0.0);
  for (auto& t : b.targets) t = -100;
  const xs::full_softmax<xs::fp32, xs::serial> ref(w.host_view(), w.host_bias());
  const xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view(), w.device_bias());
  const device_batch db(b);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const fb_outputs h = forward_backward_host(ref, b, opt, {});
    const fb_outputs d = forward_backward_device(dev, db, opt, {});
    check_same_outputs(d, h, 1e-6, "all ignored");
    CHECK(d.grad_rows.empty());
  }
}

TEST_CASE("cuda full_softmax apply_sgd equals serial") {
  rng g(12);
  weights<float> w(g, 200, 16, true);
  const batch b = make_batch(g, 40, 16, 200, 0.1);
  xs::full_softmax<xs::fp32, xs::serial> ref(w.host_view(), w.host_bias());
  xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view(), w.device_bias());
  const device_batch db(b);
  for (int step = 0; step < 3; ++step) {
    xs::full_softmax<xs::fp32, xs::serial>::gradient_type gh;
    xs::full_softmax<xs::fp32, xs::cuda>::gradient_type gd;
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

TEST_CASE("cuda full_softmax owning constructor initialises like serial") {
  const xs::full_softmax<xs::bf16, xs::serial> ref(300, 24, true, xs::init_options{7});
  const xs::full_softmax<xs::bf16, xs::cuda> dev(300, 24, true, xs::init_options{7});
  const matrix_view<__nv_bfloat16> wv = dev.weights();
  std::vector<__nv_bfloat16> host(static_cast<std::size_t>(300 * 24));
  REQUIRE(cudaMemcpy(host.data(), wv.data, host.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost) == cudaSuccess);
  const matrix_view<__nv_bfloat16> rv = ref.weights();
  CHECK(std::memcmp(host.data(), rv.data, host.size() * sizeof(__nv_bfloat16)) == 0);
  rng g(13);
  const batch b = make_batch(g, 20, 24, 300, 0.1);
  check_head(ref, dev, b, tolerance_for<__nv_bfloat16>(), "owning bf16", 3);
}

}  // namespace
