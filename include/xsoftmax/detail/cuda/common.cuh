// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Building blocks shared by the CUDA heads: launch helpers, input validation on the device (with
/// the host backends' exact messages), packing of the non-ignored rows, upstream gradients, and
/// scattering packed results back to the caller's rows.
///
/// Conventions: all pointers are device pointers unless named `host_*`; every kernel and Thrust
/// call runs on the resources' stream; element offsets are computed in 64-bit `index_t`.

#include <xsoftmax/detail/batch.hpp>
#include <xsoftmax/detail/cuda/backend.cuh>
#include <xsoftmax/detail/cuda/error.cuh>
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

#include <cub/block/block_reduce.cuh>

#include <cuda/std/cmath>

#include <climits>
#include <cstdint>
#include <cmath>
#include <vector>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// Launch helpers
// ------------------------------------------------------------------------------------------------

/// Threads per block of the element-wise kernels.
inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than the loop
/// needs, and within the grid limit whatever n is (the loops stride, so any n is covered).
[[nodiscard]] inline unsigned grid_for(index_t n, int threads = block_threads) {
  const index_t blocks = (n + threads - 1) / threads;
  constexpr index_t cap = index_t(1) << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

/// Blocks for kernels with one block per row (rows strided by the grid).
[[nodiscard]] inline unsigned grid_rows(index_t rows) {
  constexpr index_t cap = index_t(1) << 30;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

__device__ inline index_t global_thread() { return static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline index_t grid_threads() { return static_cast<index_t>(gridDim.x) * blockDim.x; }

/// Copies one element from device to host (waits for the stream first, so queued work is done).
template <class T>
[[nodiscard]] T read_one(const T* device_ptr, cudaStream_t stream) {
  T value;
  XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(&value, device_ptr, sizeof(T), cudaMemcpyDeviceToHost, stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
  return value;
}

/// Copies n elements from device to a new host vector.
template <class T>
[[nodiscard]] std::vector<T> to_host(const T* device_ptr, index_t n, cudaStream_t stream) {
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0)
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(out.data(), device_ptr, static_cast<std::size_t>(n) * sizeof(T),
                                      cudaMemcpyDeviceToHost, stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
  return out;
}

/// Copies a host vector to device memory (n = host.size() elements). Synchronises, so the host
/// vector may be a temporary.
template <class T>
void to_device(T* device_ptr, const std::vector<T>& host, cudaStream_t stream) {
  if (host.empty()) return;
  XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(device_ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                                    stream));
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(stream));
}

// ------------------------------------------------------------------------------------------------
// Validation (same checks, order and messages as detail/validation.hpp, scanning on the device)
// ------------------------------------------------------------------------------------------------

/// True for an element of `hidden` (by flat index over rows x cols) that is NaN or infinite once
/// widened to float, as the host check sees it.
template <class H>
struct non_finite_element {
  matrix_view<const H> hidden;
  XSOFTMAX_HD bool operator()(index_t flat) const {
    const index_t i = flat / hidden.cols, j = flat - i * hidden.cols;
    return !::cuda::std::isfinite(to_float(hidden(i, j)));
  }
};

/// The shape checks of `hidden` (no data is read): shared by check_hidden and the `_async` verbs.
template <class H>
void check_hidden_shape(const char* where, matrix_view<const H> hidden, index_t dim) {
  static_assert(is_supported_element<H>, "xsoftmax: hidden must be float, double, bf16 or fp16");
  expects<shape_error>(hidden.cols == dim, where, ": hidden has ", hidden.cols, " columns but the head's dim is ",
                       dim);
  expects(hidden.rows > 0, where, ": empty batch (hidden.rows = ", hidden.rows, ")");
  expects(hidden.data != nullptr, where, ": hidden.data is null");
  expects<shape_error>(hidden.stride >= hidden.cols, where, ": hidden.stride = ", hidden.stride,
                       " is smaller than hidden.cols = ", hidden.cols);
}

/// The shape checks of `targets` (no data is read).
inline void check_targets_shape(const char* where, vector_view<const index_t> targets, index_t rows) {
  expects<shape_error>(targets.size == rows, where, ": targets has ", targets.size, " entries but hidden has ", rows,
                       " rows");
  expects(targets.data != nullptr || rows == 0, where, ": targets.data is null");
}

/// The shape checks of `grad_output` (no data is read).
inline void check_grad_output_shape(const char* where, reduction reduce, vector_view<const float> grad_output,
                                    index_t batch_rows) {
  if (reduce == reduction::none)
    expects<shape_error>(grad_output.size == 0 || grad_output.size == batch_rows, where, ": grad_output has ",
                         grad_output.size, " entries; reduction none needs 0 (all ones) or ", batch_rows);
  else
    expects<shape_error>(grad_output.size <= 1, where, ": grad_output has ", grad_output.size,
                         " entries; reduction mean/sum takes 0 (one) or 1 (a scalar)");
}

/// `hidden` must be a non-empty (B x dim) matrix of finite values in device memory.
template <class H>
void check_hidden(const char* where, const cuda_resources& res, matrix_view<const H> hidden, index_t dim) {
  check_hidden_shape(where, hidden, dim);
  // find_if returns the first match in index order: the same element the host's row-major loop
  // reports first.
  const thrust::counting_iterator<index_t> first(0), last(hidden.rows * hidden.cols);
  const auto hit = thrust::find_if(backend_traits<cuda>::policy(res), first, last, non_finite_element<H>{hidden});
  if (hit != last) {
    const index_t flat = *hit, i = flat / hidden.cols, j = flat - i * hidden.cols;
    const float v = to_float(read_one(hidden.data + i * hidden.stride + j, res.stream()));
    throw non_finite_error(message(where, ": hidden[", i, "][", j, "] = ", v, " is not finite"));
  }
}

/// True for a target that is neither ignore_index nor a class.
struct bad_target {
  const index_t* targets;
  index_t num_classes, ignore_index;
  XSOFTMAX_HD bool operator()(index_t i) const {
    const index_t t = targets[i];
    return t != ignore_index && (t < 0 || t >= num_classes);
  }
};

/// One target per hidden row, each in [0, num_classes) or equal to `ignore_index`.
inline void check_targets(const char* where, const cuda_resources& res, vector_view<const index_t> targets,
                          index_t rows, index_t num_classes, index_t ignore_index) {
  check_targets_shape(where, targets, rows);
  if (targets.size == 0) return;
  const thrust::counting_iterator<index_t> first(0), last(targets.size);
  const auto hit = thrust::find_if(backend_traits<cuda>::policy(res), first, last,
                                   bad_target{targets.data, num_classes, ignore_index});
  if (hit != last) {
    const index_t i = *hit;
    const index_t t = read_one(targets.data + i, res.stream());
    throw out_of_range(message(where, ": targets[", i, "] = ", t, " is out of range [0, ", num_classes, ")",
                               " and is not ignore_index (", ignore_index, ")"));
  }
}

// ------------------------------------------------------------------------------------------------
// Packed batches
// ------------------------------------------------------------------------------------------------

/// True for a target that is not ignore_index (the rows a loss is computed for).
struct kept_target {
  index_t ignore_index;
  XSOFTMAX_HD bool operator()(index_t t) const { return t != ignore_index; }
};

/// sample[r] = index of the r-th non-ignored target, in order (thrust::copy_if: stable). `sample`
/// has room for targets.size entries. Returns the count.
inline index_t select_rows(const cuda_resources& res, vector_view<const index_t> targets, index_t ignore_index,
                           index_t* sample) {
  const thrust::counting_iterator<index_t> first(0);
  index_t* end = thrust::copy_if(backend_traits<cuda>::policy(res), first, first + targets.size, targets.data,
                                 sample, kept_target{ignore_index});
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
  check_grad_output_shape(where, reduce, grad_output, batch_rows);
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

template <class Unused = void>
__global__ void negate_kernel(float* v, index_t n) {
  for (index_t i = global_thread(); i < n; i += grid_threads()) v[i] = -v[i];
}

/// v[i] = -v[i] (log_prob turns per-sample losses into log-probabilities in place).
inline void negate(const cuda_resources& res, vector_view<float> v) {
  if (v.size == 0) return;
  negate_kernel<><<<grid_for(v.size), block_threads, 0, res.stream()>>>(v.data, v.size);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  XSOFTMAX_CUDA_TRY(cudaStreamSynchronize(res.stream()));
}

/// The value a head returns for its packed per-row losses (copied to the host and reduced there in
/// double, in row order, exactly as detail::reduce_losses does).
inline float reduce_losses(const cuda_resources& res, const float* losses, index_t rows, reduction reduce) {
  return detail::reduce_losses(to_host(losses, rows, res.stream()), reduce);
}

}  // namespace xsoftmax::detail::gpu
