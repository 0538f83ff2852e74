// SPDX-License-Identifier: Apache-2.0
// The tuned CUDA dense softmax (detail/cuda/dense_tuned.cuh, bf16/fp16 tensor cores) against its
// oracle, the generic primitive on the same backend: loss, grad_h, grad_w and grad_b, over several
// chunks, with and without bias, within the storage type's tolerance (support.cuh).

#include "support.cuh"

#include <xsoftmax/detail/primitives/dense_softmax.hpp>

namespace xs = xsoftmax;

namespace {

using namespace xsoftmax_cuda_test;

template <class T>
void tuned_equals_generic(index_t rows, index_t n, index_t d, index_t chunk, bool with_bias, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> h(static_cast<std::size_t>(rows * d)), up(static_cast<std::size_t>(rows));
  std::vector<T> w(static_cast<std::size_t>(n * d)), b(static_cast<std::size_t>(n));
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (auto& x : h) x = nd(g);
  for (auto& x : w) x = xs::from_float<T>(0.3f * nd(g));
  for (auto& x : b) x = xs::from_float<T>(0.1f * nd(g));
  for (auto& x : up) x = 1.f / static_cast<float>(rows);
  for (auto& x : t) x = static_cast<index_t>(g() % n);
  const auto dh = to_device(h), dup = to_device(up);
  const auto dw = to_device(w), db = to_device(b);
  const auto dt = to_device(t);
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};

  struct outputs {
    std::vector<float> loss, gh, gw, gb;
  };
  const auto solve = [&](bool tuned) {
    thrust::device_vector<float> loss(static_cast<std::size_t>(rows), 0.f), gh(static_cast<std::size_t>(rows * d), 0.f);
    thrust::device_vector<float> gw(static_cast<std::size_t>(n * d)), gb(static_cast<std::size_t>(n));
    xs::detail::dense_softmax_args a;
    a.h = matrix_view<const float>(thrust::raw_pointer_cast(dh.data()), rows, d);
    a.target = thrust::raw_pointer_cast(dt.data());
    a.n = n;
    a.chunk = chunk;
    a.loss = thrust::raw_pointer_cast(loss.data());
    a.upstream = thrust::raw_pointer_cast(dup.data());
    a.grad_h = thrust::raw_pointer_cast(gh.data());
    a.grad_w = thrust::raw_pointer_cast(gw.data());
    a.grad_b = with_bias ? thrust::raw_pointer_cast(gb.data()) : nullptr;
    const matrix_view<const T> wv(thrust::raw_pointer_cast(dw.data()), n, d);
    const T* bias = with_bias ? thrust::raw_pointer_cast(db.data()) : nullptr;
    if (tuned) {
      REQUIRE(xs::detail::dense_softmax_tuning<xs::cuda, T>::applies(a));
      xs::detail::dense_softmax(ex, wv, bias, a);
    } else {
      xs::detail::dense_softmax_generic(ex, wv, bias, a);
    }
    res.synchronize();
    return outputs{to_host(loss), to_host(gh), to_host(gw), to_host(gb)};
  };
  const outputs tuned = solve(true), generic = solve(false);
  const double tol = tolerance_for<T>();
  CHECK(relative_gap(tuned.loss, generic.loss) < tol);
  CHECK(relative_gap(tuned.gh, generic.gh) < tol);
  CHECK(relative_gap(tuned.gw, generic.gw) < tol);
  if (with_bias) CHECK(relative_gap(tuned.gb, generic.gb) < tol);
}

}  // namespace

TEST_CASE("cuda dense_softmax: the tuned bf16/fp16 path equals the generic primitive (its oracle)") {
  static_assert(xs::detail::dense_softmax_tuning<xs::cuda, __nv_bfloat16>::available);
  static_assert(!xs::detail::dense_softmax_tuning<xs::cuda, float>::available);
  tuned_equals_generic<__nv_bfloat16>(33, 1000, 40, 256, true, 1);
  tuned_equals_generic<__nv_bfloat16>(7, 513, 130, 100, false, 2);
  tuned_equals_generic<__half>(33, 1000, 40, 256, true, 3);
  tuned_equals_generic<__half>(64, 2049, 17, 512, false, 4);
}
