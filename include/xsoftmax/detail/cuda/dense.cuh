// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The dense-block machinery of the CUDA heads: packed rows scored against a contiguous range of
/// weight rows, chunk by chunk of columns, through cuBLAS, with a fused online log-sum-exp epilogue
/// (bias added, target logit captured); and the backward pass, which recomputes each chunk's scores,
/// turns them into dLoss/dscore in place and runs the two gradient GEMMs.
///
/// The full softmax is the special case "all packed rows against all N classes"; the hierarchical
/// softmax uses it for each long run of samples against its node's block of child rows. Memory:
/// O(rows x chunk) scores, never O(rows x n).

#include <xsoftmax/detail/cuda/gemm.cuh>
#include <xsoftmax/detail/cuda/gradient_scale.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <type_traits>

namespace xsoftmax::detail::gpu {

/// Packed rows against weight rows [first, first + n).
template <class T>
struct dense_block {
  const T* h = nullptr;  ///< rows x dim, dense (leading dimension dim), storage type
  index_t rows = 0, dim = 0;
  matrix_view<const T> w;               ///< the whole weight matrix
  const T* bias = nullptr;              ///< the whole bias, or null
  index_t first = 0, n = 0;             ///< weight rows [first, first + n)
  const index_t* target_col = nullptr;  ///< rows entries, the target's column in [0, n); null: none
};

/// Scratch of a dense block. Per-row arrays have `rows` entries (for a run inside a larger batch,
/// pointers to the run's first row); `scores` and `grad` hold one chunk (rows x chunk).
template <class T>
struct dense_scratch {
  index_t chunk = 0;
  float* scores = nullptr;  ///< rows x chunk, fp32
  T* grad = nullptr;        ///< rows x chunk, storage-type copy of dLoss/dscore; unused for fp32
  float* run_max = nullptr;
  float* run_sum = nullptr;
  float* target_logit = nullptr;
  float* lse = nullptr;

  /// Carves the per-row arrays for `rows` rows, and `rows x chunk` scores when `chunk` > 0 (plus
  /// their storage-type copy when `with_grad` and T is not fp32), out of an arena.
  template <class Alloc>
  static dense_scratch take(Alloc& a, index_t rows, index_t chunk, bool with_grad) {
    dense_scratch sc;
    sc.chunk = chunk;
    if (chunk > 0) sc.scores = a.template take<float>(rows * chunk);
    if (chunk > 0 && with_grad && !std::is_same_v<T, float>) sc.grad = a.template take<T>(rows * chunk);
    sc.run_max = a.template take<float>(rows);
    sc.run_sum = a.template take<float>(rows);
    sc.target_logit = a.template take<float>(rows);
    sc.lse = a.template take<float>(rows);
    return sc;
  }
};

/// Columns per chunk for `rows` rows when nothing is configured: about 32 MiB of fp32 scores (as
/// full_softmax::chunk_size_for), at most `n`.
[[nodiscard]] inline index_t default_chunk(index_t rows, index_t n) {
  return std::min(default_chunk_columns(rows), n);
}

struct max_op {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};

template <class Unused = void>
__global__ void lse_init_kernel(index_t rows, float* run_max, float* run_sum, float* target_logit) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) {
    run_max[r] = -INFINITY;
    run_sum[r] = 0.f;
    target_logit[r] = 0.f;
  }
}

/// One block per row of a chunk of scores s (rows x cn): adds the bias in place, folds the row into
/// the running (max, sum of exp) and captures the target's logit when it falls in the chunk.
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    lse_chunk_kernel(float* s, index_t rows, index_t cn, const T* bias_chunk, const index_t* target_col,
                     index_t col0, float* run_max, float* run_sum, float* target_logit) {
  using block_reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename block_reduce::TempStorage temp;
  __shared__ float chunk_max;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = s + r * cn;
    float local_max = -INFINITY;
    for (index_t j = threadIdx.x; j < cn; j += Threads) {
      float v = row[j];
      if (bias_chunk) {
        v += to_float(bias_chunk[j]);
        row[j] = v;  // later passes (top-k, log_distribution) read biased scores
      }
      local_max = v > local_max ? v : local_max;
    }
    const float m_reduced = block_reduce(temp).Reduce(local_max, max_op{});  // valid in thread 0
    if (threadIdx.x == 0) chunk_max = m_reduced;
    __syncthreads();  // publishes chunk_max and the biased row; also frees `temp` for reuse
    const float m = chunk_max;
    float local_sum = 0.f;
    if (m != -INFINITY)  // a row of -inf scores adds nothing (and -inf - -inf would be NaN)
      for (index_t j = threadIdx.x; j < cn; j += Threads) local_sum += expf(row[j] - m);
    const float sum = block_reduce(temp).Sum(local_sum);  // valid in thread 0
    if (threadIdx.x == 0) {
      const float old_max = run_max[r];
      const float new_max = old_max > m ? old_max : m;
      if (new_max != -INFINITY) {
        // Rescale both partial sums to the new max (exp(-inf) = 0 for an empty side).
        run_sum[r] = run_sum[r] * expf(old_max - new_max) + sum * expf(m - new_max);
        run_max[r] = new_max;
      }
      if (target_col) {
        const index_t t = target_col[r] - col0;
        if (t >= 0 && t < cn) target_logit[r] = row[t];
      }
    }
    __syncthreads();  // `temp` and `chunk_max` are reused by the next row
  }
}

template <class Unused = void>
__global__ void lse_finish_kernel(index_t rows, const float* run_max, const float* run_sum, float* lse) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) lse[r] = run_max[r] + logf(run_sum[r]);
}

/// loss[r] = lse[r] - target_logit[r], or += when `accumulate` (the levels of a tree add up).
template <class Unused = void>
__global__ void add_losses_kernel(index_t rows, const float* lse, const float* target_logit, float* loss,
                                  bool accumulate) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) {
    const float l = lse[r] - target_logit[r];
    loss[r] = accumulate ? loss[r] + l : l;
  }
}

/// G = softmax - onehot(target), times the row's upstream gradient, in place over the chunk's
/// scores (bias added first), plus a storage-type copy scaled by `grad_scale` for the GEMMs.
template <class T>
__global__ void softmax_grad_kernel(float* s, T* g_storage, index_t rows, index_t cn, const T* bias_chunk,
                                    const float* lse, const float* upstream, const index_t* target_col,
                                    index_t col0, float grad_scale) {
  const index_t n = rows * cn;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / cn, j = e - r * cn;
    float v = s[e];
    if (bias_chunk) v += to_float(bias_chunk[j]);
    float g = expf(v - lse[r]) * upstream[r];
    if (target_col[r] - col0 == j) g -= upstream[r];
    s[e] = g;
    if (g_storage) g_storage[e] = from_float<T>(g * grad_scale);
  }
}

/// out[j] = sum over rows r (in order: deterministic) of g[r * cn + j]. Adjacent threads read
/// adjacent columns, so every row's read is coalesced.
template <class Unused = void>
__global__ void column_sums_kernel(const float* g, index_t rows, index_t cn, float* out) {
  for (index_t j = global_thread(); j < cn; j += grid_threads()) {
    float acc = 0.f;
    for (index_t r = 0; r < rows; ++r) acc += g[r * cn + j];
    out[j] = acc;
  }
}

/// Raw scores S (rows x cn, leading dimension cn) = H * W[first + c0 : + cn]^T, no bias.
template <class T>
void chunk_scores(const cuda_resources& res, const dense_block<T>& b, index_t c0, index_t cn, float* s) {
  gemm<T>(res.cublas(), op::none, op::transpose, b.rows, cn, b.dim, 1.f, b.h, b.dim, b.w.row(b.first + c0),
          b.w.stride, 0.f, s, cn);
}

inline constexpr int lse_threads = 256;

/// Resets the running log-sum-exp state of the block's rows.
template <class T>
void dense_lse_begin(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc) {
  lse_init_kernel<><<<grid_for(b.rows), block_threads, 0, res.stream()>>>(b.rows, sc.run_max, sc.run_sum,
                                                                         sc.target_logit);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// Scores of columns [c0, c0 + cn) into sc.scores (bias included) folded into the running state.
template <class T>
void dense_lse_chunk(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc, index_t c0,
                     index_t cn) {
  chunk_scores(res, b, c0, cn, sc.scores);
  lse_chunk_kernel<lse_threads, T><<<grid_rows(b.rows), lse_threads, 0, res.stream()>>>(
      sc.scores, b.rows, cn, b.bias ? b.bias + b.first + c0 : nullptr, b.target_col, c0, sc.run_max, sc.run_sum,
      sc.target_logit);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// sc.lse[r] = log-sum-exp of row r over everything folded in.
template <class T>
void dense_lse_end(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc) {
  lse_finish_kernel<><<<grid_for(b.rows), block_threads, 0, res.stream()>>>(b.rows, sc.run_max, sc.run_sum, sc.lse);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// The whole log-sum-exp pass over the block's n columns; then sc.lse and sc.target_logit hold
/// each row's log-sum-exp and target logit.
template <class T>
void dense_lse(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc) {
  if (b.rows == 0) return;
  dense_lse_begin(res, b, sc);
  for (index_t c0 = 0; c0 < b.n; c0 += sc.chunk) dense_lse_chunk(res, b, sc, c0, std::min(sc.chunk, b.n - c0));
  dense_lse_end(res, b, sc);
}

/// loss[r] (=, or += when accumulate) sc.lse[r] - sc.target_logit[r] for the block's rows.
template <class T>
void dense_losses(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc, float* loss,
                  bool accumulate) {
  if (b.rows == 0) return;
  add_losses_kernel<><<<grid_for(b.rows), block_threads, 0, res.stream()>>>(b.rows, sc.lse, sc.target_logit, loss,
                                                                           accumulate);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// Whether the gradient GEMMs of storage type T read G scaled by a power of two (gradient_scale).
/// fp16 needs it: G = (softmax - onehot) * upstream is often far below fp16's smallest normal
/// (2^-14), e.g. 1/N times a mean's 1/B. bf16 has fp32's exponent range, so scaling by a power of
/// two would change no bit of the result: bf16 skips it, and with it gradient_scale's reduction,
/// its host read and (in the `_async` path) the rescaling passes. fp32 GEMMs read G itself.
template <class T>
inline constexpr bool scales_gradient = std::is_same_v<T, __half>;

/// The backward pass (after dense_lse): for each chunk, recomputes the scores, forms
/// G = (softmax - onehot) * upstream and
///   grad_h (rows x dim)           += G (rows x cn) * W_chunk (cn x dim)
///   grad_w[c0 : c0 + cn] (x dim)   = G^T (cn x rows) * H (rows x dim)
///   grad_b[c0 : c0 + cn]           = column sums of G (rows in order)
/// The GEMMs read G in the storage type (tensor cores for bf16/fp16); for fp16 scaled by
/// `grad_scale` (gradient_scale) and scaled back exactly through alpha (`scales_gradient`; other
/// types ignore `grad_scale`). grad_b may be null.
template <class T>
void dense_backward(const cuda_resources& res, const dense_block<T>& b, const dense_scratch<T>& sc,
                    const float* upstream, float grad_scale, float* grad_h, float* grad_w, float* grad_b) {
  if (b.rows == 0) return;
  constexpr bool fp32 = std::is_same_v<T, float>;
  const float scale = scales_gradient<T> ? grad_scale : 1.f;
  const float alpha = 1.f / scale;  // exact: scale is a power of two
  for (index_t c0 = 0; c0 < b.n; c0 += sc.chunk) {
    const index_t cn = std::min(sc.chunk, b.n - c0);
    chunk_scores(res, b, c0, cn, sc.scores);
    softmax_grad_kernel<T><<<grid_for(b.rows * cn), block_threads, 0, res.stream()>>>(
        sc.scores, fp32 ? nullptr : sc.grad, b.rows, cn, b.bias ? b.bias + b.first + c0 : nullptr, sc.lse, upstream,
        b.target_col, c0, scale);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    const T* g = fp32 ? reinterpret_cast<const T*>(sc.scores) : sc.grad;
    const T* w_chunk = b.w.row(b.first + c0);
    gemm<T>(res.cublas(), op::none, op::none, b.rows, b.dim, cn, alpha, g, cn, w_chunk, b.w.stride, 1.f, grad_h,
            b.dim);
    gemm<T>(res.cublas(), op::transpose, op::none, cn, b.dim, b.rows, alpha, g, cn, b.h, b.dim, 0.f,
            grad_w + c0 * b.dim, b.dim);
    if (grad_b) {
      column_sums_kernel<><<<grid_for(cn), block_threads, 0, res.stream()>>>(sc.scores, b.rows, cn, grad_b + c0);
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace xsoftmax::detail::gpu
