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
///
/// topk and log_distribution are in full_evaluation.cuh.

#include <xsoftmax/detail/cuda/async_checks.cuh>
#include <xsoftmax/detail/cuda/common.cuh>
#include <xsoftmax/detail/cuda/dense.cuh>

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
  // The async path only: first-failure slots of its three checks, the kept-row count, and the
  // gradient scale (p, 1 / p).
  unsigned long long* slots = nullptr;
  unsigned long long* kept = nullptr;
  float* scale = nullptr;

  template <class Alloc>
  static full_run_buffers take(Alloc& a, index_t batch_rows, index_t dim, index_t chunk, bool backward,
                               bool async = false) {
    full_run_buffers f;
    if (async) {
      f.slots = a.template take<unsigned long long>(3);
      f.kept = a.template take<unsigned long long>(1);
      f.scale = a.template take<float>(2);
    }
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
      const float scale = scales_gradient<T> ? gradient_scale(res, buf.upstream, rows) : 1.f;
      dense_backward(res, block, buf.sc, buf.upstream, scale, buf.grad_h, thrust::raw_pointer_cast(g.values.data()),
                     bias ? thrust::raw_pointer_cast(g.bias_values.data()) : nullptr);
    }
    if (grad_hidden) scatter_rows(res, buf.grad_h, buf.sample, rows, *grad_hidden);
  }
  if (per_sample.size != 0) scatter_losses(res, buf.loss, buf.sample, rows, per_sample);
  return reduce_losses(res, buf.loss, rows, options.reduce);  // waits for the stream
}

/// The async form of full_run (see full_softmax.hpp, "_async verbs"): the same shape checks, thrown
/// now; data checks recorded on the device; all B rows processed with the ignored ones masked; the
/// reduced loss written to `loss` (device, may be null: not wanted). Queues work on the head's
/// stream and returns without waiting for it.
///
/// Results equal full_run's: per-row losses, grad_hidden rows and the reduction are computed the
/// same way; with ignored rows the GEMMs run over B instead of the kept rows (zero rows added), so
/// the weight gradient may differ in the last bits where cuBLAS picks a different kernel. One
/// deliberate difference: the weight gradient always holds every class (zeros when every target is
/// ignored; full_run returns no rows then), because its size must be known before the targets are
/// read. Resizing it is the one allocation here (synchronous); from the second call with the same
/// head and gradient object on it is a no-op.
template <class Head, class H>
void full_run_async(const Head& head, const char* where, matrix_view<const H> hidden,
                    vector_view<const index_t> targets, loss_options options, vector_view<float> per_sample,
                    matrix_view<float>* grad_hidden, sparse_gradient<cuda, float>* grad_weights,
                    vector_view<const float> grad_output, float* loss) {
  using T = typename Head::storage_type;
  const cuda_resources& res = head.resources();
  const auto policy = backend_traits<cuda>::policy(res);
  const index_t n_cls = head.num_classes(), d = head.dim();
  // The host-side checks of full_run, in its order, without reading any data.
  check_hidden_shape(where, hidden, d);
  check_targets_shape(where, targets, hidden.rows);
  if ((options.reduce == reduction::none && !grad_weights) || per_sample.size != 0)
    detail::check_output(where, "per_sample", per_sample, hidden.rows);
  if (grad_hidden) detail::check_output(where, "grad_hidden", *grad_hidden, hidden.rows, d);
  const bool backward = grad_weights != nullptr;
  if (backward) check_grad_output_shape(where, options.reduce, grad_output, hidden.rows);

  const index_t rows = hidden.rows, chunk = head.chunk_size_for(rows);
  const T* bias = head.bias();
  if (backward) {  // before any kernel: a resize allocates (and synchronises) when the size changes
    sparse_gradient<cuda, float>& g = *grad_weights;
    g.dim = d;
    g.rows.resize(static_cast<std::size_t>(n_cls));
    g.values.resize(static_cast<std::size_t>(n_cls * d));
    g.bias_values.resize(bias ? static_cast<std::size_t>(n_cls) : 0);
  }
  workspace_plan plan;
  (void)full_run_buffers<T>::take(plan, rows, d, chunk, backward, /*async=*/true);
  reserve_for_async(res, plan.bytes());
  device_status* st = res.begin_async();

  arena a(res.workspace(), res.stream());
  const full_run_buffers<T> buf = full_run_buffers<T>::take(a, rows, d, chunk, backward, /*async=*/true);
  check_hidden_async(where, res, hidden, d, st, buf.slots);
  mask_targets_async(where, res, targets, rows, n_cls, options.ignore_index, buf.target, buf.kept, st,
                     buf.slots + 1);
  if (backward)
    upstream_gradients_async(where, res, buf.target, rows, options.reduce, grad_output, buf.kept, buf.upstream, st,
                             buf.slots + 2);
  pack_masked_rows(res, hidden, buf.target, buf.hidden);

  dense_block<T> block;
  block.h = buf.hidden;
  block.rows = rows;
  block.dim = d;
  block.w = matrix_view<const T>(head.weights());
  block.bias = bias;
  block.first = 0;
  block.n = n_cls;
  block.target_col = buf.target;  // -1 for masked rows: no column matches, the target logit stays 0

  dense_lse(res, block, buf.sc);
  dense_losses(res, block, buf.sc, buf.loss, false);
  mask_losses(res, buf.loss, buf.target, rows);

  if (backward) {
    sparse_gradient<cuda, float>& g = *grad_weights;
    float* grad_w = thrust::raw_pointer_cast(g.values.data());
    float* grad_b = bias ? thrust::raw_pointer_cast(g.bias_values.data()) : nullptr;
    thrust::sequence(policy, g.rows.begin(), g.rows.end());
    thrust::fill_n(policy, buf.grad_h, rows * d, 0.f);
    // Masked rows have upstream 0, so their dLoss/dscore row is exactly 0: they add nothing.
    if constexpr (!scales_gradient<T>) {
      dense_backward(res, block, buf.sc, buf.upstream, 1.f, buf.grad_h, grad_w, grad_b);
    } else {
      // fp16: the scale is known only on the device here, so it is folded into the upstream
      // gradients and undone by one extra pass over each gradient (see the note in full_softmax.hpp).
      gradient_scale_async(res, buf.upstream, rows, buf.scale);  // upstream *= p
      dense_backward(res, block, buf.sc, buf.upstream, 1.f, buf.grad_h, grad_w, grad_b);
      scale_by(res, buf.grad_h, rows * d, buf.scale + 1);  // * 1 / p
      scale_by(res, grad_w, n_cls * d, buf.scale + 1);
      if (grad_b) scale_by(res, grad_b, n_cls, buf.scale + 1);
    }
    if (grad_hidden) copy_masked_rows(res, buf.grad_h, buf.target, *grad_hidden);
  }
  if (per_sample.size != 0)
    XSOFTMAX_CUDA_TRY(cudaMemcpyAsync(per_sample.data, buf.loss, static_cast<std::size_t>(rows) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, res.stream()));
  if (loss) reduce_losses_async(res, buf.loss, rows, buf.kept, options.reduce, loss);
}

}  // namespace xsoftmax::detail::gpu
