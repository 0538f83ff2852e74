// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA specialisation of the `dense_softmax` primitive for bf16/fp16 weights: the
/// packed rows are rounded to the storage type once and every GEMM reads the weights in place on
/// the tensor cores (fp32 accumulation), with the fused online log-sum-exp kernels of dense.cuh —
/// instead of the generic path's per-chunk widening of the weights to fp32. It serves blocks
/// without gathered columns, logit offsets, loss terms or margins (the full softmax's plain loss);
/// anything else takes the generic path, which stays the oracle: tests/cuda/dense_tuned_cuda_test.cu compares the two.

#include <xsoftmax/detail/cuda/dense.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>

#include <type_traits>

namespace xsoftmax::detail {

template <class T>
struct dense_softmax_tuning<::xsoftmax::cuda, T> {
  static constexpr bool available = !std::is_same_v<T, float>;

  [[nodiscard]] static bool applies(const dense_softmax_args& a) {
    return !a.columns && !a.negative_offset && !a.target_offset && a.plain_loss() && !a.margin.enabled() &&
           !a.combine_rows;
  }

  static void run(const execution<::xsoftmax::cuda>& ex, matrix_view<const T> w, const T* bias,
                  const dense_softmax_args& a) {
    const cuda_resources& res = ex.res;
    const index_t rows = a.h.rows, d = a.h.cols;
    if (rows == 0 || a.n == 0) return;
    const bool backward = a.upstream != nullptr;
    gpu::arena scratch(res.workspace(), res.stream());
    T* h = scratch.take<T>(rows * d);
    const matrix_view<const float> src = a.h;
    parallel_for(ex, rows * d, [=] __host__ __device__(index_t e) {
      h[e] = from_float<T>(src(e / d, e % d));
    });
    gpu::dense_block<T> b;
    b.h = h;
    b.rows = rows;
    b.dim = d;
    b.w = w;
    b.bias = bias;
    b.first = a.first;
    b.n = a.n;
    b.target_col = a.target;
    const index_t chunk = a.chunk < a.n ? a.chunk : a.n;
    const auto sc = gpu::dense_scratch<T>::take(scratch, rows, chunk, backward);
    gpu::dense_lse(res, b, sc);
    gpu::dense_losses(res, b, sc, a.loss, /*accumulate=*/true);
    if (!backward) return;
    const float grad_scale = gpu::scales_gradient<T> ? gpu::gradient_scale(res, a.upstream, rows) : 1.f;
    gpu::dense_backward(res, b, sc, a.upstream, grad_scale, a.grad_h, a.grad_w, a.grad_b);
  }
};

}  // namespace xsoftmax::detail
