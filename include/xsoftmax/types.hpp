// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Plain parameter types shared by every head: non-owning views, loss options, the sparse weight
/// gradient. Host code can use all of them.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>

#include <cstddef>

namespace xsoftmax {

/// Non-owning row-major matrix view: `rows` x `cols`, row `i` starts at `data + i * stride`.
/// The memory belongs to the backend the view is passed to (host memory for serial/omp).
template <class T>
struct matrix_view {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t stride = 0;  ///< elements between row starts; >= cols

  constexpr matrix_view() = default;
  XSOFTMAX_HD constexpr matrix_view(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), stride(c) {}
  XSOFTMAX_HD constexpr matrix_view(T* d, index_t r, index_t c, index_t s)
      : data(d), rows(r), cols(c), stride(s) {}
  /// Views of non-const elements convert to views of const elements.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  XSOFTMAX_HD constexpr matrix_view(matrix_view<U> other)
      : data(other.data), rows(other.rows), cols(other.cols), stride(other.stride) {}

  XSOFTMAX_HD T* row(index_t i) const { return data + i * stride; }
  XSOFTMAX_HD T& operator()(index_t i, index_t j) const { return data[i * stride + j]; }
  [[nodiscard]] XSOFTMAX_HD index_t size() const { return rows * cols; }
};

/// Non-owning contiguous view of `size` elements.
template <class T>
struct vector_view {
  T* data = nullptr;
  index_t size = 0;

  constexpr vector_view() = default;
  XSOFTMAX_HD constexpr vector_view(T* d, index_t n) : data(d), size(n) {}
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  XSOFTMAX_HD constexpr vector_view(vector_view<U> other) : data(other.data), size(other.size) {}

  XSOFTMAX_HD T& operator[](index_t i) const { return data[i]; }
  [[nodiscard]] XSOFTMAX_HD bool empty() const { return size == 0; }
};

/// How per-sample losses are combined.
enum class reduction {
  none,  ///< no reduction: per-sample losses are written out; the returned value is their sum
  mean,  ///< mean over samples whose target is not `ignore_index`
  sum,   ///< sum over samples whose target is not `ignore_index`
};

/// Options of `forward` / `backward`, as in PyTorch's `cross_entropy`.
struct loss_options {
  reduction reduce = reduction::mean;
  index_t ignore_index = -100;  ///< samples with this target contribute no loss and no gradient
  /// epsilon in [0, 1]: the target distribution is (1 - epsilon) one-hot + epsilon uniform over the
  /// classes the row scores (all N for the full softmax, the row's active set for the selective
  /// heads), as `F.cross_entropy(label_smoothing=epsilon)`: loss = lse - (1 - eps) s_t - eps mean(s).
  /// Not defined for `hierarchical_softmax` (it would need every class's probability).
  float label_smoothing = 0.f;
  /// z >= 0: adds z * lse^2 per sample (the z-loss of PaLM / ST-MoE), which keeps the log-partition
  /// function near 0. Not defined for `hierarchical_softmax`.
  float z_loss = 0.f;
};

/// A gradient of a weight matrix that is non-zero only on some rows: `rows[i]` holds the gradient
/// `values.row(i)` (and `bias_values[i]` when the head has a bias). Rows are unique; their order is
/// the order the head produced them in (block by block), which is deterministic.
/// Buffers are kept between steps: reusing one object avoids reallocation.
template <class Backend, class Accum = float>
struct sparse_gradient {
  backend_vector<Backend, index_t> rows;
  backend_vector<Backend, Accum> values;       ///< rows.size() x dim, row-major
  backend_vector<Backend, Accum> bias_values;  ///< rows.size(), empty when the head has no bias
  index_t dim = 0;

  [[nodiscard]] index_t num_rows() const { return static_cast<index_t>(rows.size()); }
  [[nodiscard]] matrix_view<Accum> values_view() {
    return {thrust::raw_pointer_cast(values.data()), num_rows(), dim};
  }
  [[nodiscard]] matrix_view<const Accum> values_view() const {
    return {thrust::raw_pointer_cast(values.data()), num_rows(), dim};
  }
};

/// How a head's weights are initialised when the head owns them.
struct init_options {
  unsigned long long seed = 0;
  float scale = -1.f;  ///< uniform in [-scale, scale]; negative means 1 / sqrt(dim)
  bool zero = false;   ///< all zeros (word2vec initialises inner nodes this way)
};

}  // namespace xsoftmax
