// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The cuda backend's tuned parts of the dense softmax, each a specialisation of a hook of a generic
/// primitive whose generic version stays its oracle (tests/cuda/dense_tuned_cuda_test.cu compares
/// the two); the chunk loop, score cache, log-sum-exp, loss and bias gradient stay the generic
/// algorithm's:
///  * `dense_softmax_tuning<cuda, T>`, bf16/fp16 weights: the packed rows are rounded to the storage
///    type once and every GEMM reads the weights in place on the tensor cores (fp32 accumulation),
///    instead of the generic per-chunk widening of the weight rows to fp32 (TF32 GEMMs); the bias
///    one thread per element, the gradient G (rounded to T for the GEMMs in the same pass) a row at
///    a time with 16-byte accesses for chunks of 1024 columns or more, else one thread per element.
///    Gathered columns (the selective, sampled and KNN softmax's active sets) are gathered in T, a
///    chunk at a time, into the workspace. It serves the plain loss, with or without logit offsets,
///    without loss terms, margins or row combination (the full softmax's plain loss, the
///    hierarchical softmax's dense runs, the selective heads' shared pass), and the score chunks
///    of the verbs that only read scores (`for_each_score_chunk`, primitives/score_chunks.hpp).
///  * `online_lse_tuning<cuda>`: one thread block per row instead of one thread per row: rows of
///    1024 columns or more in one online pass for the max and the sum of exp (16-byte reads, a CUB
///    block reduction of (max, sum) pairs), narrower rows in two passes (max, then sum).
///
/// Measured on an H200 (bench/RESULTS.md, the third GPU session) before the row-wise gradient and
/// the one-pass log-sum-exp: the two element-wise passes over a 4096 x 16384 chunk took 224 us
/// (gradient: 6 bytes an element, floor 94 us) and 127 us (log-sum-exp, which read each row twice:
/// floor 63 us for one read).

#include <xsoftmax/detail/cuda/gemm.cuh>
#include <xsoftmax/detail/cuda/gradient_scale.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/cuda/workspace.cuh>
#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/kept_columns.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace xsoftmax::detail {
namespace gpu {

/// One block per row r of s (rows x cols, leading dimension lds): `online_lse_update`'s fold of the
/// row into the running (max, sum of exp) and its target capture.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    online_lse_kernel(const float* s, index_t rows, index_t cols, index_t lds, index_t col_offset,
                      const index_t* targets, float* run_max, float* run_sum, float* target_logit) {
  __shared__ typename cub::BlockReduce<float2, Threads>::TempStorage temp_pairs;
  __shared__ typename cub::BlockReduce<float, Threads>::TempStorage temp;
  // Wide rows (the full softmax's chunks) in one online pass, reading each value once; narrow rows
  // (the hierarchical softmax's nodes) in two passes with every thread busy: on 100-column rows the
  // one-pass form, a quarter of the threads at work, took 28 % longer (bench/RESULTS.md).
  const bool one_pass = cols >= 4 * Threads;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = s + r * lds;
    if (r != blockIdx.x) __syncthreads();  // the last row's reduction is done with `temp_pairs`
    const float2 ms = one_pass ? block_online_max_sum<Threads>(row, cols, temp_pairs)
                               : block_max_sum<Threads>(row, cols, temp);
    if (threadIdx.x != 0) continue;
    const float old_max = run_max[r], new_max = old_max > ms.x ? old_max : ms.x;
    if (new_max != -INFINITY) {  // both partial sums rescaled to the new max (exp(-inf) = 0)
      run_sum[r] = run_sum[r] * expf(old_max - new_max) + ms.y * expf(ms.x - new_max);
      run_max[r] = new_max;
    }
    const index_t t = targets ? targets[r] - col_offset : -1;
    if (t >= 0 && t < cols) target_logit[r] = row[t];
  }
}

/// s[r * cn + j] += b[j], one thread per element.
template <class T>
struct add_bias {
  float* s;
  const T* b;
  index_t cn;
  XSOFTMAX_HD void operator()(index_t e) const { s[e] += to_float(b[e % cn]); }
};

/// The dense softmax's plain-loss gradient of element e of a chunk (rows x cn, columns from c0) of
/// biased scores, in T times `scale` for the tensor-core GEMMs, and (`keep_fp32`: for the bias
/// gradient's column sums) in fp32 in place. Without a bias the fp32 copy is not written: 4 bytes
/// of the ~26 each score element moves.
template <class T>
struct softmax_gradient {
  float* s;
  T* g;
  index_t cn, c0;
  const float* lse;
  const float* upstream;
  const index_t* target;
  float scale;
  bool keep_fp32;
  float filter;          ///< gradient filtering (`dense_softmax_args::gradient_filter`); 0: none
  unsigned char* kept;   ///< with a filter: kept[j] = 1 for a column with a non-zero entry (else null)
  /// dLoss/dscore of a score x of a row with log-sum-exp l and upstream gradient u, in the target's
  /// column or not, 0 when below the filter's cut (`filter` |u|): the one formula of both kernels.
  XSOFTMAX_HD static float value(float x, float l, float u, bool target_column, float filter) {
    const float v = expf(x - l) * u - (target_column ? u : 0.f);
    return fabsf(v) < filter * fabsf(u) ? 0.f : v;
  }
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t r = e / cn, j = e - r * cn;
    const float v = value(s[e], lse[r], upstream[r], target[r] - c0 == j, filter);
    if (keep_fp32) s[e] = v;
    if (kept && v != 0.f) kept[j] = 1;  // every writer stores the same 1
    g[e] = from_float<T>(v * scale);
  }
};

/// `softmax_gradient` a row at a time: blockIdx.y strides over the rows (the row's log-sum-exp,
/// upstream gradient and target read once), the x blocks over its columns, four columns a thread
/// with 16-byte loads of s and 4-element stores of G when `vec` (cn a multiple of 4, s 16-byte and
/// g 4-element aligned). No integer division per element. For chunks of 1024 columns or more.
template <class T, int Threads>
__global__ void __launch_bounds__(Threads)
    softmax_gradient_rows_kernel(float* s, T* g, index_t rows, index_t cn, index_t c0, const float* lse,
                                 const float* upstream, const index_t* target, float scale, bool keep_fp32, bool vec,
                                 float filter, unsigned char* kept) {
  struct alignas(4 * sizeof(T)) four {
    T v[4];
  };
  for (index_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float l = lse[r], u = upstream[r];
    const index_t t = target[r] - c0;  // outside [0, cn): not in this chunk
    float* sr = s + r * cn;
    T* gr = g + r * cn;
    const index_t first = static_cast<index_t>(blockIdx.x) * Threads + threadIdx.x, step = static_cast<index_t>(gridDim.x) * Threads;
    if (vec) {
      for (index_t q = first; q < cn / 4; q += step) {
        float4 v = reinterpret_cast<const float4*>(sr)[q];
        const index_t j = 4 * q;
        using grad = softmax_gradient<T>;
        v.x = grad::value(v.x, l, u, j == t, filter);
        v.y = grad::value(v.y, l, u, j + 1 == t, filter);
        v.z = grad::value(v.z, l, u, j + 2 == t, filter);
        v.w = grad::value(v.w, l, u, j + 3 == t, filter);
        if (keep_fp32) reinterpret_cast<float4*>(sr)[q] = v;
        if (kept) {  // every writer stores the same 1
          if (v.x != 0.f) kept[j] = 1;
          if (v.y != 0.f) kept[j + 1] = 1;
          if (v.z != 0.f) kept[j + 2] = 1;
          if (v.w != 0.f) kept[j + 3] = 1;
        }
        four o;
        o.v[0] = from_float<T>(v.x * scale);
        o.v[1] = from_float<T>(v.y * scale);
        o.v[2] = from_float<T>(v.z * scale);
        o.v[3] = from_float<T>(v.w * scale);
        reinterpret_cast<four*>(gr)[q] = o;
      }
    } else {
      for (index_t j = first; j < cn; j += step) {
        const float v = softmax_gradient<T>::value(sr[j], l, u, j == t, filter);
        if (keep_fp32) sr[j] = v;
        if (kept && v != 0.f) kept[j] = 1;
        gr[j] = from_float<T>(v * scale);
      }
    }
  }
}

}  // namespace gpu

template <>
struct online_lse_tuning<::xsoftmax::cuda> {
  static constexpr bool available = true;

  template <class State>
  static void update(const execution<::xsoftmax::cuda>& ex, const float* s, index_t rows, index_t cols, index_t lds,
                     index_t col_offset, const index_t* targets, State& state) {
    if (rows == 0) return;
    gpu::online_lse_kernel<gpu::block_threads><<<gpu::grid_rows(rows), gpu::block_threads, 0, ex.res.stream()>>>(
        s, rows, cols, lds, col_offset, targets, raw(state.max), raw(state.sum), raw(state.target_logit));
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }
};

template <class T>
struct dense_softmax_tuning<::xsoftmax::cuda, T> {
  static constexpr bool available = !std::is_same_v<T, float>;

  /// The plain loss (logit offsets allowed: they shift the scores, not the gradient's form), over
  /// a block of weight rows or gathered columns; not margins, loss terms or row combination.
  [[nodiscard]] static bool applies(const dense_softmax_args& a) {
    return a.plain_loss() && !a.margin.enabled() && !a.combine_rows;
  }

  /// Rounds the rows to T (in the workspace, with G's chunk when backward); for fp16, the scale
  /// of G (`gradient_scale`). With gathered columns, room for a chunk's weight rows (and bias) in T.
  dense_softmax_tuning(const execution<::xsoftmax::cuda>& ex, const dense_softmax_args& a, index_t chunk)
      : ex_(ex), a_(a), scratch_(ex.res.workspace()), rows_(a.h.rows), d_(a.h.cols) {
    h_ = scratch_.take<T>(rows_ * d_);
    rows_to_storage(ex_, a.h, h_);
    if (a.columns) {
      w_gathered_ = scratch_.take<T>(chunk * d_);
      b_gathered_ = scratch_.take<T>(chunk);
    }
    if (!a.upstream) return;
    g_ = scratch_.take<T>(rows_ * chunk);
    if constexpr (gpu::scales_gradient<T>) scale_ = gpu::gradient_scale(ex.res, a.upstream, rows_);
    if (a.gradient_filter > 0.f) {  // a chunk's kept columns, and G, W and G^T H on at most half of them
      const index_t half = (chunk + 1) / 2;
      kept_flags_ = scratch_.take<unsigned char>(chunk);
      kept_ = scratch_.take<index_t>(chunk);
      g_kept_ = scratch_.take<T>(rows_ * half);
      w_kept_ = scratch_.take<T>(half * d_);
      grad_kept_ = scratch_.take<float>(half * d_);
    }
  }

  /// s (rows x cn) = H W_chunk^T + bias_chunk for chunk c0's columns (weight rows a.first + c0 ...
  /// read in place, or the gathered rows a.columns[c0 ...]).
  void scores(matrix_view<const T> w, const T* bias, index_t c0, index_t cn, float* s) {
    const matrix_view<const T> wc = chunk_rows(w, c0, cn);
    gpu::gemm<T>(ex_.res.cublas(), gpu::op::none, gpu::op::transpose, rows_, cn, d_, 1.f, h_, d_, wc.data,
                 wc.stride, 0.f, s, cn);
    if (!bias) return;
    const T* bc = bias + a_.first + c0;
    if (a_.columns) {
      parallel_for(ex_, cn, gather_listed_rows<T>{bias, 1, a_.columns + c0, 1, b_gathered_});
      bc = b_gathered_;
    }
    parallel_for(ex_, rows_ * cn, gpu::add_bias<T>{s, bc, cn});
  }

  /// Chunk c0's scores s (rows x cn) -> G = (softmax - onehot) * upstream in T times `scale_`
  /// (one thread per element), and in place in fp32 when the bias gradient reads it; then
  /// grad_h += G W_chunk and grad_w[c0 : c0 + cn] = (or +=, a later row block) G^T H, reading the
  /// copy in T, scaled back exactly through alpha (into `grad_w_storage` in T when the args have it).
  void backward(matrix_view<const T> w, index_t c0, index_t cn, float* s, const float* lse) {
    const bool keep_fp32 = a_.grad_b != nullptr;
    const float filter = a_.gradient_filter;
    unsigned char* const flags = filter > 0.f ? kept_flags_ : nullptr;
    if (flags) XSOFTMAX_CUDA_TRY(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(cn), ex_.res.stream()));
    if (cn >= 1024) {  // wide chunks (the full softmax): a row at a time, vectorised
      const bool vec = cn % 4 == 0 && reinterpret_cast<std::uintptr_t>(s) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(g_) % (4 * sizeof(T)) == 0;
      const index_t x_blocks = (cn / (vec ? 4 : 1) + gpu::block_threads - 1) / gpu::block_threads;
      const dim3 grid(static_cast<unsigned>(x_blocks), static_cast<unsigned>(std::min<index_t>(rows_, 65535)));
      gpu::softmax_gradient_rows_kernel<T, gpu::block_threads><<<grid, gpu::block_threads, 0, ex_.res.stream()>>>(
          s, g_, rows_, cn, c0, lse, a_.upstream, a_.target, scale_, keep_fp32, vec, filter, flags);
      XSOFTMAX_CUDA_CHECK_LAUNCH();
    } else {  // narrow chunks (the hierarchical softmax's runs): a thread per element
      parallel_for(ex_, rows_ * cn, gpu::softmax_gradient<T>{s, g_, cn, c0, lse, a_.upstream, a_.target, scale_,
                                                             keep_fp32, filter, flags});
    }
    const matrix_view<const T> wc = chunk_rows(w, c0, cn);
    if (flags) {  // the kept columns' ids, in order: one read-back a chunk for the GEMMs' size
      const index_t count = kept_column_ids(ex_, flags, cn, kept_);
      if (2 * count <= cn) {
        gemms_over_kept_columns(wc, c0, cn, count);
        return;
      }
    }
    gradient_gemms(g_, cn, wc, a_.accumulate_weight_gradient, c0);
  }

 private:
  execution<::xsoftmax::cuda> ex_;
  const dense_softmax_args& a_;
  gpu::arena scratch_;
  index_t rows_, d_;
  T* h_ = nullptr;
  T* g_ = nullptr;
  float scale_ = 1.f;
  T* w_gathered_ = nullptr;  // with columns: one chunk's weight rows (chunk x d) and bias entries
  T* b_gathered_ = nullptr;
  index_t gathered_c0_ = -1;  // the chunk whose rows w_gathered_ holds (-1: none)
  // Gradient filtering: a chunk's column flags and kept column ids; G, the weight rows and G^T H's
  // rows of at most half a chunk's columns.
  unsigned char* kept_flags_ = nullptr;
  index_t* kept_ = nullptr;
  T* g_kept_ = nullptr;
  T* w_kept_ = nullptr;
  float* grad_kept_ = nullptr;

  /// grad_h += G W_chunk and the chunk's weight-gradient rows from c0 = G^T H (+= with `accumulate`),
  /// G being `g` (rows x cols, scaled by `scale_`) against `wc`'s cols rows.
  void gradient_gemms(const T* g, index_t cols, matrix_view<const T> wc, bool accumulate, index_t c0) {
    const float alpha = 1.f / scale_;  // exact: a power of two
    cublasHandle_t h = ex_.res.cublas();
    gpu::gemm<T>(h, gpu::op::none, gpu::op::none, rows_, d_, cols, alpha, g, cols, wc.data, wc.stride, 1.f,
                 a_.grad_h, d_);
    const float beta = accumulate ? 1.f : 0.f;
    if (a_.grad_w_storage) {  // in T: rounded once from the fp32 sum (plus a later block's stored rows)
      gpu::gemm<T, T>(h, gpu::op::transpose, gpu::op::none, cols, d_, rows_, alpha, g, cols, h_, d_, beta,
                      static_cast<T*>(a_.grad_w_storage) + c0 * d_, d_);
    } else {
      gpu::gemm<T>(h, gpu::op::transpose, gpu::op::none, cols, d_, rows_, alpha, g, cols, h_, d_, beta,
                   a_.grad_w + c0 * d_, d_);
    }
  }

  /// Gradient filtering with at most half the chunk's columns kept (`count`, ids in kept_): G and
  /// the weight rows of those columns gathered, both GEMMs on them, G^T H's rows added into the
  /// chunk's weight-gradient rows, which are zeroed first unless accumulated into (a later row
  /// block). A column with no kept entry has a zero gradient row: left out, nothing is lost.
  void gemms_over_kept_columns(matrix_view<const T> wc, index_t c0, index_t cn, index_t count) {
    const bool accumulate = a_.accumulate_weight_gradient;
    void* const chunk_w = a_.grad_w_storage ? static_cast<void*>(static_cast<T*>(a_.grad_w_storage) + c0 * d_)
                                            : static_cast<void*>(a_.grad_w + c0 * d_);
    if (!accumulate) {  // all-zero bits are 0 in fp32, bf16 and fp16 alike
      const std::size_t bytes = static_cast<std::size_t>(cn * d_) * (a_.grad_w_storage ? sizeof(T) : sizeof(float));
      XSOFTMAX_CUDA_TRY(cudaMemsetAsync(chunk_w, 0, bytes, ex_.res.stream()));
    }
    if (count == 0) return;
    parallel_for(ex_, rows_ * count, gather_kept_columns<T>{g_, cn, kept_, count, g_kept_});
    parallel_for(ex_, count * d_, gather_listed_rows<T>{wc.data, wc.stride, kept_, d_, w_kept_});
    const float alpha = 1.f / scale_;
    cublasHandle_t h = ex_.res.cublas();
    gpu::gemm<T>(h, gpu::op::none, gpu::op::none, rows_, d_, count, alpha, g_kept_, count, w_kept_, d_, 1.f,
                 a_.grad_h, d_);
    gpu::gemm<T>(h, gpu::op::transpose, gpu::op::none, count, d_, rows_, alpha, g_kept_, count, h_, d_, 0.f,
                 grad_kept_, d_);
    if (a_.grad_w_storage) {
      parallel_for(ex_, count * d_, add_kept_rows<T>{grad_kept_, kept_, d_, static_cast<T*>(chunk_w)});
    } else {
      parallel_for(ex_, count * d_, add_kept_rows<float>{grad_kept_, kept_, d_, static_cast<float*>(chunk_w)});
    }
  }

  /// Chunk c0's weight rows: in place for a block of rows, else gathered (once per chunk and pass:
  /// the backward of the chunk just scored reuses them).
  matrix_view<const T> chunk_rows(matrix_view<const T> w, index_t c0, index_t cn) {
    if (!a_.columns) return matrix_view<const T>(w.row(a_.first + c0), cn, d_, w.stride);
    if (gathered_c0_ != c0) {
      parallel_for(ex_, cn * d_, gather_listed_rows<T>{w.data, w.stride, a_.columns + c0, d_, w_gathered_});
      gathered_c0_ = c0;
    }
    return matrix_view<const T>(w_gathered_, cn, d_);
  }
};

}  // namespace xsoftmax::detail
