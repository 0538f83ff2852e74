// SPDX-License-Identifier: Apache-2.0
// The `_async` verbs on the cuda backend against the blocking verbs: fp32 / bf16 / fp16, with and
// without ignored targets, every reduction; and that a data error is thrown with the blocking
// verb's type and message (from the call: validation runs before anything is queued).

#include "support.cuh"

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

/// forward_backward_async with the same buffers as forward_backward_device, then synchronize().
template <class Head>
fb_outputs forward_backward_device_async(const Head& head, const device_batch& db, loss_options opt,
                                         const std::vector<float>& grad_output) {
  thrust::device_vector<float> per(static_cast<std::size_t>(db.rows), std::numeric_limits<float>::quiet_NaN());
  thrust::device_vector<float> gh(static_cast<std::size_t>(db.rows * db.dim), std::numeric_limits<float>::quiet_NaN());
  thrust::device_vector<float> up = to_device(grad_output);
  thrust::device_vector<float> loss(1, std::numeric_limits<float>::quiet_NaN());
  typename Head::gradient_type g;
  head.forward_backward_async(db.view(), db.target_view(), matrix_view<float>(raw(gh), db.rows, db.dim), g,
                              vector_view<float>(raw(loss), 1), opt, vector_view<float>(raw(per), db.rows),
                              vector_view<const float>(raw(up), static_cast<index_t>(grad_output.size())));
  head.resources().synchronize();
  fb_outputs o;
  o.loss = to_host(loss)[0];
  o.per_sample = to_host(per);
  o.grad_hidden = to_host(gh);
  o.grad_rows = to_host(g.rows);
  o.grad_values = to_host(g.values);
  o.grad_bias = to_host(g.bias_values);
  return o;
}

std::string reduction_label(reduction r) {
  return r == reduction::none ? " [none]" : r == reduction::mean ? " [mean]" : " [sum]";
}

/// Every async verb of `dev` against its blocking verb on batch `b`. Without ignored targets the
/// async path of an fp32 head runs the same kernels and GEMMs over the same rows: bit for bit.
/// With ignored ones it runs its GEMMs over all B rows (the ignored ones masked to zero) instead of
/// the packed rows, so cuBLAS may sum in another order; fp16 heads fold the gradient scale into
/// the upstream gradients instead of the GEMMs' alpha (exact in theory, but cuBLAS's epilogue is
/// not ours to promise), and bf16 heads may get other tensor-core kernels than for the packed
/// rows: within `tol` (relative to the largest value) then.
/// `same_path`: the head's async verbs run its blocking code without the final wait (the
/// hierarchical softmax): bit for bit in every case.
template <class Dev>
void async_equals_blocking(const Dev& dev, const batch& b, double tol, const std::string& what, index_t k,
                           bool same_path = false) {
  const device_batch db(b);
  const bool inexact = !same_path && (std::count(b.targets.begin(), b.targets.end(), index_t(-100)) > 0 ||
                                      !std::is_same_v<typename Dev::storage_type, float>);
  rng g(98);
  std::vector<float> grad_output(static_cast<std::size_t>(b.rows));
  for (auto& x : grad_output) x = g.uniform(0.1f, 2.f);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const std::vector<float> up = r == reduction::none ? grad_output : std::vector<float>{0.75f};
    const std::string w = what + reduction_label(r);
    const fb_outputs blocking = forward_backward_device(dev, db, opt, up);
    const fb_outputs async = forward_backward_device_async(dev, db, opt, up);
    if (inexact) {
      check_same_outputs(async, blocking, tol, w + " forward_backward_async");
    } else {
      CHECK_MESSAGE(bitwise_equal(async, blocking), w, ": forward_backward_async differs from forward_backward");
    }

    // forward_async, with per-sample losses (its scores' GEMM runs over all B rows when targets are
    // ignored: tolerance then).
    thrust::device_vector<float> per_a(static_cast<std::size_t>(b.rows)), per_b(static_cast<std::size_t>(b.rows));
    thrust::device_vector<float> loss(1, std::numeric_limits<float>::quiet_NaN());
    const float la = dev.forward(db.view(), db.target_view(), opt, vector_view<float>(raw(per_a), b.rows));
    dev.forward_async(db.view(), db.target_view(), vector_view<float>(raw(loss), 1), opt,
                      vector_view<float>(raw(per_b), b.rows));
    dev.resources().check();
    const float lb = to_host(loss)[0];
    if (inexact) {
      check_close(lb, la, tol, w + ": forward_async loss");
      check_close(to_host(per_b), to_host(per_a), tol, w + ": forward_async per-sample");
    } else {
      CHECK_MESSAGE(std::memcmp(&la, &lb, sizeof la) == 0, w, ": forward_async loss ", lb, " vs ", la);
      CHECK_MESSAGE(bitwise_equal(to_host(per_b), to_host(per_a)), w, ": forward_async per-sample losses");
    }

    // backward_async
    typename Dev::gradient_type ga, gb;
    thrust::device_vector<float> gha(static_cast<std::size_t>(b.rows * b.dim)), ghb(gha.size());
    thrust::device_vector<float> dup = to_device(up);
    const vector_view<const float> upv(raw(dup), static_cast<index_t>(up.size()));
    dev.backward(db.view(), db.target_view(), matrix_view<float>(raw(gha), b.rows, b.dim), ga, opt, upv);
    dev.backward_async(db.view(), db.target_view(), matrix_view<float>(raw(ghb), b.rows, b.dim), gb, opt, upv);
    dev.resources().check();
    if (inexact) {
      check_close(to_host(ghb), to_host(gha), tol, w + ": backward_async grad_hidden");
      check_close(to_host(gb.values), to_host(ga.values), tol, w + ": backward_async weight gradient");
    } else {
      CHECK_MESSAGE(bitwise_equal(to_host(ghb), to_host(gha)), w, ": backward_async grad_hidden");
      CHECK_MESSAGE(bitwise_equal(to_host(gb.values), to_host(ga.values)), w, ": backward_async weight gradient");
      CHECK_MESSAGE(bitwise_equal(to_host(gb.bias_values), to_host(ga.bias_values)), w, ": backward_async bias");
    }
    CHECK(to_host(gb.rows) == to_host(ga.rows));
  }

  // log_prob_async: every target a class, so the rows are the same: bit for bit.
  std::vector<index_t> valid = b.targets;
  for (auto& t : valid) t = t < 0 ? 0 : t;
  thrust::device_vector<index_t> dvalid = to_device(valid);
  thrust::device_vector<float> lpa(static_cast<std::size_t>(b.rows)), lpb(lpa.size());
  dev.log_prob(db.view(), vector_view<const index_t>(raw(dvalid), b.rows), vector_view<float>(raw(lpa), b.rows));
  dev.log_prob_async(db.view(), vector_view<const index_t>(raw(dvalid), b.rows), vector_view<float>(raw(lpb), b.rows));
  dev.resources().check();
  CHECK_MESSAGE(bitwise_equal(to_host(lpb), to_host(lpa)), what, ": log_prob_async");

  // topk_async and log_distribution_async run the blocking verbs' kernels: bit for bit.
  const index_t n = dev.num_classes();
  k = std::min(k, n);
  thrust::device_vector<index_t> ca(static_cast<std::size_t>(b.rows * k)), cb(ca.size());
  thrust::device_vector<float> ta(ca.size()), tb(ca.size());
  dev.topk(db.view(), k, matrix_view<index_t>(raw(ca), b.rows, k), matrix_view<float>(raw(ta), b.rows, k));
  dev.topk_async(db.view(), k, matrix_view<index_t>(raw(cb), b.rows, k), matrix_view<float>(raw(tb), b.rows, k));
  dev.resources().check();
  CHECK_MESSAGE(to_host(cb) == to_host(ca), what, ": topk_async classes");
  CHECK_MESSAGE(bitwise_equal(to_host(tb), to_host(ta)), what, ": topk_async log-probabilities");

  const index_t lo = n / 4, hi = n - 1, m = hi - lo;
  thrust::device_vector<float> da(static_cast<std::size_t>(b.rows * m)), dbv(da.size());
  dev.log_distribution(db.view(), lo, hi, matrix_view<float>(raw(da), b.rows, m));
  dev.log_distribution_async(db.view(), lo, hi, matrix_view<float>(raw(dbv), b.rows, m));
  dev.resources().check();
  CHECK_MESSAGE(bitwise_equal(to_host(dbv), to_host(da)), what, ": log_distribution_async");
}

template <class P>
void async_case(index_t n, index_t dim, index_t rows, bool bias, index_t chunk, double ignore_fraction,
                unsigned long long seed) {
  using S = typename P::storage_type;
  rng g(seed);
  weights<S> w(g, n, dim, bias);
  const batch b = make_batch(g, rows, dim, n, ignore_fraction);
  xs::full_softmax<P, xs::cuda> dev(w.device_view(), w.device_bias());
  dev.set_chunk_size(chunk);
  const std::string what = std::string("async full_softmax<") + xs::element_name<S>() + "> N=" + std::to_string(n) +
                           " B=" + std::to_string(rows) + (bias ? " bias" : "") + " chunk=" + std::to_string(chunk) +
                           " ignored=" + std::to_string(ignore_fraction);
  async_equals_blocking(dev, b, 1e-4, what, 5);
}

template <class Tree, class P>
void hs_async_case(const Tree& tree, index_t dim, index_t rows, bool bias, double ignore_fraction,
                   unsigned long long seed) {
  using S = typename P::storage_type;
  using head_t = xs::hierarchical_softmax<Tree, P, xs::cuda>;
  rng g(seed);
  weights<S> w(g, head_t::weight_rows(tree), dim, bias);
  const batch b = make_batch(g, rows, dim, tree.num_classes(), ignore_fraction);
  head_t dev(tree, w.device_view(), w.device_bias());
  const std::string what = std::string("async hierarchical_softmax<") + xs::element_name<S>() +
                           "> N=" + std::to_string(tree.num_classes()) + " B=" + std::to_string(rows) +
                           (bias ? " bias" : "") + " ignored=" + std::to_string(ignore_fraction);
  for (index_t min_run : {index_t(1), index_t(1) << 40}) {  // GEMM runs (grouped), gather-dot
    dev.set_gemm_min_run(min_run);
    async_equals_blocking(dev, b, 0.0, what + " gemm_min_run=" + std::to_string(min_run), 5, /*same_path=*/true);
  }
}

}  // namespace

TEST_CASE("cuda hierarchical_softmax: the _async verbs equal the blocking verbs, bit for bit") {
  hs_async_case<xs::uniform_tree<2, 32>, xs::fp32>(xs::uniform_tree<2, 32>(1000), 16, 300, true, 0.2, 11);
  hs_async_case<xs::uniform_tree<2, 32>, xs::bf16>(xs::uniform_tree<2, 32>(1000), 16, 300, false, 0.0, 12);
  rng g(13);
  std::vector<double> counts(500);
  for (auto& c : counts) c = 1.0 + g.uniform(0.f, 1000.f);
  const auto huffman = xs::runtime_tree<>::huffman(counts, 3);
  hs_async_case<xs::runtime_tree<>, xs::fp32>(huffman, 24, 150, true, 0.1, 14);
}

TEST_CASE("cuda full_softmax: the _async verbs equal the blocking verbs (fp32)") {
  async_case<xs::fp32>(1000, 16, 37, true, 0, 0.0, 1);
  async_case<xs::fp32>(1000, 16, 37, true, 97, 0.2, 2);
  async_case<xs::fp32>(300, 64, 200, false, 64, 0.3, 3);
}

TEST_CASE("cuda full_softmax: the _async verbs equal the blocking verbs (bf16, fp16)") {
  async_case<xs::bf16>(1000, 16, 37, true, 0, 0.0, 4);
  async_case<xs::bf16>(513, 33, 70, false, 100, 0.2, 5);
  async_case<xs::fp16>(1000, 16, 37, true, 0, 0.0, 6);
  async_case<xs::fp16>(513, 33, 70, true, 100, 0.2, 7);
}

TEST_CASE("cuda full_softmax: _async with every target ignored: zero loss, no gradient rows") {
  rng g(8);
  weights<float> w(g, 50, 8, true);
  batch b = make_batch(g, 6, 8, 50, 0.0);
  for (auto& t : b.targets) t = -100;
  const xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view(), w.device_bias());
  const device_batch db(b);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const fb_outputs d = forward_backward_device_async(dev, db, opt, {});
    CHECK(d.loss == 0.f);
    CHECK(std::all_of(d.per_sample.begin(), d.per_sample.end(), [](float x) { return x == 0.f; }));
    CHECK(std::all_of(d.grad_hidden.begin(), d.grad_hidden.end(), [](float x) { return x == 0.f; }));
    CHECK(d.grad_rows.empty());  // as the blocking verb: no row counts, no row is touched
  }
}

TEST_CASE("cuda full_softmax: data errors of _async verbs are thrown with the blocking message") {
  rng g(10);
  weights<float> w(g, 60, 8, false);
  batch b = make_batch(g, 9, 8, 60, 0.0);
  const xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view());
  thrust::device_vector<float> loss(1), gh(static_cast<std::size_t>(b.rows * b.dim));
  const vector_view<float> lv(raw(loss), 1);

  // A target out of range (and a later one, which must not be the one reported).
  batch bad_t = b;
  bad_t.targets[4] = 60;
  bad_t.targets[7] = -5;
  const device_batch dbt(bad_t);
  check_same_error([&] { (void)dev.forward(dbt.view(), dbt.target_view()); },
                   [&] {
                     dev.forward_async(dbt.view(), dbt.target_view(), lv);  // throws from the call (generic checks)
                     dev.resources().check();
                   },
                   "deferred bad target");
  CHECK_NOTHROW(dev.resources().check());  // reported once

  // A non-finite hidden value, reported before the bad target of the same call.
  batch bad_h = bad_t;
  bad_h.h[static_cast<std::size_t>(6 * bad_h.stride + 2)] = std::numeric_limits<float>::infinity();
  const device_batch dbh(bad_h);
  check_same_error([&] { (void)dev.forward(dbh.view(), dbh.target_view()); },
                   [&] {
                     dev.forward_async(dbh.view(), dbh.target_view(), lv);
                     dev.resources().check();
                   },
                   "deferred non-finite hidden");

  // A non-finite upstream gradient (reduction none, one value per sample).
  const device_batch db(b);
  std::vector<float> up(static_cast<std::size_t>(b.rows), 1.f);
  up[3] = std::numeric_limits<float>::quiet_NaN();
  thrust::device_vector<float> dup = to_device(up);
  loss_options none;
  none.reduce = reduction::none;
  xs::full_softmax<xs::fp32, xs::cuda>::gradient_type grad;
  const matrix_view<float> ghv(raw(gh), b.rows, b.dim);
  const vector_view<const float> upv(raw(dup), b.rows);
  check_same_error([&] { dev.backward(db.view(), db.target_view(), ghv, grad, none, upv); },
                   [&] {
                     dev.backward_async(db.view(), db.target_view(), ghv, grad, none, upv);
                     dev.resources().check();
                   },
                   "deferred non-finite grad_output");

  // The first failure wins across calls, and the next blocking verb throws it.
  check_same_error([&] { (void)dev.forward(dbt.view(), dbt.target_view()); },
                   [&] {
                     dev.forward_async(dbt.view(), dbt.target_view(), lv);  // fails
                     dev.forward_async(dbh.view(), dbh.target_view(), lv);  // fails too, later
                     (void)dev.forward(db.view(), db.target_view());        // good input, blocking
                   },
                   "a blocking verb throws the pending failure");
  CHECK_NOTHROW(dev.resources().check());
  CHECK_NOTHROW((void)dev.forward(db.view(), db.target_view()));

  // Shape errors are thrown by the call itself.
  thrust::device_vector<float> two(2);
  CHECK_THROWS_AS(dev.forward_async(db.view(), db.target_view(), vector_view<float>(raw(two), 2)), xs::shape_error);
  CHECK_THROWS_AS(dev.forward_async(db.view(), vector_view<const index_t>(raw(dbt.targets), b.rows - 1), lv),
                  xs::shape_error);
  CHECK_NOTHROW(dev.resources().check());
}
