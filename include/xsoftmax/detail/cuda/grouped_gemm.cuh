// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Many small row-major GEMMs of different shapes in one cuBLAS call (cublasGemmGroupedBatchedEx,
/// cuBLAS >= 12.5), mapped to column-major exactly as gemm.cuh does for one GEMM.
///
/// Why: a level of a hierarchical softmax holds one small dense problem per node (a run of samples
/// against the node's block of child rows). Issued one by one, a level with thousands of nodes
/// costs thousands of cuBLAS launches of a few microseconds each while each GEMM does a few
/// kFLOPs: the level is launch-bound. One grouped call runs them all in one launch.
///
/// Types: cuBLAS documents grouped GEMMs for A/B/C all fp32, all fp16 or all bf16 (compute 32F).
/// The heads keep scores and gradients in fp32 (C fp32), so only fp32 storage can use the grouped
/// call; for bf16/fp16 inputs (and cuBLAS < 12.5) `grouped_gemm` issues one cublasGemmEx per
/// problem: still correct, with the launch count of the per-run path for the GEMMs only.
///
/// The pointer arrays must live in device memory: build them on the host with `pointers`, copy
/// them (for instance all of a call's at once) into the call's workspace, and pass their device
/// address to `run`.

#include <xsoftmax/detail/cuda/gemm.cuh>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail::gpu {

/// Whether `grouped_gemm<T>` runs as one cuBLAS call (else one call per problem).
template <class T>
[[nodiscard]] constexpr bool grouped_gemm_native() {
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  return std::is_same_v<T, float>;
#else
  return false;
#endif
}

/// One row-major product C(m x n, fp32, ldc) = alpha * op(A) * op(B) + beta * C (see `gemm`).
template <class T>
struct gemm_problem {
  op op_a = op::none, op_b = op::none;
  index_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  const T* a = nullptr;
  index_t lda = 0;
  const T* b = nullptr;
  index_t ldb = 0;
  float beta = 0.f;
  float* c = nullptr;
  index_t ldc = 0;
};

/// A list of row-major GEMMs run together. Each problem is its own cuBLAS group (group size 1):
/// shapes differ from node to node, and cuBLAS takes per-group scalars from host arrays anyway.
template <class T>
class grouped_gemm {
 public:
  /// Adds a problem; problems with m or n = 0 are dropped (nothing to compute). Throws
  /// `invalid_argument` when a dimension does not fit cuBLAS's int.
  void add(const gemm_problem<T>& p) {
    if (p.m == 0 || p.n == 0) return;
    calls_.push_back(rowmajor_to_colmajor(p.op_a, p.op_b, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.c, p.ldc));
    problems_.push_back(p);
  }

  /// The pointer arrays (column-major A's, B's, then C's) to copy to the device for `run`, appended
  /// to `out`. Nothing is appended when the problems run one by one.
  void pointers(std::vector<const void*>& out) const {
    if constexpr (grouped_gemm_native<T>()) {
      for (const colmajor_call& x : calls_) out.push_back(x.a);
      for (const colmajor_call& x : calls_) out.push_back(x.b);
      for (const colmajor_call& x : calls_) out.push_back(x.c);
    }
  }

  /// Runs every problem on the handle's stream. `device_pointers`: the `pointers` entries in
  /// device memory (ignored, may be null, when not native). Host arrays are read during the call.
  void run(cublasHandle_t handle, const void* const* device_pointers) const {
    if (problems_.empty()) return;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
    if constexpr (grouped_gemm_native<T>()) {
      expects(device_pointers != nullptr, "cuda grouped GEMM: the device pointer arrays are missing");
      const std::size_t count = calls_.size();
      expects(count <= static_cast<std::size_t>(INT_MAX), "cuda grouped GEMM: ", count,
              " problems exceed cuBLAS's int group count");
      std::vector<cublasOperation_t> ta, tb;
      std::vector<int> m, n, k, lda, ldb, ldc, group_size(count, 1);
      std::vector<float> alpha, beta;
      for (std::size_t i = 0; i < count; ++i) {
        const colmajor_call& x = calls_[i];
        ta.push_back(x.transa), tb.push_back(x.transb), m.push_back(x.m), n.push_back(x.n), k.push_back(x.k);
        lda.push_back(x.lda), ldb.push_back(x.ldb), ldc.push_back(x.ldc);
        alpha.push_back(problems_[i].alpha), beta.push_back(problems_[i].beta);
      }
      constexpr cudaDataType_t type = cuda_data_type<T>();
      // cuBLAS takes the C array as `void* const[]`: the third block of the device array.
      void* const* c_array = const_cast<void* const*>(device_pointers + 2 * count);
      XSOFTMAX_CUBLAS_TRY(cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                                     alpha.data(), device_pointers, type, lda.data(),
                                                     device_pointers + count, type, ldb.data(), beta.data(), c_array,
                                                     CUDA_R_32F, ldc.data(), static_cast<int>(count),
                                                     group_size.data(), CUBLAS_COMPUTE_32F));
      return;
    }
#endif
    (void)device_pointers;
    for (const gemm_problem<T>& p : problems_)
      gemm<T>(handle, p.op_a, p.op_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
  }

 private:
  std::vector<gemm_problem<T>> problems_;
  std::vector<colmajor_call> calls_;  ///< problems_ as cuBLAS's column-major calls
};

}  // namespace xsoftmax::detail::gpu
