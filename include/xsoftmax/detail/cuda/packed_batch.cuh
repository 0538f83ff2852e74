// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The hierarchical softmax's CUDA batch handling: the generic data checks on the stream, packing
/// of the non-ignored rows into the storage type (for tensor-core GEMMs), upstream gradients, the
/// fp16 gradient scale, and scattering packed results back to the caller's rows.

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/shape_checks.hpp>
#include <xsoftmax/detail/validation.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/find.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cuda/std/cmath>

#include <cmath>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// Validation: the generic checks (primitives/batch_rows.hpp) on this stream
// ------------------------------------------------------------------------------------------------

/// `hidden` must be a non-empty (B x dim) matrix of finite values in device memory: the generic
/// check (primitives/batch_rows.hpp) on this stream.
template <class H>
void check_hidden(const char* where, const cuda_resources& res, matrix_view<const H> hidden, index_t dim) {
  detail::check_hidden(execution<::xsoftmax::cuda>{res}, where, hidden, dim);
}

/// One target per hidden row, each in [0, num_classes) or equal to `ignore_index` (the generic check).
inline void check_targets(const char* where, const cuda_resources& res, vector_view<const index_t> targets,
                          index_t rows, index_t num_classes, index_t ignore_index) {
  detail::check_targets(execution<::xsoftmax::cuda>{res}, where, targets, rows, num_classes, ignore_index);
}

// ------------------------------------------------------------------------------------------------
// Packed batches
// ------------------------------------------------------------------------------------------------

/// sample[r] = index of the r-th non-ignored target, in order (thrust::copy_if: stable). `sample`
/// has room for targets.size entries. Returns the count.
inline index_t select_rows(const cuda_resources& res, vector_view<const index_t> targets, index_t ignore_index,
                           index_t* sample) {
  const thrust::counting_iterator<index_t> first(0);
  index_t* end = thrust::copy_if(backend_traits<cuda>::policy(res), first, first + targets.size, targets.data,
                                 sample, detail::kept_target{ignore_index});
  return static_cast<index_t>(end - sample);
}

/// out[r * dim + j] = hidden(sample[r], j) converted to T (through float, as the host widens).
template <class T, class H>
__global__ void pack_rows_kernel(matrix_view<const H> hidden, const index_t* sample, index_t rows, T* out) {
  const index_t dim = hidden.cols, n = rows * dim;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / dim, j = e - r * dim;
    const index_t src = sample ? sample[r] : r;
    out[e] = from_float<T>(to_float(hidden(src, j)));
  }
}

/// Packs rows `sample[0..rows)` of `hidden` (all rows in order when `sample` is null) into `out`.
template <class T, class H>
void pack_rows(const cuda_resources& res, matrix_view<const H> hidden, const index_t* sample, index_t rows, T* out) {
  if (rows == 0) return;
  pack_rows_kernel<T, H><<<grid_for(rows * hidden.cols), block_threads, 0, res.stream()>>>(hidden, sample, rows, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// True for a non-finite float.
struct non_finite_float {
  XSOFTMAX_HD bool operator()(float v) const { return !::cuda::std::isfinite(v); }
};

/// dLoss/dloss_r of each packed row (device version of detail::upstream_gradients, same checks
/// and messages): `grad_output` (device memory) is empty (1), a scalar (mean/sum) or one value per
/// original sample (none). Writes `rows` values to `upstream`.
inline void upstream_gradients(const char* where, const cuda_resources& res, const index_t* sample, index_t rows,
                               index_t batch_rows, reduction reduce, vector_view<const float> grad_output,
                               float* upstream) {
  const auto policy = backend_traits<cuda>::policy(res);
  detail::check_grad_output_shape(where, reduce, grad_output, batch_rows);
  if (reduce == reduction::none) {
    if (rows == 0) return;
    if (grad_output.size == 0) {
      thrust::fill_n(policy, upstream, rows, 1.f);
      return;
    }
    thrust::gather(policy, sample, sample + rows, grad_output.data, upstream);
    const float* hit = thrust::find_if(policy, upstream, upstream + rows, non_finite_float{});
    if (hit != upstream + rows)
      throw non_finite_error(message(where, ": grad_output gives a non-finite upstream gradient ",
                                     read_one(hit, res.stream())));
    return;
  }
  float scale = grad_output.size == 1 ? read_one(grad_output.data, res.stream()) : 1.f;
  if (reduce == reduction::mean && rows > 0) scale /= static_cast<float>(rows);
  if (rows == 0) return;
  expects<non_finite_error>(std::isfinite(scale), where, ": grad_output gives a non-finite upstream gradient ",
                            scale);
  thrust::fill_n(policy, upstream, rows, scale);
}

/// |x| and max for thrust::transform_reduce.
struct abs_value {
  XSOFTMAX_HD float operator()(float x) const { return x < 0 ? -x : x; }
};
struct max_value {
  XSOFTMAX_HD float operator()(float a, float b) const { return a > b ? a : b; }
};

/// A power of two p such that max|upstream| * p is in [1, 2) (1 when every upstream is 0).
/// The softmax gradient of a row is bounded by its upstream value, so G * p is O(1): rounding it
/// to bf16/fp16 for the tensor-core GEMMs keeps its precision (fp16 would otherwise flush the tiny
/// probabilities of a 1M-class softmax times 1/B to zero), and multiplying back by 1/p through the
/// GEMM's alpha is exact.
inline float gradient_scale(const cuda_resources& res, const float* upstream, index_t rows) {
  if (rows == 0) return 1.f;
  const float m = thrust::transform_reduce(backend_traits<cuda>::policy(res), upstream, upstream + rows,
                                           abs_value{}, 0.f, max_value{});
  if (!(m > 0.f) || !std::isfinite(m)) return 1.f;
  int e = -std::ilogb(m);
  e = e < -100 ? -100 : (e > 100 ? 100 : e);  // 2^+-100 and its inverse stay normal floats
  return std::ldexp(1.f, e);
}

// ------------------------------------------------------------------------------------------------
// Scatter back to the caller's rows, and small element-wise kernels
// ------------------------------------------------------------------------------------------------

template <class Unused = void>
__global__ void zero_vector_kernel(float* out, index_t n) {
  for (index_t i = global_thread(); i < n; i += grid_threads()) out[i] = 0.f;
}
template <class Unused = void>
__global__ void scatter_vector_kernel(const float* values, const index_t* sample, index_t rows, float* out) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) out[sample[r]] = values[r];
}

/// Writes per-sample losses to `out` (B entries; ignored samples get 0), like detail::scatter_losses.
inline void scatter_losses(const cuda_resources& res, const float* losses, const index_t* sample, index_t rows,
                           vector_view<float> out) {
  if (out.size == 0) return;
  zero_vector_kernel<><<<grid_for(out.size), block_threads, 0, res.stream()>>>(out.data, out.size);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  if (rows == 0) return;
  scatter_vector_kernel<><<<grid_for(rows), block_threads, 0, res.stream()>>>(losses, sample, rows, out.data);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

template <class Unused = void>
__global__ void zero_matrix_kernel(matrix_view<float> out) {
  const index_t n = out.rows * out.cols;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t i = e / out.cols, j = e - i * out.cols;
    out(i, j) = 0.f;
  }
}
template <class Unused = void>
__global__ void scatter_rows_kernel(const float* packed, const index_t* sample, index_t rows, matrix_view<float> out) {
  const index_t d = out.cols, n = rows * d;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / d, j = e - r * d;
    out(sample[r], j) = packed[e];
  }
}

/// Writes packed (rows x dim) hidden-gradient rows to the caller's (B x dim) matrix; ignored rows
/// get 0, like detail::scatter_rows.
inline void scatter_rows(const cuda_resources& res, const float* packed, const index_t* sample, index_t rows,
                         matrix_view<float> out) {
  if (out.rows * out.cols == 0) return;
  zero_matrix_kernel<><<<grid_for(out.rows * out.cols), block_threads, 0, res.stream()>>>(out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  if (rows == 0) return;
  scatter_rows_kernel<><<<grid_for(rows * out.cols), block_threads, 0, res.stream()>>>(packed, sample, rows, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

}  // namespace xsoftmax::detail::gpu
