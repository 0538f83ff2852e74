// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `cuda` backend: include this header (in a translation unit compiled by nvcc) to use
/// `full_softmax<P, cuda>`, `hierarchical_softmax<Tree, P, cuda, NodeForm>`,
/// `selective_softmax<Selector, P, cuda>` and `knn_softmax<P, cuda>`.
///
/// What it provides:
///  * `backend_traits<cuda>`: `thrust::device_vector` storage, `cuda_resources`, and Thrust's CUDA
///    system on the resources' stream with their caching allocator for Thrust's temporaries
///    (`thrust::cuda::par_nosync(allocator).on(stream)`).
///  * `cuda_resources` (stream, cuBLAS handle bound to it, cached device workspace, Thrust
///    allocator; `synchronize()`).
///  * The heads' verbs on the GPU, with the host backends' semantics, checks and messages. Every
///    pointer in the views passed to a `cuda` head (hidden, targets, outputs, grad_output) is a
///    device pointer; sparse gradients live in `thrust::device_vector`s. Every blocking verb runs
///    on the head's stream and synchronises it before returning.
///  * `backend_ops<cuda>` (cuBLAS fp32 GEMM, one-value reads, stream waits): what the generic
///    algorithms need besides Thrust. `full_softmax` runs its one generic algorithm (the same code
///    the host backends run) on the GPU, with two tuned hooks of its dense softmax
///    (detail/cuda/dense_tuned.cuh; the generic versions are their oracles in the tests): for
///    bf16/fp16 weights its GEMMs read the rows rounded to the storage type once and the weights in
///    place, on the tensor cores; and the online log-sum-exp gives one block to each row (every
///    head's). Its `_async` verbs queue that work without the final wait,
///    but still wait for sizes (the packed row count) and data checks, whose errors they throw from
///    the call.
///  * `selective_softmax` (every selector) and `knn_softmax` run their one generic algorithm too:
///    active sets are built, checked and scored in device memory (`active_set_for<cuda>`); caller
///    candidate lists, a KNN graph and a sampler's class counts are copied to the device once per
///    change. Sampled negatives are drawn on the host (m ids per step). The KNN graph build (exact
///    and IVF), k-means and the IVF index (build and search) are the same generic algorithms as on
///    the host, run on the device; the host keeps the seeded random choices and reads sizes, and
///    the finished graph is stored on the host (copied back to the device on the next `select`).
///  * `hierarchical_softmax` runs its one generic algorithm too (planning, sorting, GEMM and
///    gather-dot paths, top-k search, log_distribution), with three tuned kernel sets whose generic
///    versions are their oracles in the GPU tests: the gather path gives one warp to each sample
///    (one block for wide nodes; detail/cuda/hs_gather_tuned.cuh), a level's small dense runs are
///    grouped (grouped GEMMs, one segmented log-sum-exp kernel; detail/cuda/hs_grouped_tuned.cuh)
///    unless `set_dense_grouping(dense_grouping::per_run)`, and the top-k search over softmax nodes
///    gives each row a block that scores an expanded node's children together
///    (detail/cuda/hs_search_tuned.cuh). A `runtime_tree` is copied to the device once
///    per head. Its `_async` verbs do not wait for their last kernels, but plan each tree level's
///    runs on the host (one wait per level); `topk_async` is blocking.
///
/// Precision: scores and gradients accumulate in fp32. bf16/fp16 heads convert the hidden rows to
/// the storage type and run their GEMMs on tensor cores (fp32 accumulation); fp32 heads use
/// cuBLAS's fp32 path (no TF32). Linking needs CUDA::cublas.
///
/// Throws what the host backends throw for bad input, from the call (`_async` verbs included), and
/// `cuda_error` when a CUDA call fails.

#if !defined(__CUDACC__)
#error "xsoftmax/cuda.cuh needs a CUDA compiler (nvcc): compile this translation unit as CUDA"
#endif

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/detail/cuda/dense_tuned.cuh>
#include <xsoftmax/detail/cuda/hs_gather_tuned.cuh>
#include <xsoftmax/detail/cuda/hs_grouped_tuned.cuh>
#include <xsoftmax/detail/cuda/hs_search_tuned.cuh>
#include <xsoftmax/detail/cuda/topk_tuned.cuh>
#include <xsoftmax/detail/cuda/tree.cuh>
#include <xsoftmax/detail/cuda/resources.cuh>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/feature_query.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>


