// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A head's weight matrix (and optional bias): owned by the head, or a non-owning view of a caller's
/// buffer (a framework tensor). Applies sparse SGD updates after validating them in full, so a bad
/// gradient never leaves the weights half-updated.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/host/backend_ops.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/detail/primitives/mix_seed.hpp>
#include <xsoftmax/detail/primitives/parallel_for.hpp>
#include <xsoftmax/detail/primitives/row_kernels.hpp>
#include <xsoftmax/detail/sparse_gradient_checks.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/extrema.h>
#include <thrust/find.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace xsoftmax::detail {

/// The initial value of weight element e (row-major index) for `seed`: uniform in [-scale, scale),
/// from (seed, e) alone — `mix_seed` (splitmix64) of seed + e times its increment, the top 24 bits
/// as a fraction: element e gets the e-th value of splitmix64's stream from `seed`. A counter-based
/// generator, so that every backend fills its weights in parallel where they live, with the same
/// values, and no host copy is made (a sequential generator filled 10M x 300 weights on the host in
/// more than 30 s on the GPU machine, and 100M x 512 bf16 weights are 100 GB).
XSOFTMAX_HD inline float initial_weight(unsigned long long seed, unsigned long long e, float scale) {
  const std::uint64_t z = mix_seed(seed + 0x9E3779B97F4A7C15ull * e);
  const float u = static_cast<float>(z >> 40) * (1.f / 16777216.f);  // [0, 1), exact in fp32
  return (2.f * u - 1.f) * scale;
}

/// w[e] = initial_weight(seed, e, scale) in the storage type, for a parallel loop.
template <class T>
struct fill_initial_weights {
  T* w;
  unsigned long long seed;
  float scale;
  XSOFTMAX_HD void operator()(index_t e) const {
    w[e] = from_float<T>(initial_weight(seed, static_cast<unsigned long long>(e), scale));
  }
};

template <class T, class Backend>
class weight_store {
 public:
  weight_store() = default;

  /// Owned `rows x cols` weights initialised per `init`; a zero bias of `rows` entries if `with_bias`.
  weight_store(const char* where, index_t rows, index_t cols, bool with_bias, const init_options& init)
      : rows_(rows), cols_(cols), stride_(cols), owning_(true) {
    expects(rows > 0, where, ": number of weight rows = ", rows, " must be > 0");
    expects(cols > 0, where, ": dim = ", cols, " must be > 0");
    const index_t elements = checked_product(where, "weight rows x dim", rows, cols, sizeof(T));
    if (init.zero) {
      owned_.assign(static_cast<std::size_t>(elements), from_float<T>(0.f));
    } else {  // filled where the weights live (see `initial_weight`)
      owned_.resize(static_cast<std::size_t>(elements));
      const float scale = init.scale >= 0 ? init.scale : 1.f / std::sqrt(static_cast<float>(cols));
      parallel_for(backend_traits<Backend>::policy(), elements,
                   fill_initial_weights<T>{thrust::raw_pointer_cast(owned_.data()), init.seed, scale});
    }
    if (with_bias) owned_bias_.assign(static_cast<std::size_t>(rows), from_float<T>(0.f));
    rebind();
  }

  /// A view of a caller's `weights` (rows x cols, any stride) and optional `bias` (rows entries).
  weight_store(const char* where, matrix_view<T> weights, T* bias)
      : data_(weights.data), bias_(bias), rows_(weights.rows), cols_(weights.cols),
        stride_(weights.stride), owning_(false) {
    expects(weights.data != nullptr, where, ": weights.data is null");
    expects(weights.rows > 0, where, ": weights.rows = ", weights.rows, " must be > 0");
    expects(weights.cols > 0, where, ": weights.cols = ", weights.cols, " must be > 0");
    expects<shape_error>(weights.stride >= weights.cols, where, ": weights.stride = ", weights.stride,
                         " is smaller than weights.cols = ", weights.cols);
    (void)checked_product(where, "weights.rows x weights.stride", weights.rows, weights.stride, sizeof(T));
  }

  weight_store(const weight_store& o)
      : owned_(o.owned_), owned_bias_(o.owned_bias_), data_(o.data_), bias_(o.bias_), rows_(o.rows_),
        cols_(o.cols_), stride_(o.stride_), owning_(o.owning_) {
    if (owning_) rebind();
  }
  weight_store(weight_store&& o) noexcept
      : owned_(std::move(o.owned_)), owned_bias_(std::move(o.owned_bias_)), data_(o.data_),
        bias_(o.bias_), rows_(o.rows_), cols_(o.cols_), stride_(o.stride_), owning_(o.owning_) {
    if (owning_) rebind();
  }
  weight_store& operator=(weight_store o) noexcept {
    std::swap(owned_, o.owned_);
    std::swap(owned_bias_, o.owned_bias_);
    data_ = o.data_;
    bias_ = o.bias_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    stride_ = o.stride_;
    owning_ = o.owning_;
    if (owning_) rebind();
    return *this;
  }

  [[nodiscard]] matrix_view<T> weights() const { return {data_, rows_, cols_, stride_}; }
  [[nodiscard]] T* bias() const { return bias_; }
  [[nodiscard]] bool has_bias() const { return bias_ != nullptr; }
  [[nodiscard]] bool owns_weights() const { return owning_; }
  [[nodiscard]] index_t rows() const { return rows_; }
  [[nodiscard]] index_t cols() const { return cols_; }

  /// w[rows[i]] -= lr * values[i] (and the bias likewise), after checking the whole gradient.
  /// Blocking. On a device backend it first waits for the head's stream (`resources`): an `_async`
  /// verb may still be writing `g`.
  template <class Accum>
  void apply_sgd(const char* where, const sparse_gradient<Backend, Accum>& g, float lr,
                 const backend_resources<Backend>& resources) {
    if constexpr (!is_host_backend<Backend>) resources.check();
    else (void)resources;
    const execution<Backend> ex{resources};
    check_sparse_gradient(where, ex, g, rows_, cols_, has_bias(), lr);
    const index_t n = g.num_rows();
    if (n > 0) {
      const auto policy = backend_traits<Backend>::policy();
      parallel_for(policy, n,
                   sgd_row_update<Accum>{weights(), bias_, thrust::raw_pointer_cast(g.rows.data()),
                                         thrust::raw_pointer_cast(g.values.data()),
                                         g.bias_values.empty() ? nullptr : thrust::raw_pointer_cast(g.bias_values.data()),
                                         lr});
    }
  }

  /// w[rows[i]] -= lr * values[i] for one gradient row i (host and device). Public because nvcc
  /// rejects a private member type as a template argument of a kernel (the cuda backend's for_each).
  template <class Accum>
  struct sgd_row_update {
    matrix_view<T> w;
    T* bias;
    const index_t* rows;
    const Accum* values;
    const Accum* bias_values;
    float lr;
    XSOFTMAX_HD void operator()(index_t i) const {
      T* wr = w.row(rows[i]);
      const Accum* g = values + i * w.cols;
      // fp32: w + (-lr) g is bitwise w - lr g (negation is exact), through the row kernel (AVX2
      // on a host that has it).
      if constexpr (std::is_same_v<T, float> && std::is_same_v<Accum, float>) axpy_row(-lr, g, wr, w.cols);
      else
        for (index_t j = 0; j < w.cols; ++j) wr[j] = from_float<T>(to_float(wr[j]) - lr * static_cast<float>(g[j]));
      if (bias_values) bias[rows[i]] = from_float<T>(to_float(bias[rows[i]]) - lr * static_cast<float>(bias_values[i]));
    }
  };

 private:
  void rebind() {
    data_ = thrust::raw_pointer_cast(owned_.data());
    bias_ = owned_bias_.empty() ? nullptr : thrust::raw_pointer_cast(owned_bias_.data());
  }

  backend_vector<Backend, T> owned_;
  backend_vector<Backend, T> owned_bias_;
  T* data_ = nullptr;
  T* bias_ = nullptr;
  index_t rows_ = 0, cols_ = 0, stride_ = 0;
  bool owning_ = false;
};

}  // namespace xsoftmax::detail
