// SPDX-License-Identifier: Apache-2.0
// What only the cuda backend can get wrong: shapes that are no multiple of any tile, more than 2^31
// weight elements (64-bit offsets), two heads on two streams used from two host threads at once,
// and bad input raising the serial backend's exceptions with the same messages.

#include "support.cuh"

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

TEST_CASE("cuda heads: shapes that are no multiple of any tile") {
  for (index_t rows : {1, 3, 257})
    for (index_t dim : {1, 17, 130})
      for (index_t n : {1, 7, 1001}) {
        rng g(static_cast<unsigned long long>(rows * 1000003 + dim * 1009 + n));
        weights<float> w(g, n, dim, true);
        const batch b = make_batch(g, rows, dim, n, 0.1);
        const xs::full_softmax<xs::fp32, xs::serial> ref(w.host_view(), w.host_bias());
        const xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view(), w.device_bias());
        check_head(ref, dev, b, tolerance_for<float>(),
                   "full B=" + std::to_string(rows) + " d=" + std::to_string(dim) + " N=" + std::to_string(n), 3);
      }
  using R = xs::runtime_tree<>;
  for (index_t n : {2, 7, 1001}) {
    std::vector<double> counts(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) counts[static_cast<std::size_t>(i)] = 1.0 + static_cast<double>((i * 7919) % 13);
    const R tree = R::huffman(counts, 3);
    for (index_t rows : {1, 3, 257}) {
      rng g(static_cast<unsigned long long>(n * 31 + rows));
      weights<float> w(g, tree.num_rows(), 17, true);
      const batch b = make_batch(g, rows, 17, n, 0.1);
      const xs::hierarchical_softmax<R, xs::fp32, xs::serial> ref(tree, w.host_view(), w.host_bias());
      const xs::hierarchical_softmax<R, xs::fp32, xs::cuda> dev(tree, w.device_view(), w.device_bias());
      check_head(ref, dev, b, tolerance_for<float>(), "hs B=" + std::to_string(rows) + " N=" + std::to_string(n), 3);
    }
  }
}

TEST_CASE("cuda full_softmax: more than 2^31 weight elements (64-bit offsets)") {
  // N x 256 bf16 with N = 2^31 / 256 + 1000: 2^31 + 256000 elements, 4.3 GB. All weights are zero
  // except the target's row t = N - 3 (its first element lies past 2^31), so every quantity has a
  // closed form: with h = w_t = 1/16 everywhere (exact in bf16), s_t = 1 and s_c = 0 otherwise.
  const index_t dim = 256, n = (index_t(1) << 31) / dim + 1000, t = n - 3;
  const std::size_t weight_bytes = static_cast<std::size_t>(n * dim) * sizeof(__nv_bfloat16);
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  // forward: weights + ~0.5 GB of scratch; backward adds the fp32 gradient of every row (8.6 GB).
  const std::size_t forward_need = weight_bytes + (std::size_t(1) << 29);
  const std::size_t backward_need = forward_need + static_cast<std::size_t>(n * dim) * sizeof(float);
  if (free_bytes < forward_need) {
    std::printf("xsoftmax_cuda_tests: SKIP the 2^31-element test: %zu bytes free, %zu needed\n", free_bytes,
                forward_need);
    WARN_MESSAGE(false, "SKIP: not enough free GPU memory for the 2^31-element test (", free_bytes, " bytes free, ",
                 forward_need, " needed)");
    return;
  }
  thrust::device_vector<__nv_bfloat16> wd(static_cast<std::size_t>(n * dim), xs::from_float<__nv_bfloat16>(0.f));
  const std::vector<__nv_bfloat16> row(static_cast<std::size_t>(dim), xs::from_float<__nv_bfloat16>(1.f / 16));
  thrust::copy(row.begin(), row.end(), wd.begin() + t * dim);
  xs::full_softmax<xs::bf16, xs::cuda> head(matrix_view<__nv_bfloat16>(raw(wd), n, dim));

  const index_t rows = 2;
  const std::vector<float> h(static_cast<std::size_t>(rows * dim), 1.f / 16);
  const std::vector<index_t> targets{t, 5};
  thrust::device_vector<float> hd = to_device(h);
  thrust::device_vector<index_t> td = to_device(targets);
  const matrix_view<const float> hv(raw(hd), rows, dim);
  const vector_view<const index_t> tv(raw(td), rows);
  const double sum_exp = static_cast<double>(n - 1) + std::exp(1.0);  // sum over classes of exp(s_c)
  const double lse = std::log(sum_exp);

  thrust::device_vector<float> per(2);
  loss_options none;
  none.reduce = reduction::none;
  head.forward(hv, tv, none, vector_view<float>(raw(per), rows));
  const std::vector<float> losses = to_host(per);
  CHECK(losses[0] == doctest::Approx(lse - 1.0).epsilon(1e-4));
  CHECK(losses[1] == doctest::Approx(lse).epsilon(1e-4));

  thrust::device_vector<index_t> cls(2 * 2);
  thrust::device_vector<float> lp(2 * 2);
  head.topk(hv, 2, matrix_view<index_t>(raw(cls), rows, 2), matrix_view<float>(raw(lp), rows, 2));
  const std::vector<index_t> top = to_host(cls);
  CHECK(top[0] == t);
  CHECK(top[1] == 0);  // every other class ties at score 0: the smallest wins
  CHECK(to_host(lp)[0] == doctest::Approx(1.0 - lse).epsilon(1e-4));

  thrust::device_vector<float> dist(2 * 4);
  head.log_distribution(hv, n - 4, n, matrix_view<float>(raw(dist), rows, 4));
  const std::vector<float> dh = to_host(dist);
  CHECK(dh[0] == doctest::Approx(-lse).epsilon(1e-4));
  CHECK(dh[1] == doctest::Approx(1.0 - lse).epsilon(1e-4));  // class t = n - 3

  if (free_bytes < backward_need + (std::size_t(1) << 30)) {
    std::printf("xsoftmax_cuda_tests: skipping the 2^31-element backward: %zu bytes free, %zu needed\n", free_bytes,
                backward_need);
    return;
  }
  // Mean over 2 rows with identical h: G_c = (p_c - [c = t] + p_c - [c = 5]) / 2, p_c = e^{s_c} / sum.
  xs::full_softmax<xs::bf16, xs::cuda>::gradient_type g;
  thrust::device_vector<float> gh(static_cast<std::size_t>(rows * dim));
  head.backward(hv, tv, matrix_view<float>(raw(gh), rows, dim), g);
  REQUIRE(g.num_rows() == n);
  const double p_t = std::exp(1.0) / sum_exp, p_0 = 1.0 / sum_exp;
  const auto grad_row = [&](index_t c) {
    std::vector<float> out(static_cast<std::size_t>(dim));
    thrust::copy(g.values.begin() + c * dim, g.values.begin() + (c + 1) * dim, out.begin());
    return out;
  };
  const std::vector<float> gt = grad_row(t), g5 = grad_row(5), glast = grad_row(n - 1);
  CHECK(gt[dim - 1] == doctest::Approx((2 * p_t - 1) / 2 / 16).epsilon(1e-2));
  CHECK(g5[0] == doctest::Approx((2 * p_0 - 1) / 2 / 16).epsilon(1e-2));
  CHECK(glast[7] == doctest::Approx(2 * p_0 / 2 / 16).epsilon(1e-2));
  // grad_hidden[r] = sum_c G_rc w_c = G_rt w_t = ((p_t - [t_r = t]) / 2) / 16 per element.
  const std::vector<float> ghh = to_host(gh);
  CHECK(ghh[0] == doctest::Approx((p_t - 1) / 2 / 16).epsilon(1e-2));
  CHECK(ghh[dim] == doctest::Approx(p_t / 2 / 16).epsilon(1e-2));
}

TEST_CASE("cuda owned weights of more than 2^31 elements: initial_weight past 2^31 (64-bit fill)") {
  // The owning constructor fills the weights on the device (detail::initial_weight of the element's
  // 64-bit index): elements past 2^31 must get their own values, not a wrapped index's.
  const index_t dim = 256, n = (index_t(1) << 31) / dim + 1000;
  const std::size_t weight_bytes = static_cast<std::size_t>(n * dim) * sizeof(__nv_bfloat16);
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  if (free_bytes < weight_bytes + (std::size_t(1) << 30)) {
    std::printf("xsoftmax_cuda_tests: SKIP the 2^31-element initialisation test: %zu bytes free, %zu needed\n",
                free_bytes, weight_bytes + (std::size_t(1) << 30));
    WARN_MESSAGE(false, "SKIP: not enough free GPU memory for the 2^31-element initialisation test");
    return;
  }
  const xs::full_softmax<xs::bf16, xs::cuda> head(n, dim, false, xs::init_options{21});
  const __nv_bfloat16* w = head.weights().data;
  const index_t last = n * dim - 1, two31 = index_t(1) << 31;
  for (const index_t e : {index_t(0), two31 - 1, two31, two31 + 12345, last}) {
    __nv_bfloat16 got;
    REQUIRE(cudaMemcpy(&got, w + e, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess);
    const float want = xs::to_float(
        xs::from_float<__nv_bfloat16>(xs::detail::initial_weight(21, static_cast<unsigned long long>(e), 1.f / 16)));
    INFO("element " << e);
    CHECK(xs::to_float(got) == want);
  }
}

TEST_CASE("cuda heads on two streams from two host threads equal a sequential run") {
  rng g(61);
  weights<__nv_bfloat16> w(g, 20000, 64, true);
  const batch b1 = make_batch(g, 300, 64, 20000, 0.1), b2 = make_batch(g, 200, 64, 20000, 0.1);
  const device_batch d1(b1), d2(b2);
  using Head = xs::full_softmax<xs::bf16, xs::cuda>;
  loss_options opt;
  // Sequential, on the default stream.
  const Head seq(w.device_view(), w.device_bias());
  const fb_outputs s1 = forward_backward_device(seq, d1, opt, {}), s2 = forward_backward_device(seq, d2, opt, {});

  cudaStream_t st1 = nullptr, st2 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&st1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking) == cudaSuccess);
  {
    const Head h1(w.device_view(), w.device_bias(), xs::cuda_resources(st1));
    const Head h2(w.device_view(), w.device_bias(), xs::cuda_resources(st2));
    constexpr int reps = 4;
    std::vector<fb_outputs> o1(reps), o2(reps);
    std::exception_ptr e1, e2;
    std::thread t1([&] {
      try {
        for (auto& o : o1) o = forward_backward_device(h1, d1, opt, {});
      } catch (...) {
        e1 = std::current_exception();
      }
    });
    std::thread t2([&] {
      try {
        for (auto& o : o2) o = forward_backward_device(h2, d2, opt, {});
      } catch (...) {
        e2 = std::current_exception();
      }
    });
    t1.join();
    t2.join();
    if (e1) std::rethrow_exception(e1);
    if (e2) std::rethrow_exception(e2);
    // cuBLAS promises bitwise reproducibility only while one stream is active (it may choose other
    // kernels under concurrency), so compare with a tight tolerance rather than bit for bit.
    for (int i = 0; i < reps; ++i) {
      check_same_outputs(o1[i], s1, 1e-5, "stream 1, repetition " + std::to_string(i));
      check_same_outputs(o2[i], s2, 1e-5, "stream 2, repetition " + std::to_string(i));
    }
  }
  CHECK(cudaStreamDestroy(st1) == cudaSuccess);
  CHECK(cudaStreamDestroy(st2) == cudaSuccess);
}

TEST_CASE("cuda heads reject bad input with the serial backend's exceptions and messages") {
  rng g(71);
  weights<float> w(g, 50, 8, true);
  batch b = make_batch(g, 6, 8, 50, 0.0);
  const xs::full_softmax<xs::fp32, xs::serial> ref(w.host_view(), w.host_bias());
  const xs::full_softmax<xs::fp32, xs::cuda> dev(w.device_view(), w.device_bias());
  using U = xs::uniform_tree<2, 8>;
  weights<float> hw(g, xs::hierarchical_softmax<U>::weight_rows(U(50)), 8, false);
  const xs::hierarchical_softmax<U, xs::fp32, xs::serial> href(U(50), hw.host_view());
  const xs::hierarchical_softmax<U, xs::fp32, xs::cuda> hdev(U(50), hw.device_view());

  // Inputs: host copies for the serial heads, device copies for the cuda heads.
  // fb_throws: forward_backward rejects the input too (it has no per_sample requirement).
  const auto run_both = [&](const std::string& what, const batch& bb, loss_options opt,
                            const std::vector<float>& grad_output, bool with_per_sample, bool fb_throws = true) {
    const device_batch db(bb);
    thrust::device_vector<float> up = to_device(grad_output), per(static_cast<std::size_t>(bb.rows)),
                                 gh(static_cast<std::size_t>(bb.rows * bb.dim));
    std::vector<float> hper(static_cast<std::size_t>(bb.rows)), hgh(static_cast<std::size_t>(bb.rows * bb.dim));
    const index_t n_per = with_per_sample ? bb.rows : 0, n_up = static_cast<index_t>(grad_output.size());
    const auto host_fb = [&](const auto& head) {
      typename std::decay_t<decltype(head)>::gradient_type gr;
      head.forward_backward(bb.host_view(), vector_view<const index_t>(bb.targets.data(), bb.rows),
                            matrix_view<float>(hgh.data(), bb.rows, bb.dim), gr, opt,
                            vector_view<float>(hper.data(), n_per), vector_view<const float>(grad_output.data(), n_up));
    };
    const auto dev_fb = [&](const auto& head) {
      typename std::decay_t<decltype(head)>::gradient_type gr;
      head.forward_backward(db.view(), db.target_view(), matrix_view<float>(raw(gh), bb.rows, bb.dim), gr, opt,
                            vector_view<float>(raw(per), n_per), vector_view<const float>(raw(up), n_up));
    };
    check_same_error([&] { host_fb(ref); }, [&] { dev_fb(dev); }, "full: " + what, fb_throws);
    check_same_error([&] { host_fb(href); }, [&] { dev_fb(hdev); }, "hs: " + what, fb_throws);
    const auto host_fwd = [&](const auto& head) {
      head.forward(bb.host_view(), vector_view<const index_t>(bb.targets.data(), bb.rows), opt,
                   vector_view<float>(hper.data(), n_per));
    };
    const auto dev_fwd = [&](const auto& head) {
      head.forward(db.view(), db.target_view(), opt, vector_view<float>(raw(per), n_per));
    };
    if (grad_output.empty()) {
      check_same_error([&] { host_fwd(ref); }, [&] { dev_fwd(dev); }, "full forward: " + what);
      check_same_error([&] { host_fwd(href); }, [&] { dev_fwd(hdev); }, "hs forward: " + what);
    }
  };

  loss_options mean;
  batch nan_hidden = b;
  nan_hidden.h[static_cast<std::size_t>(1 * b.stride + 2)] = std::nanf("");
  run_both("NaN hidden", nan_hidden, mean, {}, true);
  batch inf_hidden = b;
  inf_hidden.h[static_cast<std::size_t>(4 * b.stride + 7)] = -INFINITY;
  run_both("-inf hidden", inf_hidden, mean, {}, true);
  batch bad_target = b;
  bad_target.targets[3] = 50;
  run_both("target == N", bad_target, mean, {}, true);
  bad_target.targets[3] = -1;
  run_both("negative target", bad_target, mean, {}, true);
  batch narrow = b;
  narrow.dim = 7;  // stride stays: a view with the wrong number of columns
  run_both("hidden with 7 columns", narrow, mean, {}, true);
  loss_options none;
  none.reduce = reduction::none;
  run_both("reduction none without per_sample", b, none, {}, false, /*fb_throws=*/false);
  run_both("grad_output of the wrong length", b, none, {1.f, 2.f}, true);
  run_both("two grad_output values for mean", b, mean, {1.f, 2.f}, true);
  run_both("NaN grad_output", b, mean, {std::nanf("")}, true);
  std::vector<float> nan_at_2(static_cast<std::size_t>(b.rows), 1.f);
  nan_at_2[2] = INFINITY;
  run_both("inf grad_output of one sample", b, none, nan_at_2, true);

  // Shape errors of the outputs, top-k and log_distribution arguments.
  const device_batch db(b);
  thrust::device_vector<index_t> cls(100);
  thrust::device_vector<float> lp(100);
  std::vector<index_t> hcls(100);
  std::vector<float> hlp(100);
  const auto topk_both = [&](index_t k, index_t out_cols) {
    check_same_error(
        [&] {
          ref.topk(b.host_view(), k, matrix_view<index_t>(hcls.data(), b.rows, out_cols),
                   matrix_view<float>(hlp.data(), b.rows, out_cols));
        },
        [&] {
          dev.topk(db.view(), k, matrix_view<index_t>(raw(cls), b.rows, out_cols),
                   matrix_view<float>(raw(lp), b.rows, out_cols));
        },
        "full topk k=" + std::to_string(k));
    check_same_error(
        [&] {
          href.topk(b.host_view(), k, matrix_view<index_t>(hcls.data(), b.rows, out_cols),
                    matrix_view<float>(hlp.data(), b.rows, out_cols));
        },
        [&] {
          hdev.topk(db.view(), k, matrix_view<index_t>(raw(cls), b.rows, out_cols),
                    matrix_view<float>(raw(lp), b.rows, out_cols));
        },
        "hs topk k=" + std::to_string(k));
  };
  topk_both(0, 1);
  topk_both(51, 1);
  topk_both(2, 3);  // outputs of the wrong width
  xs::search_options negative_beam;
  negative_beam.beam_width = -1;
  check_same_error(
      [&] {
        href.topk(b.host_view(), 2, matrix_view<index_t>(hcls.data(), b.rows, 2),
                  matrix_view<float>(hlp.data(), b.rows, 2), negative_beam);
      },
      [&] {
        hdev.topk(db.view(), 2, matrix_view<index_t>(raw(cls), b.rows, 2), matrix_view<float>(raw(lp), b.rows, 2),
                  negative_beam);
      },
      "hs topk beam_width -1");
  for (const auto& range : std::vector<std::pair<index_t, index_t>>{{-1, 3}, {5, 5}, {10, 51}}) {
    std::vector<float> hout(static_cast<std::size_t>(b.rows * 60));
    thrust::device_vector<float> dout(hout.size());
    const index_t m = std::max<index_t>(range.second - range.first, 1);
    check_same_error(
        [&] { ref.log_distribution(b.host_view(), range.first, range.second, matrix_view<float>(hout.data(), b.rows, m)); },
        [&] { dev.log_distribution(db.view(), range.first, range.second, matrix_view<float>(raw(dout), b.rows, m)); },
        "full log_distribution range");
    check_same_error(
        [&] { href.log_distribution(b.host_view(), range.first, range.second, matrix_view<float>(hout.data(), b.rows, m)); },
        [&] { hdev.log_distribution(db.view(), range.first, range.second, matrix_view<float>(raw(dout), b.rows, m)); },
        "hs log_distribution range");
  }

  // apply_sgd with a gradient row out of range leaves the weights untouched.
  xs::full_softmax<xs::fp32, xs::serial> ref_mut(w.host_view(), w.host_bias());
  xs::full_softmax<xs::fp32, xs::cuda> dev_mut(w.device_view(), w.device_bias());
  xs::full_softmax<xs::fp32, xs::serial>::gradient_type hg;
  xs::full_softmax<xs::fp32, xs::cuda>::gradient_type dg;
  hg.dim = dg.dim = 8;
  const std::vector<index_t> bad_rows{3, 77, 4};
  hg.rows.assign(bad_rows.begin(), bad_rows.end());
  dg.rows = to_device(bad_rows);
  hg.values.assign(24, 1.f);
  dg.values.assign(24, 1.f);
  const std::vector<float> before = to_host(w.dw);
  check_same_error([&] { ref_mut.apply_sgd(hg, 0.1f); }, [&] { dev_mut.apply_sgd(dg, 0.1f); }, "apply_sgd bad row");
  CHECK(bitwise_equal(to_host(w.dw), before));
}

}  // namespace

TEST_CASE("cuda_resources: the workspace keeps what a call needed; reserve_workspace sizes it up front") {
  rng g(21);
  weights<__nv_bfloat16> w(g, 500, 24, true);
  const device_batch db(make_batch(g, 40, 24, 500, 0.0));
  xs::full_softmax<xs::bf16, xs::cuda> head(w.device_view(), w.device_bias());
  head.set_chunk_size(128);
  const xs::cuda_resources& res = head.resources();
  CHECK(res.workspace_bytes() == 0);
  const float first = head.forward(db.view(), db.target_view());  // the tuned bf16 path takes its rows from it
  const std::size_t after_first = res.workspace_bytes();
  CHECK(after_first >= std::size_t(40 * 24 * 2));
  CHECK(head.forward(db.view(), db.target_view()) == first);
  CHECK(res.workspace_bytes() == after_first);  // the same call takes nothing more
  res.reserve_workspace(after_first + 5000);
  CHECK(res.workspace_bytes() >= after_first + 5000);
  CHECK(head.forward(db.view(), db.target_view()) == first);
}
