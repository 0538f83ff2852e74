// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `cuda` backend: include this header (in a translation unit compiled by nvcc) to use
/// `full_softmax<P, cuda>` and `hierarchical_softmax<Tree, P, cuda, NodeForm>`.
///
/// What it provides:
///  * `backend_traits<cuda>`: `thrust::device_vector` storage, `cuda_resources`, and Thrust's CUDA
///    system on the resources' stream (`thrust::cuda::par_nosync.on(stream)`).
///  * `cuda_resources` (stream, cuBLAS handle bound to it, cached device workspace).
///  * The heads' verbs on the GPU, with the host backends' semantics, checks and messages. Every
///    pointer in the views passed to a `cuda` head (hidden, targets, outputs, grad_output) is a
///    device pointer; sparse gradients live in `thrust::device_vector`s. Every verb runs on the
///    head's stream and synchronises it before returning (blocking).
///  * `cuda_workspace_bytes(head, batch_rows, backward)`: the workspace a full_softmax forward or
///    backward needs, for `cuda_resources::reserve_workspace` (size query, then run).
///
/// Precision: scores and gradients accumulate in fp32. bf16/fp16 heads convert the hidden rows to
/// the storage type and run their GEMMs on tensor cores (fp32 accumulation); fp32 heads use
/// cuBLAS's fp32 path (no TF32). Linking needs CUDA::cublas.
///
/// Throws what the host backends throw for bad input, and `cuda_error` when a CUDA call fails.

#if !defined(__CUDACC__)
#error "xsoftmax/cuda.cuh needs a CUDA compiler (nvcc): compile this translation unit as CUDA"
#endif

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/heads.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>

#include <cstddef>

namespace xsoftmax {

/// Workspace bytes a `full_softmax<P, cuda>` forward (backward = false) or forward_backward /
/// backward / log_prob call over `batch_rows` rows takes from its resources' workspace (not
/// counting the sparse gradient it returns, which lives in its own device vectors, nor Thrust's
/// and cuBLAS's own small temporaries). Reserve it once with
/// `head.resources().reserve_workspace(bytes)` and such calls no longer allocate.
template <class P>
[[nodiscard]] std::size_t cuda_workspace_bytes(const full_softmax<P, cuda>& head, index_t batch_rows,
                                               bool backward) {
  return detail::gpu::full_run_workspace_bytes(head, batch_rows, backward);
}

}  // namespace xsoftmax
