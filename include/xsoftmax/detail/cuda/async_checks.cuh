// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What the `_async` verbs of the `cuda` heads share: data checks done on the device (recorded in
/// the resources' `device_status`, thrown later by `cuda_resources::check`), masked batches instead
/// of packed ones, and the device-side reductions (kept count, gradient scale, loss) that the
/// blocking verbs do on the host.

#include <xsoftmax/detail/cuda/common.cuh>

#include <cstdint>

namespace xsoftmax::detail::gpu {

// ------------------------------------------------------------------------------------------------
// The `_async` verbs: host-side shape checks, data checks on the device, masked batches
//
// The async path never reads a device value on the host. Instead of packing the non-ignored rows
// (whose count only the device knows), it processes all B rows with the ignored ones masked: their
// target is -1 (no class), their packed hidden row is zero, their upstream gradient is zero and
// their loss is zero, so they contribute nothing to any output. Data checks record the first
// failure in the resources' device_status (see cuda_resources::check).
// ------------------------------------------------------------------------------------------------

/// "No failure yet" in a first-failure slot (atomicMin over indices).
inline constexpr unsigned long long no_failure = ~0ull;

/// Sets `n` first-failure slots to no_failure, on the stream.
inline void reset_failure_slots(const cuda_resources& res, unsigned long long* slots, index_t n) {
  XSOFTMAX_CUDA_TRY(cudaMemsetAsync(slots, 0xff, static_cast<std::size_t>(n) * sizeof(unsigned long long),
                                    res.stream()));
}

[[nodiscard]] inline std::uint64_t where_word(const char* where) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(where));
}

template <class H>
__global__ void find_non_finite_kernel(matrix_view<const H> hidden, unsigned long long* first) {
  const index_t n = hidden.rows * hidden.cols;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t i = e / hidden.cols, j = e - i * hidden.cols;
    if (!::cuda::std::isfinite(to_float(hidden(i, j)))) atomicMin(first, static_cast<unsigned long long>(e));
  }
}

template <class H>
__global__ void record_hidden_kernel(device_status* st, const unsigned long long* first, matrix_view<const H> hidden,
                                     std::uint64_t where) {
  if (st->kind != device_status::none || *first == no_failure) return;
  const index_t flat = static_cast<index_t>(*first), i = flat / hidden.cols, j = flat - i * hidden.cols;
  st->where = where;
  st->i = i;
  st->j = j;
  st->value_f = to_float(hidden(i, j));
  st->kind = device_status::hidden_not_finite;
}

/// check_hidden without a host sync: the shape checks throw now; the first non-finite element (in
/// row-major order, as the host reports it) is recorded in `st`. `slot`: one failure slot.
template <class H>
void check_hidden_async(const char* where, const cuda_resources& res, matrix_view<const H> hidden, index_t dim,
                        device_status* st, unsigned long long* slot) {
  check_hidden_shape(where, hidden, dim);
  reset_failure_slots(res, slot, 1);
  find_non_finite_kernel<H><<<grid_for(hidden.rows * hidden.cols), block_threads, 0, res.stream()>>>(hidden, slot);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  record_hidden_kernel<H><<<1, 1, 0, res.stream()>>>(st, slot, hidden, where_word(where));
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// masked[i] = targets[i] when it is a class, -1 when it is ignore_index (or out of range: that is
/// recorded); *kept = the number of targets that are not ignore_index (as select_rows counts).
template <class Unused = void>
__global__ void mask_targets_kernel(const index_t* targets, index_t rows, index_t num_classes, index_t ignore_index,
                                    index_t* masked, unsigned long long* kept, unsigned long long* first) {
  unsigned long long count = 0;
  for (index_t i = global_thread(); i < rows; i += grid_threads()) {
    const index_t t = targets[i];
    const bool keep = t != ignore_index, bad = keep && (t < 0 || t >= num_classes);
    if (bad) atomicMin(first, static_cast<unsigned long long>(i));
    masked[i] = keep && !bad ? t : -1;
    count += keep ? 1 : 0;
  }
  if (count) atomicAdd(kept, count);
}

template <class Unused = void>
__global__ void record_target_kernel(device_status* st, const unsigned long long* first, const index_t* targets,
                                     index_t num_classes, index_t ignore_index, std::uint64_t where) {
  if (st->kind != device_status::none || *first == no_failure) return;
  const index_t i = static_cast<index_t>(*first);
  st->where = where;
  st->i = i;
  st->value_i = targets[i];
  st->num_classes = num_classes;
  st->ignore_index = ignore_index;
  st->kind = device_status::target_out_of_range;
}

/// check_targets and the target half of select_rows without a host sync: the shape checks throw
/// now; `masked` (rows entries) and `*kept` (zeroed here) are filled on the stream and the first bad
/// target is recorded in `st`. `slot`: one failure slot.
inline void mask_targets_async(const char* where, const cuda_resources& res, vector_view<const index_t> targets,
                               index_t rows, index_t num_classes, index_t ignore_index, index_t* masked,
                               unsigned long long* kept, device_status* st, unsigned long long* slot) {
  check_targets_shape(where, targets, rows);
  reset_failure_slots(res, slot, 1);
  XSOFTMAX_CUDA_TRY(cudaMemsetAsync(kept, 0, sizeof(unsigned long long), res.stream()));
  if (rows == 0) return;
  mask_targets_kernel<><<<grid_for(rows), block_threads, 0, res.stream()>>>(targets.data, rows, num_classes,
                                                                           ignore_index, masked, kept, slot);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  record_target_kernel<><<<1, 1, 0, res.stream()>>>(st, slot, targets.data, num_classes, ignore_index,
                                                   where_word(where));
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// out[r * dim + j] = hidden(r, j) converted to T for kept rows (masked[r] >= 0), 0 for the others.
template <class T, class H>
__global__ void pack_masked_rows_kernel(matrix_view<const H> hidden, const index_t* masked, T* out) {
  const index_t dim = hidden.cols, n = hidden.rows * dim;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / dim, j = e - r * dim;
    out[e] = from_float<T>(masked[r] >= 0 ? to_float(hidden(r, j)) : 0.f);
  }
}

/// All rows of `hidden` into `out` (dense, storage type), ignored rows zeroed: their scores are
/// the bias alone, so nothing an ignored row holds can overflow into the kept rows' gradients.
template <class T, class H>
void pack_masked_rows(const cuda_resources& res, matrix_view<const H> hidden, const index_t* masked, T* out) {
  pack_masked_rows_kernel<T, H><<<grid_for(hidden.rows * hidden.cols), block_threads, 0, res.stream()>>>(
      hidden, masked, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// upstream[r] = dLoss/dloss_r for kept rows (as upstream_gradients computes it), 0 for the others;
/// the first kept row with a non-finite value goes to `first`.
template <class Unused = void>
__global__ void upstream_masked_kernel(const index_t* masked, index_t rows, reduction reduce,
                                       vector_view<const float> grad_output, const unsigned long long* kept,
                                       float* upstream, unsigned long long* first) {
  for (index_t r = global_thread(); r < rows; r += grid_threads()) {
    const bool keep = masked[r] >= 0;
    float u;
    if (reduce == reduction::none) {
      u = grad_output.size == 0 ? 1.f : grad_output[r];
    } else {
      u = grad_output.size == 1 ? grad_output[0] : 1.f;
      const index_t count = static_cast<index_t>(*kept);
      if (reduce == reduction::mean && count > 0) u /= static_cast<float>(count);
    }
    upstream[r] = keep ? u : 0.f;
    if (keep && !::cuda::std::isfinite(u)) atomicMin(first, static_cast<unsigned long long>(r));
  }
}

template <class Unused = void>
__global__ void record_upstream_kernel(device_status* st, const unsigned long long* first, const float* upstream,
                                       std::uint64_t where) {
  if (st->kind != device_status::none || *first == no_failure) return;
  st->where = where;
  st->value_f = upstream[*first];
  st->kind = device_status::upstream_not_finite;
}

/// upstream_gradients over all `rows` rows with ignored rows masked (zero), without a host sync.
/// The shape checks throw now; a non-finite upstream value of a kept row is recorded in `st`.
inline void upstream_gradients_async(const char* where, const cuda_resources& res, const index_t* masked,
                                     index_t rows, reduction reduce, vector_view<const float> grad_output,
                                     const unsigned long long* kept, float* upstream, device_status* st,
                                     unsigned long long* slot) {
  check_grad_output_shape(where, reduce, grad_output, rows);
  reset_failure_slots(res, slot, 1);
  upstream_masked_kernel<><<<grid_for(rows), block_threads, 0, res.stream()>>>(masked, rows, reduce, grad_output,
                                                                              kept, upstream, slot);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
  record_upstream_kernel<><<<1, 1, 0, res.stream()>>>(st, slot, upstream, where_word(where));
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

inline constexpr int single_block_threads = 256;

/// One block: p = gradient_scale of upstream (a power of two, as gradient_scale computes it on the
/// host), then upstream[r] *= p (exact) and scale[0] = p, scale[1] = 1 / p.
template <class Unused = void>
__global__ void __launch_bounds__(single_block_threads) gradient_scale_kernel(float* upstream, index_t rows,
                                                                             float* scale) {
  using block_reduce = cub::BlockReduce<float, single_block_threads>;
  __shared__ typename block_reduce::TempStorage temp;
  __shared__ float p_shared;
  float local = 0.f;
  for (index_t r = threadIdx.x; r < rows; r += single_block_threads) {
    const float a = upstream[r] < 0 ? -upstream[r] : upstream[r];
    local = a > local ? a : local;
  }
  const float m = block_reduce(temp).Reduce(local, max_value{});  // valid in thread 0
  if (threadIdx.x == 0) {
    float p = 1.f;
    if (m > 0.f && ::cuda::std::isfinite(m)) {
      int e = -ilogbf(m);
      e = e < -100 ? -100 : (e > 100 ? 100 : e);
      p = ldexpf(1.f, e);
    }
    p_shared = p;
    scale[0] = p;
    scale[1] = 1.f / p;
  }
  __syncthreads();
  const float p = p_shared;
  for (index_t r = threadIdx.x; r < rows; r += single_block_threads) upstream[r] *= p;
}

/// Device version of gradient_scale for the async path: the scale cannot come back to the host, so
/// it is folded into the upstream gradients instead of into the GEMMs' alpha. `scale` (2 floats)
/// receives p and 1 / p; the gradients computed from the scaled upstream are multiplied by 1 / p
/// afterwards (scale_by). Both scalings are by powers of two, hence exact.
inline void gradient_scale_async(const cuda_resources& res, float* upstream, index_t rows, float* scale) {
  gradient_scale_kernel<><<<1, single_block_threads, 0, res.stream()>>>(upstream, rows, scale);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

template <class Unused = void>
__global__ void scale_by_kernel(float* v, index_t n, const float* factor) {
  const float f = *factor;
  for (index_t i = global_thread(); i < n; i += grid_threads()) v[i] *= f;
}

/// v[i] *= *factor (a device scalar).
inline void scale_by(const cuda_resources& res, float* v, index_t n, const float* factor) {
  if (n == 0) return;
  scale_by_kernel<><<<grid_for(n), block_threads, 0, res.stream()>>>(v, n, factor);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

template <class Unused = void>
__global__ void mask_losses_kernel(float* loss, const index_t* masked, index_t rows) {
  for (index_t r = global_thread(); r < rows; r += grid_threads())
    if (masked[r] < 0) loss[r] = 0.f;
}

/// loss[r] = 0 for the masked rows.
inline void mask_losses(const cuda_resources& res, float* loss, const index_t* masked, index_t rows) {
  mask_losses_kernel<><<<grid_for(rows), block_threads, 0, res.stream()>>>(loss, masked, rows);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

template <class Unused = void>
__global__ void copy_masked_rows_kernel(const float* packed, const index_t* masked, matrix_view<float> out) {
  const index_t d = out.cols, n = out.rows * d;
  for (index_t e = global_thread(); e < n; e += grid_threads()) {
    const index_t r = e / d, j = e - r * d;
    out(r, j) = masked[r] >= 0 ? packed[e] : 0.f;
  }
}

/// out(r, :) = packed rows (dense, out.cols wide) for kept rows, 0 for the masked ones.
inline void copy_masked_rows(const cuda_resources& res, const float* packed, const index_t* masked,
                             matrix_view<float> out) {
  if (out.rows * out.cols == 0) return;
  copy_masked_rows_kernel<><<<grid_for(out.rows * out.cols), block_threads, 0, res.stream()>>>(packed, masked, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// One block: out[0] = detail::reduce_losses of the kept rows' losses, bit for bit: the sum in
/// double in row order (masked rows hold +0, which leaves a double sum unchanged), divided by the
/// kept count for mean (0 when there is none). Thread 0 adds; the others stage the next values in
/// shared memory, so the serial sum runs at the speed of double additions, not of global loads.
template <class Unused = void>
__global__ void __launch_bounds__(single_block_threads) reduce_losses_kernel(const float* loss, index_t rows,
                                                                            const unsigned long long* kept,
                                                                            reduction reduce, float* out) {
  __shared__ float stage[single_block_threads];
  double total = 0;
  for (index_t base = 0; base < rows; base += single_block_threads) {
    const index_t n = rows - base < single_block_threads ? rows - base : single_block_threads;
    if (threadIdx.x < n) stage[threadIdx.x] = loss[base + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0)
      for (index_t i = 0; i < n; ++i) total += stage[i];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const unsigned long long count = *kept;
    if (reduce == reduction::mean)
      out[0] = count == 0 ? 0.f : static_cast<float>(total / static_cast<double>(count));
    else
      out[0] = static_cast<float>(total);
  }
}

/// out[0] = the value a blocking verb returns for these (masked) per-row losses.
inline void reduce_losses_async(const cuda_resources& res, const float* loss, index_t rows,
                                const unsigned long long* kept, reduction reduce, float* out) {
  reduce_losses_kernel<><<<1, single_block_threads, 0, res.stream()>>>(loss, rows, kept, reduce, out);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// v[i] = -v[i] without waiting for the stream (log_prob_async).
inline void negate_async(const cuda_resources& res, vector_view<float> v) {
  if (v.size == 0) return;
  negate_kernel<><<<grid_for(v.size), block_threads, 0, res.stream()>>>(v.data, v.size);
  XSOFTMAX_CUDA_CHECK_LAUNCH();
}

/// Makes sure the resources' workspace can serve `bytes` from one block, so that the arena of an
/// async call allocates nothing and its end frees nothing (either would synchronise). Synchronises
/// only when the workspace has to grow (the first call of a size).
inline void reserve_for_async(const cuda_resources& res, std::size_t bytes) {
  res.workspace().reserve(bytes, res.stream());
}

}  // namespace xsoftmax::detail::gpu
