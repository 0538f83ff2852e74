// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Layer-wise top-k gradient sparsification with error feedback, for data-parallel training whose
/// gradient exchange is bandwidth-bound: each worker sends, per layer, the k = ceil(density x size)
/// entries of largest magnitude of (gradient + residual) as (int64 index, float value) pairs, and
/// keeps the rest in its residual for the next step (error feedback: nothing is dropped, only
/// delayed; without it the small coordinates are never sent, and training stalls short of the
/// dense result). `densify` sums or averages the pairs of several workers into a dense gradient.
///
/// Selection: the magnitudes are packed with their index into 64-bit keys, (~bits(|x|)) << 32 | i,
/// so that one ascending sort orders by magnitude descending then index ascending — ties go to the
/// lower index, and the keys are unique, so every backend and every sort algorithm yields the same
/// k entries. Thrust has no partial sort: the cost is a full sort of `size` keys per layer
/// (O(n log n) on the host, a radix sort on cuda) plus a sort of the k kept indices, which are
/// returned in increasing order. Layers are limited to 2^32 - 1 entries (the index half of a key).
/// One implementation for every backend (Thrust on `execution<Backend>`'s policy); deterministic.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/backend_ops.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/types.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace xsoftmax {

/// Options of `topk_sparsifier`: `density` in (0, 1] (k = ceil(density x size), at least 1), and
/// whether unsent values are carried to the next step (`error_feedback`, default on).
struct topk_options {
  float density = 0.01f;
  bool error_feedback = true;
};

/// One layer's gradient as exchanged: `indices` (k, strictly increasing, in [0, size)) and their
/// `values` (k), in the backend's memory. Buffers are kept between steps when the object is reused.
template <class Backend = serial>
struct compressed_gradient {
  backend_vector<Backend, std::int64_t> indices;
  backend_vector<Backend, float> values;
  index_t size = 0;  ///< entries of the dense layer
};

/// How `densify` combines the workers' gradients.
enum class worker_reduction { sum, mean };

namespace detail {

/// Key of entry i: ascending keys order by |x| descending, then by i ascending.
struct magnitude_key {
  const float* x;
  XSOFTMAX_HD std::uint64_t operator()(index_t i) const {
    const std::uint32_t mag = static_cast<std::uint32_t>(bits_of_float(x[i])) & 0x7FFFFFFFu;
    return (static_cast<std::uint64_t>(~mag) << 32) | static_cast<std::uint64_t>(i);
  }
};

struct key_index {
  XSOFTMAX_HD std::int64_t operator()(std::uint64_t key) const {
    return static_cast<std::int64_t>(key & 0xFFFFFFFFull);
  }
};

/// Sends entry e of the kept set: its value goes out, its residual (when there is one) to 0.
struct take_kept {
  const std::int64_t* indices;
  float* source;  ///< gradient + residual (the residual itself under error feedback)
  float* values;
  bool clear;
  XSOFTMAX_HD void operator()(index_t e) const {
    const std::int64_t i = indices[e];
    values[e] = source[i];
    if (clear) source[i] = 0.f;
  }
};

struct add_into {
  float* r;
  const float* g;
  XSOFTMAX_HD void operator()(index_t i) const { r[i] += g[i]; }
};

struct scatter_add {
  float* dense;
  const std::int64_t* indices;
  const float* values;
  XSOFTMAX_HD void operator()(index_t e) const { dense[indices[e]] += values[e]; }
};

struct divide_by {
  float* x;
  float d;
  XSOFTMAX_HD void operator()(index_t i) const { x[i] /= d; }
};

}  // namespace detail

/// Top-k sparsification of a fixed list of layers with (optionally) error feedback. Memory: the
/// residual, 4 bytes per parameter with error feedback (0 without); scratch of 8 bytes per entry of
/// the largest layer (the sort keys); a copy of the current layer (4 bytes per entry) without error
/// feedback, where the gradient itself must not be written.
template <class Backend = serial>
class topk_sparsifier {
 public:
  /// Throws `invalid_argument` for no layer, a size not in [1, 2^32 - 1], or a density not in (0, 1].
  explicit topk_sparsifier(std::vector<index_t> layer_sizes, topk_options options = {},
                           backend_resources<Backend> resources = {})
      : options_(options), resources_(resources), sizes_(std::move(layer_sizes)) {
    const char* where = "topk_sparsifier";
    detail::expects(std::isfinite(options.density) && options.density > 0 && options.density <= 1, where,
                    ": density = ", options.density, " must be in (0, 1]");
    detail::expects(!sizes_.empty(), where, ": no layers");
    index_t total = 0, largest = 0;
    for (std::size_t l = 0; l < sizes_.size(); ++l) {
      const index_t n = sizes_[l];
      detail::expects(n > 0 && n <= index_t(0xFFFFFFFFll), where, ": layer ", l, " size = ", n,
                      " must be in [1, 2^32 - 1]");
      offsets_.push_back(total);
      total += n;
      largest = n > largest ? n : largest;
    }
    if (options.error_feedback) residual_.resize(static_cast<std::size_t>(total));
    keys_.resize(static_cast<std::size_t>(largest));
    reset();
  }

  /// Residual, kept-entry count and memory for layers of these sizes.
  [[nodiscard]] static std::size_t state_bytes(const std::vector<index_t>& layer_sizes, topk_options options) {
    std::size_t total = 0;
    for (const index_t n : layer_sizes) total += static_cast<std::size_t>(n);
    return options.error_feedback ? total * sizeof(float) : 0;
  }

  /// The residual back to 0.
  void reset() {
    const detail::execution<Backend> ex{resources_};
    thrust::fill(ex.policy(), residual_.begin(), residual_.end(), 0.f);
    detail::backend_ops<Backend>::synchronize(resources_);
  }

  /// k of layer l: ceil(density x size) (density taken as the decimal it approximates), at least 1.
  [[nodiscard]] index_t kept(index_t l) const {
    const index_t n = sizes_[static_cast<std::size_t>(l)];
    // The float density only approximates the decimal meant (0.05f is 0.0500000007): one part in
    // 10^7 comes off the product so that 0.05 of 1000 keeps 50, not 51.
    const double x = static_cast<double>(options_.density) * static_cast<double>(n);
    const auto k = static_cast<index_t>(std::ceil(x - 1e-7 * x));
    return k < 1 ? 1 : (k > n ? n : k);
  }

  /// Sparsifies every layer: `out[l]` receives the top-k of gradients[l] (+ residual), resized to
  /// k. Throws `shape_error` (layer count or a size differs), `invalid_argument` (null data),
  /// `non_finite_error` naming the layer, entry and value; nothing is changed then. Blocking.
  void sparsify(const std::vector<vector_view<const float>>& gradients,
                std::vector<compressed_gradient<Backend>>& out) {
    const char* where = "topk_sparsifier::sparsify";
    const detail::execution<Backend> ex{resources_};
    const index_t count = static_cast<index_t>(sizes_.size());
    detail::expects<shape_error>(static_cast<index_t>(gradients.size()) == count, where, ": ", gradients.size(),
                                 " layers given but the sparsifier was made for ", count);
    for (index_t l = 0; l < count; ++l) {
      const vector_view<const float>& g = gradients[static_cast<std::size_t>(l)];
      const index_t n = sizes_[static_cast<std::size_t>(l)];
      detail::expects<shape_error>(g.size == n, where, ": layer ", l, " has ", g.size, " values but was made for ", n);
      detail::expects(g.data != nullptr, where, ": layer ", l, " is null");
      const index_t bad = detail::first_non_finite(ex, g.data, n);
      if (bad != n)
        detail::expects<non_finite_error>(false, where, ": layer ", l, " gradient[", bad, "] = ",
                                          detail::backend_ops<Backend>::read(resources_, g.data + bad),
                                          " is not finite");
    }
    out.resize(gradients.size());
    for (std::size_t l = 0; l < gradients.size(); ++l) sparsify_layer(ex, static_cast<index_t>(l), gradients[l], out[l]);
    detail::backend_ops<Backend>::synchronize(resources_);
  }

  [[nodiscard]] const topk_options& options() const { return options_; }
  [[nodiscard]] const std::vector<index_t>& layer_sizes() const { return sizes_; }
  /// Layer l's residual (size floats, the backend's memory), or null without error feedback.
  [[nodiscard]] const float* residual(index_t l) const {
    return options_.error_feedback ? thrust::raw_pointer_cast(residual_.data()) + offsets_[static_cast<std::size_t>(l)]
                                   : nullptr;
  }

 private:
  void sparsify_layer(const detail::execution<Backend>& ex, index_t l, vector_view<const float> g,
                      compressed_gradient<Backend>& out) {
    const index_t n = g.size, k = kept(l);
    // The candidates: the residual plus the gradient (in place: what is not sent stays there), or
    // a copy of the gradient that the kept entries are read from.
    float* source;
    if (options_.error_feedback) {
      source = thrust::raw_pointer_cast(residual_.data()) + offsets_[static_cast<std::size_t>(l)];
      detail::parallel_for(ex, n, detail::add_into{source, g.data});
    } else {
      copy_.resize(static_cast<std::size_t>(n));
      thrust::copy(ex.policy(), g.data, g.data + n, copy_.begin());  // on the backend's policy: a device copy on cuda
      source = detail::raw(copy_);
    }
    const thrust::counting_iterator<index_t> first(0);
    thrust::transform(ex.policy(), first, first + n, keys_.begin(), detail::magnitude_key{source});
    thrust::sort(ex.policy(), keys_.begin(), keys_.begin() + n);
    out.size = n;
    out.indices.resize(static_cast<std::size_t>(k));
    out.values.resize(static_cast<std::size_t>(k));
    thrust::transform(ex.policy(), keys_.begin(), keys_.begin() + k, out.indices.begin(), detail::key_index{});
    thrust::sort(ex.policy(), out.indices.begin(), out.indices.end());
    detail::parallel_for(ex, k,
                         detail::take_kept{detail::raw(out.indices), source, detail::raw(out.values),
                                           options_.error_feedback});
  }

  topk_options options_;
  backend_resources<Backend> resources_;
  std::vector<index_t> sizes_, offsets_;
  backend_vector<Backend, float> residual_, copy_;
  backend_vector<Backend, std::uint64_t> keys_;
};

/// dense = the sum (or mean) over `parts` (one per worker, in order) of their scattered values:
/// the all-gather side of the exchange. Each part: `size` = dense.size, indices strictly increasing
/// and in range, values finite. Throws `invalid_argument` (no part, a null part, indices not
/// strictly increasing), `shape_error`, `out_of_range`, `non_finite_error`, naming the worker and
/// the value, before writing. Deterministic: the workers are added one after another, in order.
template <class Backend>
void densify(const std::vector<const compressed_gradient<Backend>*>& parts, vector_view<float> dense,
             worker_reduction how = worker_reduction::mean, backend_resources<Backend> resources = {}) {
  const char* where = "densify";
  const detail::execution<Backend> ex{resources};
  detail::expects(!parts.empty(), where, ": no worker gradients");
  detail::expects<shape_error>(dense.size >= 0, where, ": dense.size = ", dense.size, " is negative");
  detail::expects(dense.data != nullptr || dense.size == 0, where, ": dense is null");
  for (std::size_t w = 0; w < parts.size(); ++w) {
    const compressed_gradient<Backend>* p = parts[w];
    detail::expects(p != nullptr, where, ": worker ", w, " is null");
    detail::expects<shape_error>(p->size == dense.size, where, ": worker ", w, " has a layer of ", p->size,
                                 " entries, the dense gradient ", dense.size);
    const index_t k = static_cast<index_t>(p->indices.size());
    detail::expects<shape_error>(static_cast<index_t>(p->values.size()) == k, where, ": worker ", w, " has ", k,
                                 " indices but ", p->values.size(), " values");
    if (k == 0) continue;
    // Strictly increasing indices are unique: the scatter below then has no two writers per entry.
    // (is_sorted with <= as the order: the first i with idx[i] <= idx[i - 1].)
    const auto repeat = thrust::is_sorted_until(ex.policy(), p->indices.begin(), p->indices.end(),
                                                thrust::less_equal<std::int64_t>());
    detail::expects(repeat == p->indices.end(), where, ": worker ", w, " indices are not strictly increasing at ",
                    repeat - p->indices.begin());
    const std::int64_t lo = detail::backend_ops<Backend>::read(resources, detail::raw(p->indices)),
                       hi = detail::backend_ops<Backend>::read(resources, detail::raw(p->indices) + (k - 1));
    detail::expects<out_of_range>(lo >= 0 && hi < dense.size, where, ": worker ", w, " index ", lo < 0 ? lo : hi,
                                  " is out of range [0, ", dense.size, ")");
    const float* v = thrust::raw_pointer_cast(p->values.data());
    const index_t bad = detail::first_non_finite(ex, v, k);
    if (bad != k)
      detail::expects<non_finite_error>(false, where, ": worker ", w, " value[", bad,
                                        "] = ", detail::backend_ops<Backend>::read(resources, v + bad),
                                        " is not finite");
  }
  thrust::fill(ex.policy(), dense.data, dense.data + dense.size, 0.f);
  for (const compressed_gradient<Backend>* p : parts)
    detail::parallel_for(ex, static_cast<index_t>(p->indices.size()),
                         detail::scatter_add{dense.data, thrust::raw_pointer_cast(p->indices.data()),
                                             thrust::raw_pointer_cast(p->values.data())});
  if (how == worker_reduction::mean)
    detail::parallel_for(ex, dense.size, detail::divide_by{dense.data, static_cast<float>(parts.size())});
  detail::backend_ops<Backend>::synchronize(resources);
}

}  // namespace xsoftmax
