// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The cuda backend's tuned parts of the dense softmax, each a specialisation of a hook of a generic
/// primitive whose generic version stays its oracle (tests/cuda/dense_tuned_cuda_test.cu compares
/// the two); the chunk loop, score cache, log-sum-exp, loss and bias gradient stay the generic
/// algorithm's:
///  * `dense_softmax_tuning<cuda, T>`, bf16/fp16 weights: the packed rows are rounded to the storage
///    type once and every GEMM reads the weights in place on the tensor cores (fp32 accumulation),
///    instead of the generic per-chunk widening of the weight rows to fp32 (TF32 GEMMs); the bias
///    and the gradient G (rounded to T for the GEMMs in the same pass) one thread per element. It
///    serves blocks without gathered columns, logit offsets, loss terms, margins or row combination
///    (the full softmax's plain loss, the hierarchical softmax's dense runs).
///  * `online_lse_tuning<cuda>`: one thread block per row (coalesced reads, CUB block reductions)
///    instead of one thread per row.

#include <xsoftmax/detail/cuda/gemm.cuh>
#include <xsoftmax/detail/cuda/gradient_scale.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>

#include <type_traits>

namespace xsoftmax::detail {
namespace gpu {

/// One block per row r of s (rows x cols, leading dimension lds): `online_lse_update`'s fold of the
/// row into the running (max, sum of exp) and its target capture.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    online_lse_kernel(const float* s, index_t rows, index_t cols, index_t lds, index_t col_offset,
                      const index_t* targets, float* run_max, float* run_sum, float* target_logit) {
  __shared__ typename cub::BlockReduce<float, Threads>::TempStorage temp;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = s + r * lds;
    const float2 ms = block_max_sum<Threads>(row, cols, temp);
    if (threadIdx.x != 0) continue;
    const float old_max = run_max[r], new_max = old_max > ms.x ? old_max : ms.x;
    if (new_max != -INFINITY) {  // both partial sums rescaled to the new max (exp(-inf) = 0)
      run_sum[r] = run_sum[r] * expf(old_max - new_max) + ms.y * expf(ms.x - new_max);
      run_max[r] = new_max;
    }
    const index_t t = targets ? targets[r] - col_offset : -1;
    if (t >= 0 && t < cols) target_logit[r] = row[t];
  }
}

/// s[r * cn + j] += b[j], one thread per element.
template <class T>
struct add_bias {
  float* s;
  const T* b;
  index_t cn;
  XSOFTMAX_HD void operator()(index_t e) const { s[e] += to_float(b[e % cn]); }
};

/// The dense softmax's plain-loss gradient of element e of a chunk (rows x cn, columns from c0) of
/// biased scores, in T times `scale` for the tensor-core GEMMs, and (`keep_fp32`: for the bias
/// gradient's column sums) in fp32 in place. Without a bias the fp32 copy is not written: 4 bytes
/// of the ~26 each score element moves.
template <class T>
struct softmax_gradient {
  float* s;
  T* g;
  index_t cn, c0;
  const float* lse;
  const float* upstream;
  const index_t* target;
  float scale;
  bool keep_fp32;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t r = e / cn;
    float v = expf(s[e] - lse[r]) * upstream[r];
    if (target[r] - c0 == e - r * cn) v -= upstream[r];
    if (keep_fp32) s[e] = v;
    g[e] = from_float<T>(v * scale);
  }
};

}  // namespace gpu

template <>
struct online_lse_tuning<::xsoftmax::cuda> {
  static constexpr bool available = true;

  template <class State>
  static void update(const execution<::xsoftmax::cuda>& ex, const float* s, index_t rows, index_t cols, index_t lds,
                     index_t col_offset, const index_t* targets, State& state) {
    if (rows == 0) return;
    gpu::online_lse_kernel<gpu::block_threads><<<gpu::grid_rows(rows), gpu::block_threads, 0, ex.res.stream()>>>(
        s, rows, cols, lds, col_offset, targets, raw(state.max), raw(state.sum), raw(state.target_logit));
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
};

template <class T>
struct dense_softmax_tuning<::xsoftmax::cuda, T> {
  static constexpr bool available = !std::is_same_v<T, float>;

  [[nodiscard]] static bool applies(const dense_softmax_args& a) {
    return !a.columns && !a.negative_offset && !a.target_offset && a.plain_loss() && !a.margin.enabled() &&
           !a.combine_rows;
  }

  /// Rounds the rows to T (in the workspace, with G's chunk when backward); for fp16, the scale
  /// of G (`gradient_scale`).
  dense_softmax_tuning(const execution<::xsoftmax::cuda>& ex, const dense_softmax_args& a, index_t chunk)
      : ex_(ex), a_(a), scratch_(ex.res.workspace()), rows_(a.h.rows), d_(a.h.cols) {
    h_ = scratch_.take<T>(rows_ * d_);
    rows_to_storage(ex_, a.h, h_);
    if (!a.upstream) return;
    g_ = scratch_.take<T>(rows_ * chunk);
    if constexpr (gpu::scales_gradient<T>) scale_ = gpu::gradient_scale(ex.res, a.upstream, rows_);
  }

  /// s (rows x cn) = H W[first : first + cn]^T + bias[first : first + cn].
  void scores(matrix_view<const T> w, const T* bias, index_t first, index_t cn, float* s) const {
    gpu::gemm<T>(ex_.res.cublas(), gpu::op::none, gpu::op::transpose, rows_, cn, d_, 1.f, h_, d_, w.row(first),
                 w.stride, 0.f, s, cn);
    if (bias) parallel_for(ex_, rows_ * cn, gpu::add_bias<T>{s, bias + first, cn});
  }

  /// Chunk c0's scores s (rows x cn) -> G = (softmax - onehot) * upstream in T times `scale_`
  /// (one thread per element), and in place in fp32 when the bias gradient reads it; then
  /// grad_h += G W_chunk and grad_w[c0 : c0 + cn] = (or +=, a later row block) G^T H, reading the
  /// copy in T, scaled back exactly through alpha.
  void backward(matrix_view<const T> w, index_t c0, index_t cn, float* s, const float* lse) {
    const bool keep_fp32 = a_.grad_b != nullptr;
    parallel_for(ex_, rows_ * cn,
                 gpu::softmax_gradient<T>{s, g_, cn, c0, lse, a_.upstream, a_.target, scale_, keep_fp32});
    const float alpha = 1.f / scale_;  // exact: a power of two
    cublasHandle_t h = ex_.res.cublas();
    const T* w_chunk = w.row(a_.first + c0);
    gpu::gemm<T>(h, gpu::op::none, gpu::op::none, rows_, d_, cn, alpha, g_, cn, w_chunk, w.stride, 1.f, a_.grad_h,
                 d_);
    const float beta = a_.accumulate_weight_gradient ? 1.f : 0.f;
    gpu::gemm<T>(h, gpu::op::transpose, gpu::op::none, cn, d_, rows_, alpha, g_, cn, h_, d_, beta,
                 a_.grad_w + c0 * d_, d_);
  }

 private:
  execution<::xsoftmax::cuda> ex_;
  const dense_softmax_args& a_;
  gpu::arena scratch_;
  index_t rows_, d_;
  T* h_ = nullptr;
  T* g_ = nullptr;
  float scale_ = 1.f;
};

}  // namespace xsoftmax::detail
