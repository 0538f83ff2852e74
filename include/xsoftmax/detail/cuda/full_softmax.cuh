// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `full_softmax` on the `cuda` backend: the verbs behind `device_heads<cuda>::full_*`. Same checks,
/// messages and semantics as the host implementation in detail/full_softmax.inl; the work is the
/// dense-block machinery of dense.cuh applied to all packed rows and all classes.
///
/// One difference in how the work is cut (not in what is computed): the number of classes per
/// chunk is `head.chunk_size_for(B)` for the whole batch B, not for the packed (non-ignored) rows,
/// so that every buffer's size is known before the batch is looked at (`cuda_workspace_bytes`).

#include <xsoftmax/detail/cuda/common.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>

#include <cub/device/device_segmented_sort.cuh>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/sequence.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace xsoftmax::detail::gpu {

/// The workspace pieces of one forward / backward / log_prob call. `take` works with an `arena`
/// (the run) and with a `workspace_plan` (the size query), so both see the same list.
template <class T>
struct full_run_buffers {
  index_t* sample = nullptr;
  index_t* target = nullptr;
  float* upstream = nullptr;
  T* hidden = nullptr;
  float* loss = nullptr;
  float* grad_h = nullptr;
  dense_scratch<T> sc;

  template <class Alloc>
  static full_run_buffers take(Alloc& a, index_t batch_rows, index_t dim, index_t chunk, bool backward) {
    full_run_buffers f;
    f.sample = a.template take<index_t>(batch_rows);
    f.target = a.template take<index_t>(batch_rows);
    f.hidden = a.template take<T>(batch_rows * dim);
    f.loss = a.template take<float>(batch_rows);
    f.sc = dense_scratch<T>::take(a, batch_rows, chunk, backward);
    if (backward) {
      f.upstream = a.template take<float>(batch_rows);
      f.grad_h = a.template take<float>(batch_rows * dim);
    }
    return f;
  }
};

/// Workspace bytes of a full-softmax forward (backward = false) or forward_backward / backward
/// (backward = true) over a batch of `batch_rows` rows.
template <class Head>
[[nodiscard]] std::size_t full_run_workspace_bytes(const Head& head, index_t batch_rows, bool backward) {
  workspace_plan plan;
  (void)full_run_buffers<typename Head::storage_type>::take(plan, batch_rows, head.dim(),
                                                            head.chunk_size_for(batch_rows), backward);
  return plan.bytes();
}

template <class Head, class H>
float full_run(const Head& head, const char* where, matrix_view<const H> hidden, vector_view<const index_t> targets,
               loss_options options, vector_view<float> per_sample, matrix_view<float>* grad_hidden,
               sparse_gradient<cuda, float>* grad_weights, vector_view<const float> grad_output) {
  using T = typename Head::storage_type;
  const cuda_resources& res = head.resources();
  const auto policy = backend_traits<cuda>::policy(res);
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden(where, res, hidden, d);
  check_targets(where, res, targets, hidden.rows, n_cls, options.ignore_index);
  if ((options.reduce == reduction::none && !grad_weights) || per_sample.size != 0)  // backward has no per_sample
    detail::check_output(where, "per_sample", per_sample, hidden.rows);
  if (grad_hidden) detail::check_output(where, "grad_hidden", *grad_hidden, hidden.rows, d);

  const bool backward = grad_weights != nullptr;
  arena a(res.workspace(), res.stream());
  const full_run_buffers<T> buf =
      full_run_buffers<T>::take(a, hidden.rows, d, head.chunk_size_for(hidden.rows), backward);
  const index_t rows = select_rows(res, targets, options.ignore_index, buf.sample);
  thrust::gather(policy, buf.sample, buf.sample + rows, targets.data, buf.target);
  if (backward)
    upstream_gradients(where, res, buf.sample, rows, hidden.rows, options.reduce, grad_output, buf.upstream);
  pack_rows(res, hidden, buf.sample, rows, buf.hidden);

  const auto w = matrix_view<const T>(head.weights());
  const T* bias = head.bias();
  dense_block<T> block;
  block.h = buf.hidden;
  block.rows = rows;
  block.dim = d;
  block.w = w;
  block.bias = bias;
  block.first = 0;
  block.n = n_cls;
  block.target_col = buf.target;  // the class is the column: the block starts at class 0

  // Pass 1: online log-sum-exp over all classes, chunk by chunk; loss = lse - target logit.
  dense_lse(res, block, buf.sc);
  dense_losses(res, block, buf.sc, buf.loss, false);

  if (backward) {
    // Pass 2: recompute each chunk, produce grad_hidden (accumulated over chunks) and the chunk's
    // weight-gradient rows (written once). The exact softmax touches every class.
    sparse_gradient<cuda, float>& g = *grad_weights;
    g.dim = d;
    const index_t touched = rows > 0 ? n_cls : 0;
    g.rows.resize(static_cast<std::size_t>(touched));
    g.values.resize(static_cast<std::size_t>(touched * d));
    g.bias_values.resize(bias && touched ? static_cast<std::size_t>(touched) : 0);
    if (rows > 0) {
      thrust::sequence(policy, g.rows.begin(), g.rows.end());
      thrust::fill_n(policy, buf.grad_h, rows * d, 0.f);
      const float scale = gradient_scale(res, buf.upstream, rows);
      dense_backward(res, block, buf.sc, buf.upstream, scale, buf.grad_h, thrust::raw_pointer_cast(g.values.data()),
                     bias ? thrust::raw_pointer_cast(g.bias_values.data()) : nullptr);
    }
    if (grad_hidden) scatter_rows(res, buf.grad_h, buf.sample, rows, *grad_hidden);
  }
  if (per_sample.size != 0) scatter_losses(res, buf.loss, buf.sample, rows, per_sample);
  return reduce_losses(res, buf.loss, rows, options.reduce);  // waits for the stream
}

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

template <class Head, class H>
void full_topk(const Head& head, matrix_view<const H> hidden, index_t k, matrix_view<index_t> classes,
               matrix_view<float> log_probs) {
  using T = typename Head::storage_type;
  const char* where = "full_softmax::topk";
  const cuda_resources& res = head.resources();
  const index_t n_cls = head.num_classes(), d = head.dim();
  check_hidden(where, res, hidden, d);
  expects(k >= 1 && k <= n_cls, where, ": k = ", k, " must be in [1, num_classes = ", n_cls, "]");
  detail::check_output(where, "classes", classes, hidden.rows, k);
  detail::check_output(where, "log_probs", log_probs, hidden.rows, k);

  const index_t rows = hidden.rows, chunk = head.chunk_size_for(rows);
  const index_t len = k + chunk;  // candidates per row and chunk (at most)
  const cudaStream_t stream = res.stream();
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  const dense_scratch<T> sc = dense_scratch<T>::take(a, rows, chunk, /*with_grad=*/false);
  float* kept_score = a.take<float>(rows * k);
  index_t* kept_index = a.take<index_t>(rows * k);
  float* cand_score = a.take<float>(rows * len);
  index_t* cand_index = a.take<index_t>(rows * len);
  float* sorted_score = a.take<float>(rows * len);
  index_t* sorted_index = a.take<index_t>(rows * len);
  // CUB's temporary storage for the two segment lengths that occur (full chunks, the last one).
  const index_t last_len = k + (n_cls - (n_cls - 1) / chunk * chunk);
  const std::size_t temp_bytes =
      std::max(segmented_sort_bytes(rows, len, stream), segmented_sort_bytes(rows, last_len, stream));
  void* temp = a.take<unsigned char>(static_cast<index_t>(temp_bytes));

  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, hs);
  dense_block<T> block;
  block.h = hs;
  block.rows = rows;
  block.dim = d;
  block.w = matrix_view<const T>(head.weights());
  block.bias = head.bias();
  block.first = 0;
  block.n = n_cls;
  dense_lse_begin(res, block, sc);
  topk_init_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows * k, kept_score, kept_index);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  for (index_t c0 = 0; c0 < n_cls; c0 += chunk) {
    const index_t cn = std::min(chunk, n_cls - c0), seg = k + cn;
    dense_lse_chunk(res, block, sc, c0, cn);  // sc.scores now holds the chunk's biased scores
    topk_candidates_kernel<><<<grid_for(rows * seg), block_threads, 0, stream>>>(
        rows, k, cn, c0, kept_score, kept_index, sc.scores, cand_score, cand_index);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    const auto offsets = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), segment_offset{seg});
    std::size_t bytes = temp_bytes;
    XSOFTMAX_CUDA_TRY(cub::DeviceSegmentedSort::StableSortPairsDescending(
        temp, bytes, static_cast<const float*>(cand_score), sorted_score, static_cast<const index_t*>(cand_index),
        sorted_index, rows * seg, rows, offsets, offsets + 1, stream));
    topk_keep_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows, k, seg, sorted_score, sorted_index,
                                                                        kept_score, kept_index);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
  dense_lse_end(res, block, sc);
  topk_output_kernel<><<<grid_for(rows * k), block_threads, 0, stream>>>(rows, k, kept_score, kept_index, sc.lse,
                                                                        classes, log_probs);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
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

  const index_t rows = hidden.rows, chunk = head.chunk_size_for(rows);
  const cudaStream_t stream = res.stream();
  arena a(res.workspace(), stream);
  T* hs = a.take<T>(rows * d);
  const dense_scratch<T> sc = dense_scratch<T>::take(a, rows, chunk, /*with_grad=*/false);

  pack_rows(res, hidden, static_cast<const index_t*>(nullptr), rows, hs);
  dense_block<T> block;
  block.h = hs;
  block.rows = rows;
  block.dim = d;
  block.w = matrix_view<const T>(head.weights());
  block.bias = head.bias();
  block.first = 0;
  block.n = n_cls;
  dense_lse(res, block, sc);
  for (index_t c0 = class_begin; c0 < class_end; c0 += chunk) {
    const index_t cn = std::min(chunk, class_end - c0);
    chunk_scores(res, block, c0, cn, sc.scores);
    log_distribution_kernel<T><<<grid_for(rows * cn), block_threads, 0, stream>>>(
        rows, cn, sc.scores, block.bias ? block.bias + c0 : nullptr, sc.lse, out, c0 - class_begin);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

}  // namespace xsoftmax::detail::gpu
