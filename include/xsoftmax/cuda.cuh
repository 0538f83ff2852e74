// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `cuda` backend: include this header (in a translation unit compiled by nvcc) to use
/// `full_softmax<P, cuda>` and `hierarchical_softmax<Tree, P, cuda, NodeForm>`.
///
/// What it provides:
///  * `backend_traits<cuda>`: `thrust::device_vector` storage, `cuda_resources`, and Thrust's CUDA
///    system on the resources' stream with their caching allocator for Thrust's temporaries
///    (`thrust::cuda::par_nosync(allocator).on(stream)`).
///  * `cuda_resources` (stream, cuBLAS handle bound to it, cached device workspace, Thrust
///    allocator, device status word of the `_async` verbs; `synchronize()`, `check()`).
///  * The heads' verbs on the GPU, with the host backends' semantics, checks and messages. Every
///    pointer in the views passed to a `cuda` head (hidden, targets, outputs, grad_output) is a
///    device pointer; sparse gradients live in `thrust::device_vector`s. Every blocking verb runs
///    on the head's stream and synchronises it before returning.
///  * `full_softmax`'s `_async` verbs (forward_async, forward_backward_async, backward_async,
///    log_prob_async, topk_async, log_distribution_async): the same work, only queued on the
///    head's stream. They return at once; the reduced loss goes to a 1-element device `loss` view;
///    outputs are ready (and inputs may be released) once the stream is synchronised. Shape errors
///    throw from the call; data errors (non-finite hidden values or upstream gradients, targets out
///    of range) are recorded on the device and thrown, with the blocking verb's type and message, by
///    `head.resources().check()` / `synchronize()` or the next blocking verb on those resources.
///    No host synchronisation once the buffers exist: the first call of a batch size can grow the
///    workspace and create the cuBLAS handle and status word, and the weight gradient's device
///    vectors allocate (synchronously) when their size changes, so a training loop that reuses
///    its gradient object is sync-free from its second step on. See full_softmax.hpp.
///  * `hierarchical_softmax`'s `_async` verbs: the same signatures; the loss goes to device memory
///    and the call does not wait for its last kernels, but it checks its data and plans each tree
///    level's runs on the host (one wait per level), and `topk_async` is blocking. See
///    hierarchical_softmax.hpp. Its dense runs of a level are grouped (grouped GEMMs, one segmented
///    log-sum-exp kernel) unless `set_dense_grouping(dense_grouping::per_run)`; a `runtime_tree` is
///    copied to the device once per head.
///  * `cuda_workspace_bytes(head, batch_rows, backward)`: the workspace a full_softmax forward or
///    backward needs, for `cuda_resources::reserve_workspace` (size query, then run).
///
/// Precision: scores and gradients accumulate in fp32. bf16/fp16 heads convert the hidden rows to
/// the storage type and run their GEMMs on tensor cores (fp32 accumulation); fp32 heads use
/// cuBLAS's fp32 path (no TF32). Linking needs CUDA::cublas.
///
/// Throws what the host backends throw for bad input (the `_async` verbs: deferred, see above), and
/// `cuda_error` when a CUDA call fails.

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
/// `head.resources().reserve_workspace(bytes)` and such calls no longer allocate. (The `_async`
/// verbs need a few bytes more and reserve what they need themselves, synchronising only when the
/// workspace grows.)
template <class P>
[[nodiscard]] std::size_t cuda_workspace_bytes(const full_softmax<P, cuda>& head, index_t batch_rows,
                                               bool backward) {
  return detail::gpu::full_run_workspace_bytes(head, batch_rows, backward);
}

}  // namespace xsoftmax
