// SPDX-License-Identifier: Apache-2.0
// full_softmax<P, cuda, class_sharding<nccl_communicator>> on a one-rank NCCL communicator
// (ncclCommInitAll over device 0): the device path hands device pointers to NCCL, and with one
// rank every collective is a copy, so loss, per-sample losses, grad_hidden, the weight gradient
// and top-k equal the unsharded cuda head's (to cuBLAS's summation order), in both hidden layouts,
// and repeated runs are bitwise equal. Also the
// communicator's verbs on device memory, and its errors. Several ranks need several GPUs (NCCL
// refuses one GPU twice in a communicator): the multi-rank algorithm is tested under MPI. A
// sharded checkpoint of the NCCL head (device weights) reloads bit for bit. start_all_gather (on the
// communicator's second stream) equals all_gather, and the prefetched verbs of the head
// (gather_rows_async) are bitwise its verbs on hidden. The cuda sharded hierarchical softmax over
// the one-rank NCCL communicator (device buffers handed as they are) equals it over
// solo_communicator (staged through the host) bit for bit.

// First: this test is the self-containment check of the NCCL header.
#include <xsoftmax/sharding/nccl_communicator.cuh>

#include "support.cuh"

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/io/sharded_checkpoint.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <filesystem>

#include <nccl.h>

#include <type_traits>
#include <vector>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

/// A one-rank NCCL communicator on device 0 and a stream of its own (not the heads' stream 0).
struct one_rank_nccl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  one_rank_nccl() {
    const int device = 0;
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    const ncclResult_t r = ncclCommInitAll(&comm, 1, &device);
    REQUIRE_MESSAGE(r == ncclSuccess, "ncclCommInitAll: ", ncclGetErrorString(r));
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~one_rank_nccl() {
    if (stream) cudaStreamDestroy(stream);
    if (comm) ncclCommDestroy(comm);
  }
  one_rank_nccl(const one_rank_nccl&) = delete;
  one_rank_nccl& operator=(const one_rank_nccl&) = delete;
  xs::nccl_communicator communicator() const { return xs::nccl_communicator(comm, stream); }
};

using sharding = xs::class_sharding<xs::nccl_communicator>;

template <class P>
void nccl_sharded_equals_unsharded(index_t n, index_t dim, index_t rows, bool bias, unsigned long long seed) {
  using S = typename P::storage_type;
  one_rank_nccl nccl;
  rng g(seed);
  weights<S> w(g, n, dim, bias);
  const batch b = make_batch(g, rows, dim, n, 0.2);
  const device_batch db(b);
  // fp32: only cuBLAS's summation order may differ (see below). bf16: the unsharded head runs the
  // tensor-core path (hidden rows rounded to bf16) and the sharded one, which combines row
  // statistics across ranks, the generic fp32 kernels (dense_softmax_tuning::applies): the
  // tolerance of bf16 against fp32 (measured on an H100: 3.7e-3 relative in grad_hidden).
  const double tol = std::is_same_v<S, float> ? 1e-5 : tolerance_for<S>();
  const xs::full_softmax<P, xs::cuda> reference(w.device_view(), w.device_bias());
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    CAPTURE(static_cast<int>(layout));
    const xs::full_softmax<P, xs::cuda, sharding> head(sharding(nccl.communicator(), n, layout), w.device_view(),
                                                        w.device_bias());
    REQUIRE(head.local_classes() == n);
    loss_options plain, smooth;
    smooth.reduce = reduction::sum;
    smooth.label_smoothing = 0.1f;
    smooth.z_loss = 1e-3f;
    for (const loss_options& o : {plain, smooth}) {
      const fb_outputs got = forward_backward_device(head, db, o, {});
      const fb_outputs want = forward_backward_device(reference, db, o, {});
      // One rank: the same algorithm on the same values; only the GEMM's view of the hidden rows
      // differs (packed by the sharded path, strided in place by the unsharded one), so allow
      // cuBLAS a different summation order, nothing more.
      check_close(got.loss, want.loss, tol, "loss");
      check_close(got.per_sample, want.per_sample, tol, "per_sample");
      check_close(got.grad_hidden, want.grad_hidden, tol, "grad_hidden");
      CHECK(got.grad_rows == want.grad_rows);
      check_close(got.grad_values, want.grad_values, tol, "grad_weights");
      check_close(got.grad_bias, want.grad_bias, tol, "grad_bias");
      // Repeated runs through NCCL are bitwise equal.
      CHECK(bitwise_equal(forward_backward_device(head, db, o, {}), got));
    }
    constexpr index_t k = 5;
    thrust::device_vector<index_t> c(static_cast<std::size_t>(rows * k)), ref_c(c.size());
    thrust::device_vector<float> v(c.size()), ref_v(c.size());
    head.topk(db.view(), k, matrix_view<index_t>(raw(c), rows, k), matrix_view<float>(raw(v), rows, k));
    reference.topk(db.view(), k, matrix_view<index_t>(raw(ref_c), rows, k), matrix_view<float>(raw(ref_v), rows, k));
    CHECK(to_host(c) == to_host(ref_c));
    check_close(to_host(v), to_host(ref_v), tol, "topk log_probs");
  }
}

}  // namespace

TEST_CASE("nccl_communicator: one-rank collectives on device memory") {
  one_rank_nccl nccl;
  xs::nccl_communicator comm = nccl.communicator();
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(xs::nccl_communicator::device_memory);
  thrust::device_vector<float> x = to_device(std::vector<float>{1.5f, -2.f, 3.25f});
  comm.all_reduce(raw(x), 3, xs::reduce_op::sum);
  CHECK(to_host(x) == std::vector<float>{1.5f, -2.f, 3.25f});
  comm.all_reduce(raw(x), 3, xs::reduce_op::max);
  CHECK(to_host(x) == std::vector<float>{1.5f, -2.f, 3.25f});
  thrust::device_vector<index_t> counts_d = to_device(std::vector<index_t>{7, 9});
  comm.all_reduce(raw(counts_d), 2, xs::reduce_op::sum);
  CHECK(to_host(counts_d) == std::vector<index_t>{7, 9});
  const index_t three = 3;
  thrust::device_vector<float> gathered(3), scattered(3);
  comm.all_gather(raw(x), 3, raw(gathered), &three);
  CHECK(to_host(gathered) == to_host(x));
  comm.reduce_scatter(raw(x), raw(scattered), &three);
  CHECK(to_host(scattered) == to_host(x));
  const index_t two = 2;
  CHECK_THROWS_AS(comm.all_gather(raw(x), 3, raw(gathered), &two), xs::invalid_argument);
  CHECK_THROWS_AS(xs::nccl_communicator(nullptr, nccl.stream), xs::invalid_argument);
}

TEST_CASE("cuda full_softmax over class_sharding<nccl_communicator> (one rank) equals the unsharded head") {
  nccl_sharded_equals_unsharded<xs::fp32>(1000, 16, 37, true, 21);
  nccl_sharded_equals_unsharded<xs::fp32>(300, 64, 200, false, 22);
  nccl_sharded_equals_unsharded<xs::bf16>(513, 33, 70, true, 23);
}

TEST_CASE("sharded checkpoint of a cuda head over class_sharding<nccl_communicator> reloads bit for bit") {
  one_rank_nccl nccl;
  rng g(31);
  weights<float> w(g, 257, 12, true);
  const xs::full_softmax<xs::fp32, xs::cuda, sharding> head(sharding(nccl.communicator(), 257), w.device_view(),
                                                            w.device_bias());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "xsoftmax_nccl_sharded_ckpt";
  std::filesystem::remove_all(dir);
  xs::save_sharded_checkpoint(dir.string(), head);
  xs::full_softmax<xs::fp32, xs::cuda, sharding> back(sharding(nccl.communicator(), 257), 12, true);
  xs::load_sharded_checkpoint(dir.string(), back);
  std::vector<float> got(w.w.size()), bias(w.b.size());
  REQUIRE(cudaMemcpy(got.data(), back.weights().data, got.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(bias.data(), back.bias(), bias.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(bitwise_equal(got, w.w));
  CHECK(bitwise_equal(bias, w.b));
  std::filesystem::remove_all(dir);
}

TEST_CASE("nccl_communicator: start_all_gather on a second stream, and prefetched rows (one rank)") {
  one_rank_nccl nccl;
  xs::nccl_communicator comm = nccl.communicator();
  thrust::device_vector<float> x = to_device(std::vector<float>{1.5f, -2.f, 3.25f}), y(3);
  const index_t three = 3;
  auto r = comm.start_all_gather(raw(x), 3, raw(y), &three);
  r.wait();
  CHECK(r.test());
  CHECK(to_host(y) == to_host(x));
  const index_t two = 2;
  CHECK_THROWS_AS([&] { auto r = comm.start_all_gather(raw(x), 3, raw(y), &two); }(), xs::invalid_argument);

  rng g(41);
  weights<float> w(g, 300, 16, true);
  const batch b = make_batch(g, 29, 16, 300, 0.2);
  const device_batch db(b);
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    CAPTURE(static_cast<int>(layout));
    const xs::full_softmax<xs::fp32, xs::cuda, sharding> head(sharding(nccl.communicator(), 300, layout),
                                                              w.device_view(), w.device_bias());
    auto next = head.gather_rows_async(db.view());  // pending while the verb on hidden runs
    const fb_outputs want = forward_backward_device(head, db, {}, {});
    thrust::device_vector<float> per(static_cast<std::size_t>(b.rows)), gh(static_cast<std::size_t>(b.rows * b.dim));
    decltype(head)::gradient_type gw;
    fb_outputs got;
    got.loss = head.forward_backward(next, db.target_view(), matrix_view<float>(raw(gh), b.rows, b.dim), gw, {},
                                     vector_view<float>(raw(per), b.rows));
    got.per_sample = to_host(per);
    got.grad_hidden = to_host(gh);
    got.grad_rows = to_host(gw.rows);
    got.grad_values = to_host(gw.values);
    got.grad_bias = to_host(gw.bias_values);
    CHECK(bitwise_equal(got, want));
    CHECK_THROWS_AS(head.forward(next, db.target_view()), xs::invalid_argument);  // used already
  }
}

namespace {
/// One step of a cuda sharded HS (loss, per-sample losses, grad_hidden, both weight gradients),
/// log_prob (of `valid`: every target a class, as log_prob requires) and top-k, copied back to the
/// host.
struct hs_outputs {
  float loss = 0.f;
  std::vector<float> per_sample, grad_hidden, top_values, local_values, log_prob, topk_lp;
  std::vector<index_t> top_rows, local_rows, topk_classes;
};

template <class Head>
hs_outputs run_sharded_hs(const Head& head, const thrust::device_vector<float>& h,
                          const thrust::device_vector<index_t>& t, const thrust::device_vector<index_t>& valid,
                          index_t rows, index_t dim, index_t k) {
  hs_outputs o;
  thrust::device_vector<float> per(static_cast<std::size_t>(rows)), gh(static_cast<std::size_t>(rows * dim));
  typename Head::gradient_type gt, gl;
  const matrix_view<const float> hv(raw(h), rows, dim);
  const vector_view<const index_t> tv(raw(t), rows);
  o.loss = head.forward_backward(hv, tv, matrix_view<float>(raw(gh), rows, dim), gt, gl, {},
                                 vector_view<float>(raw(per), rows));
  o.per_sample = to_host(per), o.grad_hidden = to_host(gh);
  o.top_rows = to_host(gt.rows), o.top_values = to_host(gt.values);
  o.local_rows = to_host(gl.rows), o.local_values = to_host(gl.values);
  head.log_prob(hv, vector_view<const index_t>(raw(valid), rows), vector_view<float>(raw(per), rows));
  o.log_prob = to_host(per);
  thrust::device_vector<index_t> c(static_cast<std::size_t>(rows * k));
  thrust::device_vector<float> v(c.size());
  head.topk(hv, k, matrix_view<index_t>(raw(c), rows, k), matrix_view<float>(raw(v), rows, k));
  o.topk_classes = to_host(c), o.topk_lp = to_host(v);
  return o;
}
}  // namespace

TEST_CASE("cuda sharded_hierarchical_softmax over nccl_communicator (one rank) equals it over solo_communicator") {
  // NCCL takes the head's device buffers as they are (device_memory); solo_communicator is a
  // host-memory communicator, so the same head stages rows through host copies. With one rank
  // both are copies: every output is bitwise the same. (The multi-rank routing is tested under MPI
  // and with the host mock of NCCL, tests/sharding/nccl_mock_mpi.cpp.)
  one_rank_nccl nccl;
  constexpr index_t classes = 301, dim = 16, rows = 53, k = 5;
  std::vector<double> freq(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) freq[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
  xs::hs_shard_options o;
  o.cut_depth = 4;
  const xs::hs_shard_plan<> plan(xs::runtime_tree<>::huffman(freq), 1, o);
  rng g(51);
  std::vector<float> top_h(plan.top_rows().size() * dim), local_h(plan.local_rows(0).size() * dim),
      h_h(static_cast<std::size_t>(rows * dim));
  for (auto& x : top_h) x = g.uniform(-0.8f, 0.8f);
  for (auto& x : local_h) x = g.uniform(-0.8f, 0.8f);
  for (auto& x : h_h) x = g.uniform(-1.f, 1.f);
  std::vector<index_t> targets(static_cast<std::size_t>(rows));
  for (auto& x : targets) x = g.integer(0, classes - 1);
  std::vector<index_t> valid = targets;
  targets[3] = -100;  // ignored by the loss; log_prob takes `valid`
  thrust::device_vector<float> top = to_device(top_h), local = to_device(local_h);
  const thrust::device_vector<float> h = to_device(h_h);
  const thrust::device_vector<index_t> t = to_device(targets), tv_valid = to_device(valid);
  const matrix_view<float> tv(raw(top), static_cast<index_t>(plan.top_rows().size()), dim);
  const matrix_view<float> lv(raw(local), static_cast<index_t>(plan.local_rows(0).size()), dim);
  using nccl_head = xs::sharded_hierarchical_softmax<xs::nccl_communicator, xs::softmax_nodes, xs::fp32, xs::cuda>;
  using solo_head = xs::sharded_hierarchical_softmax<xs::solo_communicator, xs::softmax_nodes, xs::fp32, xs::cuda>;
  const nccl_head hn(plan, nccl.communicator(), tv, lv);
  const solo_head hs(plan, xs::solo_communicator{}, tv, lv);
  const hs_outputs a = run_sharded_hs(hn, h, t, tv_valid, rows, dim, k);
  const hs_outputs c = run_sharded_hs(hs, h, t, tv_valid, rows, dim, k);
  CHECK(bitwise_equal(std::vector<float>{a.loss}, std::vector<float>{c.loss}));
  CHECK(bitwise_equal(a.per_sample, c.per_sample));
  CHECK(bitwise_equal(a.grad_hidden, c.grad_hidden));
  CHECK(a.top_rows == c.top_rows);
  CHECK(bitwise_equal(a.top_values, c.top_values));
  CHECK(a.local_rows == c.local_rows);
  CHECK(bitwise_equal(a.local_values, c.local_values));
  CHECK(bitwise_equal(a.log_prob, c.log_prob));
  CHECK(a.topk_classes == c.topk_classes);
  CHECK(bitwise_equal(a.topk_lp, c.topk_lp));
  CHECK(std::isfinite(a.loss));
}
