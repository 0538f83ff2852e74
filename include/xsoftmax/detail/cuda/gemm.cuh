// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The one place where row-major matrices meet cuBLAS's column-major GEMM.
///
/// Every matrix in xsoftmax is row-major. A row-major (r x c) matrix with leading dimension ld is,
/// read by cuBLAS, the column-major (c x r) matrix — its transpose — with the same ld. So the
/// row-major product C(m x n) = op(A)(m x k) * op(B)(k x n) is, to cuBLAS, the column-major product
/// C^T(n x m) = op(B)^T(n x k) * op(A)^T(k x m): swap the operands, swap m and n, keep both ops
/// as they are:
///     cublasGemmEx(h, opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc).
/// (With opB = N, cuBLAS reads B's buffer as the column-major (n x k) matrix B^T, which is exactly
/// op(B)^T; with opB = T it reads the buffer of a row-major (n x k) B, i.e. the column-major (k x n)
/// B^T, and transposes it back to B = op(B)^T. Same for A.)
///
/// Inputs A and B have the weights' storage type (fp32, bf16 or fp16); the accumulation is always
/// fp32 (CUBLAS_COMPUTE_32F): bf16/fp16 inputs run on tensor cores, fp32 inputs on the regular fp32
/// path (no TF32 rounding, so fp32 results stay close to the host backends'). C is fp32, or the
/// inputs' own type (a weight gradient in the storage type: rounded once from the fp32 sum).

#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/cuda/error.cuh>
#include <xsoftmax/error.hpp>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include <climits>
#include <type_traits>

namespace xsoftmax::detail::gpu {

enum class op { none, transpose };

/// cuBLAS's name of a storage type.
template <class T>
[[nodiscard]] constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDA_R_16BF;
  else {
    static_assert(std::is_same_v<T, __half>, "xsoftmax: cuBLAS GEMM inputs must be float, bf16 or fp16");
    return CUDA_R_16F;
  }
}

/// cuBLAS takes int dimensions; element *offsets* are 64-bit pointer arithmetic done before the
/// call, so only a single dimension or leading dimension above INT_MAX is a problem.
inline int gemm_dim(index_t v, const char* name) {
  expects(v >= 0 && v <= static_cast<index_t>(INT_MAX), "cuda GEMM: ", name, " = ", v,
          " does not fit cuBLAS's 32-bit int (at most ", INT_MAX, "); use a smaller chunk or batch");
  return static_cast<int>(v);
}

/// The arguments of the column-major cuBLAS call that computes a row-major product (see the file
/// comment): operands swapped, m and n swapped, ops unchanged.
struct colmajor_call {
  cublasOperation_t transa, transb;
  int m, n, k;
  const void* a;
  int lda;
  const void* b;
  int ldb;
  void* c;
  int ldc;
};

/// Maps the row-major C(m x n) = op(A)(m x k) * op(B)(k x n) to its cuBLAS call. Throws
/// `invalid_argument` when a dimension does not fit an int.
inline colmajor_call rowmajor_to_colmajor(op op_a, op op_b, index_t m, index_t n, index_t k, const void* a,
                                          index_t lda, const void* b, index_t ldb, void* c, index_t ldc) {
  const auto to_cublas = [](op o) { return o == op::none ? CUBLAS_OP_N : CUBLAS_OP_T; };
  colmajor_call call;
  call.transa = to_cublas(op_b);
  call.transb = to_cublas(op_a);
  call.m = gemm_dim(n, "n");
  call.n = gemm_dim(m, "m");
  call.k = gemm_dim(k, "k");
  call.a = b;
  call.lda = gemm_dim(ldb, "ldb");
  call.b = a;
  call.ldb = gemm_dim(lda, "lda");
  call.c = c;
  call.ldc = gemm_dim(ldc, "ldc");
  return call;
}

/// Row-major C(m x n, ldc) = alpha * op(A) * op(B) + beta * C, where op(A) is (m x k) and
/// op(B) is (k x n); A is stored (m x k) for op none or (k x m) for transpose, likewise B; C is
/// fp32 or T (see the file comment). Runs on the handle's stream. Nothing is done when m or n is 0.
/// `compute`: CUBLAS_COMPUTE_32F (default), or CUBLAS_COMPUTE_32F_FAST_TF32 for fp32 operands that
/// carry no more than TF32's precision anyway (weights widened from bf16/fp16).
template <class T, class C = float>
void gemm(cublasHandle_t handle, op op_a, op op_b, index_t m, index_t n, index_t k, float alpha, const T* a,
          index_t lda, const T* b, index_t ldb, float beta, C* c, index_t ldc,
          cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, T>, "xsoftmax: a GEMM's C is fp32 or its inputs' type");
  if (m == 0 || n == 0) return;
  const colmajor_call x = rowmajor_to_colmajor(op_a, op_b, m, n, k, a, lda, b, ldb, c, ldc);
  constexpr cudaDataType_t type = cuda_data_type<T>();
  XSOFTMAX_CUBLAS_TRY(cublasGemmEx(handle, x.transa, x.transb, x.m, x.n, x.k, &alpha, x.a, type, x.lda, x.b, type,
                                   x.ldb, &beta, x.c, cuda_data_type<C>(), x.ldc, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace xsoftmax::detail::gpu
