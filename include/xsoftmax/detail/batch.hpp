// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A batch prepared for a head: the rows whose target is not ignored, widened to fp32 and packed,
/// with the upstream gradient each row's loss receives under the chosen reduction.

#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/detail/validation.hpp>

#include <vector>

namespace xsoftmax::detail {

/// Packed rows of a batch. Row r of `hidden` is original sample `sample[r]` with target `target[r]`.
struct packed_batch {
  index_t dim = 0;
  std::vector<index_t> sample;
  std::vector<index_t> target;
  std::vector<float> hidden;  ///< rows() x dim
  [[nodiscard]] index_t rows() const { return static_cast<index_t>(sample.size()); }
  [[nodiscard]] matrix_view<const float> hidden_view() const { return {hidden.data(), rows(), dim}; }
  [[nodiscard]] matrix_view<float> hidden_view() { return {hidden.data(), rows(), dim}; }
};

/// Packs the non-ignored rows of `hidden` (any supported element type) as fp32.
template <class Policy, class H>
packed_batch pack_batch(const Policy& policy, matrix_view<const H> hidden,
                        vector_view<const index_t> targets, index_t ignore_index) {
  packed_batch b;
  b.dim = hidden.cols;
  for (index_t i = 0; i < hidden.rows; ++i) {
    if (targets[i] == ignore_index) continue;
    b.sample.push_back(i);
    b.target.push_back(targets[i]);
  }
  b.hidden.resize(static_cast<std::size_t>(b.rows() * b.dim));
  float* out = b.hidden.data();
  const index_t* src = b.sample.data();
  const index_t d = b.dim;
  parallel_for(policy, b.rows(), [=](index_t r) {
    const H* in = hidden.row(src[r]);
    for (index_t j = 0; j < d; ++j) out[r * d + j] = to_float(in[j]);
  });
  return b;
}

/// Packs every row of `hidden` (no targets: prediction and evaluation verbs).
template <class Policy, class H>
packed_batch pack_all_rows(const Policy& policy, matrix_view<const H> hidden) {
  std::vector<index_t> none(static_cast<std::size_t>(hidden.rows), 0);
  return pack_batch(policy, hidden, vector_view<const index_t>{none.data(), hidden.rows}, -1);
}

/// The value a head returns for per-sample losses under `reduce` (mean over counted rows; 0 when
/// every row is ignored, where PyTorch would return NaN: a training loop should not be poisoned by a
/// batch of padding).
inline float reduce_losses(const std::vector<float>& losses, reduction reduce) {
  double total = 0;
  for (float l : losses) total += l;
  if (reduce == reduction::mean) return losses.empty() ? 0.f : static_cast<float>(total / losses.size());
  return static_cast<float>(total);
}

/// dLoss/dloss_r for each packed row: `grad_output` is empty (1), a scalar (mean/sum), or one value per
/// *original* sample (reduction none).
inline std::vector<float> upstream_gradients(const char* where, const packed_batch& b, index_t batch_rows,
                                             reduction reduce, vector_view<const float> grad_output) {
  std::vector<float> u(static_cast<std::size_t>(b.rows()), 1.f);
  if (reduce == reduction::none) {
    expects<shape_error>(grad_output.size == 0 || grad_output.size == batch_rows, where,
                         ": grad_output has ", grad_output.size, " entries; reduction none needs 0 (all ones) or ",
                         batch_rows);
    if (grad_output.size != 0)
      for (index_t r = 0; r < b.rows(); ++r) u[r] = grad_output[b.sample[r]];
  } else {
    expects<shape_error>(grad_output.size <= 1, where, ": grad_output has ", grad_output.size,
                         " entries; reduction mean/sum takes 0 (one) or 1 (a scalar)");
    float scale = grad_output.size == 1 ? grad_output[0] : 1.f;
    if (reduce == reduction::mean && b.rows() > 0) scale /= static_cast<float>(b.rows());
    for (auto& x : u) x = scale;
  }
  for (index_t r = 0; r < b.rows(); ++r)
    expects<non_finite_error>(std::isfinite(u[r]), where, ": grad_output gives a non-finite upstream gradient ", u[r]);
  return u;
}

/// Writes per-sample losses to `out` (B entries; ignored samples get 0).
inline void scatter_losses(const packed_batch& b, const std::vector<float>& losses, vector_view<float> out) {
  for (index_t i = 0; i < out.size; ++i) out[i] = 0.f;
  for (index_t r = 0; r < b.rows(); ++r) out[b.sample[r]] = losses[r];
}

/// Writes packed hidden-gradient rows back to the caller's (B x dim) matrix; ignored rows get 0.
template <class Policy>
void scatter_rows(const Policy& policy, const packed_batch& b, const std::vector<float>& packed,
                  matrix_view<float> out) {
  const index_t d = out.cols;
  parallel_for(policy, out.rows, [=](index_t i) {
    float* o = out.row(i);
    for (index_t j = 0; j < d; ++j) o[j] = 0.f;
  });
  const float* src = packed.data();
  const index_t* sample = b.sample.data();
  parallel_for(policy, b.rows(), [=](index_t r) {
    float* o = out.row(sample[r]);
    for (index_t j = 0; j < d; ++j) o[j] = src[r * d + j];
  });
}

}  // namespace xsoftmax::detail
