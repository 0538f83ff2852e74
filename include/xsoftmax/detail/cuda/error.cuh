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
#include <string>
#include <type_traits>

namespace xsoftmax::detail::gpu {

[[nodiscard]] inline bool failed(cudaError_t e) { return e != cudaSuccess; }
[[nodiscard]] inline bool failed(cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }

/// The library's own description of a status.
[[nodiscard]] inline std::string describe(cudaError_t e) {
  return message(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
[[nodiscard]] inline std::string describe(cublasStatus_t s) {
  return message("cuBLAS status ", static_cast<int>(s), " (", cublasGetStatusString(s), ")");
}

template <class Status>
[[noreturn]] void throw_error(Status s, const char* call, const char* file, int line) {
  // Clear the runtime's last-error state: a non-sticky error (an allocation that failed) would
  // otherwise be reported again by the next launch check. Sticky errors stay, as they must.
  if constexpr (std::is_same_v<Status, cudaError_t>) (void)cudaGetLastError();
  throw cuda_error(message(file, ":", line, ": ", call, " failed: ", describe(s)));
}

template <class Status>
void report_error(Status s, const char* call, const char* file, int line) noexcept {
  try {
    std::fprintf(stderr, "xsoftmax: %s:%d: %s failed: %s [ignored in a destructor]\n", file, line, call,
                 describe(s).c_str());
  } catch (...) {  // no memory for the message: nothing more to report
  }
}

}  // namespace xsoftmax::detail::gpu

/// Evaluates a CUDA runtime or cuBLAS call; throws `xsoftmax::cuda_error` unless it succeeded.
#define XSOFTMAX_CUDA_TRY(call)                                                               \
  do {                                                                                        \
    const auto xsoftmax_status_ = (call);                                                     \
    if (::xsoftmax::detail::gpu::failed(xsoftmax_status_))                                    \
      ::xsoftmax::detail::gpu::throw_error(xsoftmax_status_, #call, __FILE__, __LINE__);      \
  } while (0)
#define XSOFTMAX_CUBLAS_TRY(call) XSOFTMAX_CUDA_TRY(call)

/// As XSOFTMAX_CUDA_TRY but never throws (destructors): a failure is printed to stderr.
#define XSOFTMAX_CUDA_TRY_NOTHROW(call)                                                       \
  do {                                                                                        \
    const auto xsoftmax_status_ = (call);                                                     \
    if (::xsoftmax::detail::gpu::failed(xsoftmax_status_))                                    \
      ::xsoftmax::detail::gpu::report_error(xsoftmax_status_, #call, __FILE__, __LINE__);     \
  } while (0)
#define XSOFTMAX_CUBLAS_TRY_NOTHROW(call) XSOFTMAX_CUDA_TRY_NOTHROW(call)

/// Checks the last kernel launch (a launch error such as a bad configuration is reported at once;
/// faults inside the kernel surface at the next synchronising call).
#define XSOFTMAX_CUDA_CHECK_LAUNCH() XSOFTMAX_CUDA_TRY(cudaGetLastError())
