// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `backend_ops<cuda>`: what the generic algorithms need from the GPU besides Thrust — cuBLAS's
/// fp32 GEMM on the resources' stream, reading one value back (a wait for the stream), copies,
/// uploads of host lists that do not wait, waiting for queued work.

#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/detail/cuda/gemm.cuh>
#include <xsoftmax/detail/cuda/pinned_staging.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/gemm.hpp>

namespace xsoftmax::detail {

template <>
struct backend_ops<::xsoftmax::cuda> {
  /// The row-major fp32 GEMM of `g` (device pointers) by cuBLAS on the resources' stream: the fp32
  /// path (no TF32, results stay close to the host backends'), or TF32 tensor cores when the
  /// operands came from bf16/fp16 weights (`low_precision_inputs`).
  static void gemm(const cuda_resources& res, const host::gemm_args& g) {
    const auto to_gpu = [](host::op o) { return o == host::op::none ? gpu::op::none : gpu::op::transpose; };
    gpu::gemm<float>(res.cublas(), to_gpu(g.op_a), to_gpu(g.op_b), g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb,
                     g.beta, g.c, g.ldc, g.low_precision_inputs ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  }
  /// One value from device (or managed) memory, after the work queued before it on the stream.
  template <class T>
  [[nodiscard]] static T read(const cuda_resources& res, const T* p) {
    T v;
    copy(res, &v, p, 1);
    return v;
  }
  /// `n` elements from `src` to `dst`, each host, device or managed memory (the runtime tells them
  /// apart by unified addressing), after the work queued before it; complete on return.
  template <class T>
  static void copy(const cuda_resources& res, T* dst, const T* src, index_t n) {
    if (n <= 0) return;
    count_host_read();
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(T) * static_cast<std::size_t>(n), cudaMemcpyDefault,
                                      res.stream()));
    XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(res.stream()));
  }
  /// `n` elements of host memory `src` (pageable or not) to device memory `dst`, queued on the
  /// stream after the work before it, through the process's page-locked ring for the device: no
  /// wait for the stream (`gpu::upload_staged`, detail/cuda/pinned_staging.cuh); `src` may be
  /// reused on return. What the ring cannot take goes by `copy`, which waits.
  template <class T>
  static void upload(const cuda_resources& res, T* dst, const T* src, index_t n) {
    if (n <= 0) return;
    if (gpu::upload_staged(dst, src, sizeof(T) * static_cast<std::size_t>(n), res.stream())) {
      count_upload();
      return;
    }
    copy(res, dst, src, n);
  }
  static void synchronize(const cuda_resources& res) {
    ++call_counters::local().synchronizations;
    res.synchronize();
  }
};

}  // namespace xsoftmax::detail
