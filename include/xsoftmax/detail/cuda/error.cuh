// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Error macros of the CUDA backend. A failing CUDA runtime or cuBLAS call throws
/// `xsoftmax::cuda_error` whose message names the file and line, the call as written and the
/// library's own error string. The `_NOTHROW` variants only report to stderr: they are for
/// destructors and cleanup paths, where throwing would terminate the program.

#include <xsoftmax/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>

namespace xsoftmax::detail::gpu {

/// cuBLAS's own description of a status (the numeric status goes into messages as well).
[[nodiscard]] inline const char* cublas_status_string(cublasStatus_t s) { return cublasGetStatusString(s); }

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  // Clear the runtime's last-error state: a non-sticky error (an allocation that failed) would
  // otherwise be reported again by the next launch check. Sticky errors stay, as they must.
  (void)cudaGetLastError();
  throw cuda_error(message(file, ":", line, ": ", call, " failed: ", cudaGetErrorName(e), " (",
                           cudaGetErrorString(e), ")"));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw cuda_error(message(file, ":", line, ": ", call, " failed: cuBLAS status ", static_cast<int>(s), " (",
                           cublas_status_string(s), ")"));
}

inline void report_cuda_error(cudaError_t e, const char* call, const char* file, int line) noexcept {
  std::fprintf(stderr, "xsoftmax: %s:%d: %s failed: %s (%s) [ignored in a destructor]\n", file, line, call,
               cudaGetErrorName(e), cudaGetErrorString(e));
}

inline void report_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) noexcept {
  std::fprintf(stderr, "xsoftmax: %s:%d: %s failed: cuBLAS status %d (%s) [ignored in a destructor]\n", file,
               line, call, static_cast<int>(s), cublas_status_string(s));
}

}  // namespace xsoftmax::detail::gpu

/// Evaluates a CUDA runtime call; throws `xsoftmax::cuda_error` unless it returns cudaSuccess.
#define XSOFTMAX_CUDA_TRY(call)                                                        \
  do {                                                                                 \
    const cudaError_t xsoftmax_cuda_status_ = (call);                                  \
    if (xsoftmax_cuda_status_ != cudaSuccess)                                          \
      ::xsoftmax::detail::gpu::throw_cuda_error(xsoftmax_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Evaluates a cuBLAS call; throws `xsoftmax::cuda_error` unless it returns CUBLAS_STATUS_SUCCESS.
#define XSOFTMAX_CUBLAS_TRY(call)                                                      \
  do {                                                                                 \
    const cublasStatus_t xsoftmax_cublas_status_ = (call);                             \
    if (xsoftmax_cublas_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::xsoftmax::detail::gpu::throw_cublas_error(xsoftmax_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// As XSOFTMAX_CUDA_TRY but never throws (destructors): a failure is printed to stderr.
#define XSOFTMAX_CUDA_TRY_NOTHROW(call)                                                \
  do {                                                                                 \
    const cudaError_t xsoftmax_cuda_status_ = (call);                                  \
    if (xsoftmax_cuda_status_ != cudaSuccess)                                          \
      ::xsoftmax::detail::gpu::report_cuda_error(xsoftmax_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// As XSOFTMAX_CUBLAS_TRY but never throws (destructors): a failure is printed to stderr.
#define XSOFTMAX_CUBLAS_TRY_NOTHROW(call)                                              \
  do {                                                                                 \
    const cublasStatus_t xsoftmax_cublas_status_ = (call);                             \
    if (xsoftmax_cublas_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::xsoftmax::detail::gpu::report_cublas_error(xsoftmax_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the last kernel launch (a launch error such as a bad configuration is reported at once;
/// faults inside the kernel surface at the next synchronising call).
#define XSOFTMAX_CUDA_CHECK_LAUNCH() XSOFTMAX_CUDA_TRY(cudaGetLastError())
