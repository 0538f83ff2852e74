// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax`'s evaluation verbs on the `cuda` backend: `topk` (the chunked log-sum-exp of
/// dense.cuh, with each chunk's candidates merged into a running top-k by a CUB segmented sort) and
/// `log_distribution` (the log-sum-exp pass, then the asked class range scored again), blocking and
/// `_async`. Same checks, messages and results as detail/full_softmax.inl.

#include <xsoftmax/detail/cuda/async_checks.cuh>
#include <xsoftmax/detail/cuda/common.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>

#include <cub/device/device_segmented_sort.cuh>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cstddef>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// top-k
// ------------------------------------------------------------------------------------------------

template <class Unused = void>
__global__ void topk_init_kernel(index_t n, float* score, index_t* index) {
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    score[i] = -INFINITY;
    index[i] = -1;
  }
}

/// Candidates of row r: its k kept entries, then the chunk's cn scores (classes c0 .. c0 + cn - 1).
/// Kept entries come from earlier chunks, so their classes are smaller than the chunk's; kept
/// entries with equal scores are in increasing class order (from the previous sort). A stable sort
/// by score, descending, therefore breaks ties by the smaller class, as the host does.
template <class Unused = void>
__global__ void topk_candidates_kernel(index_t rows, index_t k, index_t cn, index_t c0, const float* kept_score,
                                       const index_t* kept_index, const float* scores, float* cand_score,
                                       index_t* cand_index) {
  const index_t len = k + cn, n = rows * len;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / len, i = e - r * len;
    if (i < k) {
      cand_score[e] = kept_score[r * k + i];
      cand_index[e] = kept_index[r * k + i];
    } else {
      cand_score[e] = scores[r * cn + (i - k)];
      cand_index[e] = c0 + (i - k);
    }
  }
}

/// Keeps the first k entries of each sorted segment.
template <class Unused = void>
__global__ void topk_keep_kernel(index_t rows, index_t k, index_t len, const float* sorted_score,
                                 const index_t* sorted_index, float* kept_score, index_t* kept_index) {
  const index_t n = rows * k;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / k, j = e - r * k;
    kept_score[e] = sorted_score[r * len + j];
    kept_index[e] = sorted_index[r * len + j];
  }
}

template <class Unused = void>
__global__ void topk_output_kernel(index_t rows, index_t k, const float* kept_score, const index_t* kept_index,
                                   const float* lse, matrix_view<index_t> classes, matrix_view<float> log_probs) {
  const index_t n = rows * k;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / k, j = e - r * k;
    classes(r, j) = kept_index[e];
    log_probs(r, j) = kept_score[e] - lse[r];
  }
}

/// Begin offset of segment s when every segment has `len` entries.
struct segment_offset {
  index_t len;
  XSOFTMAX_HD index_t operator()(index_t s) const { return s * len; }
};

/// Bytes of CUB temporary storage for a stable descending segmented sort of rows segments of len.
[[nodiscard]] inline std::size_t segmented_sort_bytes(index_t rows, index_t len, cudaStream_t stream) {
  const auto offsets = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), segment_offset{len});
  std::size_t bytes = 0;
  XSOFTMAX_CUDA_TRY(cub::DeviceSegmentedSort::StableSortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const index_t*>(nullptr), static_cast<index_t*>(nullptr), rows * len, rows, offsets, offsets + 1,
      stream));
  return bytes;
}

/// The workspace pieces of one top-k call (arena: the run; workspace_plan: the size query).
template <class T>
struct topk_buffers {
  T* hs = nullptr;
  dense_scratch<T> sc;
  float* kept_score = nullptr;
  index_t* kept_index = nullptr;
  float* cand_score = nullptr;
  index_t* cand_index = nullptr;
  float* sorted_score = nullptr;
  index_t* sorted_index = nullptr;
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
  unsigned long long* slot = nullptr;  ///< the async path's failure slot

  template <class Alloc>
  static topk_buffers take(Alloc& a, index_t rows, index_t d, index_t k, index_t chunk, index_t n_cls,
                           cudaStream_t stream, bool async = false) {
    const index_t len = k + chunk;  // candidates per row and chunk (at most)
    topk_buffers b;
    b.hs = a.template take<T>(rows * d);
    b.sc = dense_scratch<T>::take(a, rows, chunk, /*with_grad=*/false);
    b.kept_score = a.template take<float>(rows * k);
    b.kept_index = a.template take<index_t>(rows * k);
    b.cand_score = a.template take<float>(rows * len);
    b.cand_index = a.template take<index_t>(rows * len);
    b.sorted_score = a.template take<float>(rows * len);
    b.sorted_index = a.template take<index_t>(rows * len);
    // CUB's temporary storage for the two segment lengths that occur (full chunks, the last one).
    const index_t last_len = k + (n_cls - (n_cls - 1) / chunk * chunk);
    b.temp_bytes = std::max(segmented_sort_bytes(rows, len, stream), segmented_sort_bytes(rows, last_len, stream));
    b.temp = a.template take<unsigned char>(static_cast<index_t>(b.temp_bytes));
    if (async) b.slot = a.template take<unsigned long long>(1);
    return b;
  }
};

/// The work of a top-k call after its checks, queued on the stream (no synchronisation).
template <class Head, class H>
void full_topk_enqueue(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                       matrix_view<float> log_probs, const topk_buffers<typename Head::storage_type>& buf) {
  using T = typename Head::storage_type;
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  const index_t rows = hidden.rows, chunk = head.chunk_size_for(rows);
  const cudaStream_t stream = res.stream();
  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, buf.hs);
  dense_block<T> block;
  block.h = buf.hs;
  block.rows = rows;
  block.dim = d;
  block.w = matrix_view<const T>(head.weights());
  block.bias = head.bias();
  block.first = 0;
  block.n = n_cls;
  dense_lse_begin(res, block, buf.sc);
  topk_init_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows * k, buf.kept_score, buf.kept_index);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  for (index_t c0 = 0; c0 < n_cls; c0 += chunk) {
    const index_t cn = std::min(chunk, n_cls - c0), seg = k + cn;
    dense_lse_chunk(res, block, buf.sc, c0, cn);  // sc.scores now holds the chunk's biased scores
    topk_candidates_kernel<><<<grid_for(rows * seg), block_threads, 0, stream>>>(
        rows, k, cn, c0, buf.kept_score, buf.kept_index, buf.sc.scores, buf.cand_score, buf.cand_index);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    const auto offsets = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), segment_offset{seg});
    std::size_t bytes = buf.temp_bytes;
    XSOFTMAX_CUDA_TRY(cub::DeviceSegmentedSort::StableSortPairsDescending(
        buf.temp, bytes, static_cast<const float*>(buf.cand_score), buf.sorted_score,
        static_cast<const index_t*>(buf.cand_index), buf.sorted_index, rows * seg, rows, offsets, offsets + 1,
        stream));
    topk_keep_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows, k, seg, buf.sorted_score,
                                                                        buf.sorted_index, buf.kept_score,
                                                                        buf.kept_index);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
  dense_lse_end(res, block, buf.sc);
  topk_output_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows, k, buf.kept_score, buf.kept_index,
                                                                        buf.sc.lse, classes, log_probs);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// k and the shapes of topk's outputs (the host's checks and messages).
inline void check_topk_outputs(const char* where, index_t rows, index_t k, index_t n_cls,
                               matrix_view<index_t> classes, matrix_view<float> log_probs) {
  expects(k >= 1 && k <= n_cls, where, ": k = ", k, " must be in [1, num_classes = ", n_cls, "]");
  detail::check_output(where, "classes", classes, rows, k);
  detail::check_output(where, "log_probs", log_probs, rows, k);
}

template <class Head, class H>
void full_topk(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
               matrix_view<float> log_probs) {
  using T = typename Head::storage_type;
  const char* where = "full_softmax::topk";
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden(where, res, hidden, d);
  check_topk_outputs(where, hidden.rows, k, n_cls, classes, log_probs);

  const cudaStream_t stream = res.stream();
  arena a(res.workspace(), stream);
  const auto buf =
      topk_buffers<T>::take(a, hidden.rows, d, k, head.chunk_size_for(hidden.rows), n_cls, stream);
  full_topk_enqueue(head, hidden, k, classes, log_probs, buf);
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

/// full_topk without waiting: shape checks now, the finite-hidden check recorded on the device.
template <class Head, class H>
void full_topk_async(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
                     matrix_view<float> log_probs) {
  using T = typename Head::storage_type;
  const char* where = "full_softmax::topk";
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden_shape(where, hidden, d);
  check_topk_outputs(where, hidden.rows, k, n_cls, classes, log_probs);

  const cudaStream_t stream = res.stream();
  const index_t chunk = head.chunk_size_for(hidden.rows);
  workspace_plan plan;
  (void)topk_buffers<T>::take(plan, hidden.rows, d, k, chunk, n_cls, stream, /*async=*/true);
  reserve_for_async(res, plan.bytes());
  device_status* st = res.begin_async();
  arena a(res.workspace(), stream);
  const auto buf = topk_buffers<T>::take(a, hidden.rows, d, k, chunk, n_cls, stream, /*async=*/true);
  check_hidden_async(where, res, hidden, d, st, buf.slot);
  full_topk_enqueue(head, hidden, k, classes, log_probs, buf);
}

// ------------------------------------------------------------------------------------------------
// log_distribution
// ------------------------------------------------------------------------------------------------

/// out(r, col0 + j) = s[r * cn + j] + bias[j] - lse[r].
template <class T>
__global__ void log_distribution_kernel(index_t rows, index_t cn, const float* s, const T* bias_chunk,
                                        const float* lse, matrix_view<float> out, index_t col0) {
  const index_t n = rows * cn;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / cn, j = e - r * cn;
    float v = s[e];
    if (bias_chunk) v += to_float(bias_chunk[j]);
    out(r, col0 + j) = v - lse[r];
  }
}

/// The workspace pieces of one log_distribution call.
template <class T>
struct log_distribution_buffers {
  T* hs = nullptr;
  dense_scratch<T> sc;
  unsigned long long* slot = nullptr;  ///< the async path's failure slot

  template <class Alloc>
  static log_distribution_buffers take(Alloc& a, index_t rows, index_t d, index_t chunk, bool async = false) {
    log_distribution_buffers b;
    b.hs = a.template take<T>(rows * d);
    b.sc = dense_scratch<T>::take(a, rows, chunk, /*with_grad=*/false);
    if (async) b.slot = a.template take<unsigned long long>(1);
    return b;
  }
};

/// The work of a log_distribution call after its checks, queued on the stream.
template <class Head, class H>
void full_log_distribution_enqueue(const Head& head, matrix_view<const H> hidden, index_t class_begin,
                                   index_t class_end, matrix_view<float> out,
                                   const log_distribution_buffers<typename Head::storage_type>& buf) {
  using T = typename Head::storage_type;
  const cuda_resources& res = head.resources();
  const index_t rows = hidden.rows, chunk = head.chunk_size_for(rows);
  const cudaStream_t stream = res.stream();
  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, buf.hs);
  dense_block<T> block;
  block.h = buf.hs;
  block.rows = rows;
  block.dim = head.dim();
  block.w = matrix_view<const T>(head.weights());
  block.bias = head.bias();
  block.first = 0;
  block.n = head.num_classes();
  dense_lse(res, block, buf.sc);
  for (index_t c0 = class_begin; c0 < class_end; c0 += chunk) {
    const index_t cn = std::min(chunk, class_end - c0);
    chunk_scores(res, block, c0, cn, buf.sc.scores);
    log_distribution_kernel<T><<<grid_for(rows * cn), block_threads, 0, stream>>>(
        rows, cn, buf.sc.scores, block.bias ? block.bias + c0 : nullptr, buf.sc.lse, out, c0 - class_begin);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
}

template <class Head, class H>
void full_log_distribution(const Head& head, matrix_view<const H> hidden, index_t class_begin, index_t class_end,
                           matrix_view<float> out) {
  using T = typename Head::storage_type;
  const char* where = "full_softmax::log_distribution";
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden(where, res, hidden, d);
  expects<out_of_range>(class_begin >= 0 && class_begin < class_end && class_end <= n_cls, where, ": class range [",
                        class_begin, ", ", class_end, ") is empty or outside [0, ", n_cls, ")");
  detail::check_output(where, "out", out, hidden.rows, class_end - class_begin);

  const cudaStream_t stream = res.stream();
  arena a(res.workspace(), stream);
  const auto buf = log_distribution_buffers<T>::take(a, hidden.rows, d, head.chunk_size_for(hidden.rows));
  full_log_distribution_enqueue(head, hidden, class_begin, class_end, out, buf);
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

/// full_log_distribution without waiting: shape checks now, the finite-hidden check recorded on the
/// device.
template <class Head, class H>
void full_log_distribution_async(const Head& head, matrix_view<const H> hidden, index_t class_begin,
                                 index_t class_end, matrix_view<float> out) {
  using T = typename Head::storage_type;
  const char* where = "full_softmax::log_distribution";
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden_shape(where, hidden, d);
  expects<out_of_range>(class_begin >= 0 && class_begin < class_end && class_end <= n_cls, where, ": class range [",
                        class_begin, ", ", class_end, ") is empty or outside [0, ", n_cls, ")");
  detail::check_output(where, "out", out, hidden.rows, class_end - class_begin);

  const index_t chunk = head.chunk_size_for(hidden.rows);
  workspace_plan plan;
  (void)log_distribution_buffers<T>::take(plan, hidden.rows, d, chunk, /*async=*/true);
  reserve_for_async(res, plan.bytes());
  device_status* st = res.begin_async();
  arena a(res.workspace(), res.stream());
  const auto buf = log_distribution_buffers<T>::take(a, hidden.rows, d, chunk, /*async=*/true);
  check_hidden_async(where, res, hidden, d, st, buf.slot);
  full_log_distribution_enqueue(head, hidden, class_begin, class_end, out, buf);
}

}  // namespace xsoftmax::detail::gpu
