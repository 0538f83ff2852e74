// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A batch prepared for a head on any backend: data checks of hidden rows, targets and class
/// weights, the rows whose target is not ignored widened to fp32 and packed, their class weights,
/// the upstream gradient of each packed row, and the way back (per-sample losses, hidden-gradient
/// rows, the reduced loss). Host synchronisation only for sizes and for reporting a bad value.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/shape_checks.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/copy.h>
#include <thrust/find.h>
#include <thrust/host_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/memory.h>
#include <thrust/sequence.h>

#include <cmath>
#include <functional>

namespace xsoftmax::detail {

/// Packed rows of a batch in `Backend`'s memory: row r is original sample `sample[r]`, with target
/// `target[r]` (0 for the verbs that take no targets).
template <class Backend>
struct batch_rows {
  index_t dim = 0;
  index_t rows = 0;
  scratch_vector<Backend, index_t> sample;
  scratch_vector<Backend, index_t> target;
  scratch_vector<Backend, float> hidden;  ///< rows x dim
  /// With class weights (`weigh_rows`): each row's weight, and their sum (one value); else empty.
  scratch_vector<Backend, float> weight, weight_total;
  /// Whether the softmax pass applies the class weights itself (`class_weights_in_pass`): then
  /// `upstream_gradients` leaves the rows' weights out (the mean still divides by their total).
  bool weights_in_pass = false;
  [[nodiscard]] matrix_view<const float> hidden_view() const { return {thrust::raw_pointer_cast(hidden.data()), rows, dim}; }
  [[nodiscard]] const index_t* sample_data() const { return thrust::raw_pointer_cast(sample.data()); }
  [[nodiscard]] const index_t* target_data() const { return thrust::raw_pointer_cast(target.data()); }
  /// What `reduction::mean` divides by, in the execution's memory: the rows' total class weight, or
  /// null for the row count.
  [[nodiscard]] const float* mean_divisor() const { return weight_total.empty() ? nullptr : weight_total.data(); }
};

struct bad_target {
  const index_t* t;
  index_t num_classes, ignore_index;
  XSOFTMAX_HD bool operator()(index_t i) const {
    return t[i] != ignore_index && (t[i] < 0 || t[i] >= num_classes);
  }
};

struct any_non_class {
  const index_t* t;
  index_t num_classes;
  XSOFTMAX_HD bool operator()(index_t i) const { return t[i] < 0 || t[i] >= num_classes; }
};

struct bad_class_weight {
  const float* w;
  XSOFTMAX_HD bool operator()(index_t i) const { return !(w[i] >= 0.f && w[i] < INFINITY); }  // NaN too
};

struct kept_target {
  index_t ignore_index;
  XSOFTMAX_HD bool operator()(index_t t) const { return t != ignore_index; }
};

/// Throws `non_finite_error` naming the first NaN or infinity of `hidden`'s row `i` (which holds
/// one): the row's values come back to the host one by one (an error path).
template <class Backend, class H>
void report_non_finite_row(const execution<Backend>& ex, const char* where, matrix_view<const H> hidden, index_t i) {
  for (index_t j = 0; j < hidden.cols; ++j) {
    const float v = to_float(backend_ops<Backend>::read(ex.res, hidden.row(i) + j));
    expects<non_finite_error>(!non_finite_bit(v), where, ": hidden[", i, "][", j, "] = ", v, " is not finite");
  }
}

/// Throws `out_of_range` for `targets[i]`, which is neither a class nor `ignore_index`.
template <class Backend>
[[noreturn]] void report_bad_target(const execution<Backend>& ex, const char* where, vector_view<const index_t> targets,
                                    index_t i, index_t num_classes, index_t ignore_index) {
  const index_t t = backend_ops<Backend>::read(ex.res, targets.data + i);
  expects<out_of_range>(false, where, ": targets[", i, "] = ", t, " is out of range [0, ", num_classes, ")",
                        " and is not ignore_index (", ignore_index, ")");
  throw out_of_range("unreachable");  // (expects(false, ...) threw)
}

/// `hidden`'s shape (see `check_hidden_shape`) and values: every element finite. The rows are
/// scanned where they live; only the offending row comes back to the host, for the message (which
/// names the first bad element in row-major order).
template <class Backend, class H>
void check_hidden(const execution<Backend>& ex, const char* where, matrix_view<const H> hidden, index_t dim) {
  check_hidden_shape(where, hidden, dim);
  const index_t i = first_non_finite_row(ex, hidden);
  if (i < hidden.rows) report_non_finite_row(ex, where, hidden, i);
}

/// The combined scan of `check_hidden_and_targets`: indices [0, units) are `hidden`'s units (an
/// element each on a device, a row each on the host) holding a NaN or an infinity; the rest are
/// targets that are neither a class nor ignored.
template <class H, bool PerElement>
struct bad_hidden_or_target {
  matrix_view<const H> hidden;
  index_t units;
  bad_target target;
  XSOFTMAX_HD bool operator()(index_t i) const {
    if (i >= units) return target(i - units);
    if constexpr (PerElement) {
      return element_is_non_finite<H>{hidden}(i);
    } else {
      return row_has_non_finite<H>{hidden}(i);
    }
  }
};

/// A loss verb's data checks in one scan and one read-back (each was its own: on a GPU a wait for
/// the stream each): `hidden` as `check_hidden` checks it, then one target per row, each in
/// [0, num_classes) or `ignore_index`. Both shapes first; the same errors and messages as the two
/// checks, the hidden rows' first (a batch with both a bad value and a bad target reports the value).
template <class Backend, class H>
void check_hidden_and_targets(const execution<Backend>& ex, const char* where, matrix_view<const H> hidden,
                              index_t dim, vector_view<const index_t> targets, index_t num_classes,
                              index_t ignore_index) {
  check_hidden_shape(where, hidden, dim);
  check_targets_shape(where, targets, hidden.rows);
  constexpr bool per_element = runs_on_device<execution<Backend>>;
  const index_t units = per_element ? hidden.rows * hidden.cols : hidden.rows;
  const index_t end = units + targets.size;
  count_host_read();
  const index_t i = first_index_where(
      ex, 0, end, bad_hidden_or_target<H, per_element>{hidden, units, bad_target{targets.data, num_classes, ignore_index}});
  if (i == end) return;
  if (i < units) {
    report_non_finite_row(ex, where, hidden, per_element ? i / hidden.cols : i);
    return;
  }
  report_bad_target(ex, where, targets, i - units, num_classes, ignore_index);
}

/// One target per hidden row, each in [0, num_classes) or equal to `ignore_index`.
template <class Backend>
void check_targets(const execution<Backend>& ex, const char* where, vector_view<const index_t> targets, index_t rows,
                   index_t num_classes, index_t ignore_index) {
  check_targets_shape(where, targets, rows);
  count_host_read();
  const index_t i = first_index_where_light(ex, 0, targets.size, bad_target{targets.data, num_classes, ignore_index});
  if (i < targets.size) report_bad_target(ex, where, targets, i, num_classes, ignore_index);
}

/// One target per hidden row, every one a class (no target is ignored: log_prob).
template <class Backend>
void check_targets(const execution<Backend>& ex, const char* where, vector_view<const index_t> targets, index_t rows,
                   index_t num_classes) {
  check_targets_shape(where, targets, rows);
  count_host_read();
  const index_t i = first_index_where_light(ex, 0, targets.size, any_non_class{targets.data, num_classes});
  if (i == targets.size) return;
  const index_t t = backend_ops<Backend>::read(ex.res, targets.data + i);
  expects<out_of_range>(false, where, ": targets[", i, "] = ", t, " is out of range [0, ", num_classes, ")");
}

/// `class_weight`'s values, when given (its shape was checked: check_class_weight_shape): each finite
/// and >= 0, scanned where they live.
template <class Backend>
void check_class_weight_values(const execution<Backend>& ex, const char* where, vector_view<const float> class_weight) {
  if (class_weight.size == 0) return;
  count_host_read();
  const index_t i = first_index_where(ex, 0, class_weight.size, bad_class_weight{class_weight.data});
  if (i == class_weight.size) return;
  const float v = backend_ops<Backend>::read(ex.res, class_weight.data + i);
  expects(false, where, ": options.class_weight[", i, "] = ", v, " must be finite and >= 0");
}

/// Packs the rows of `hidden` whose target is not `ignore_index` (every row when `targets` is
/// empty), widened to fp32. Without `with_hidden` only their samples and targets (`hidden` stays
/// empty: for a caller that reads the rows from `hidden` itself, by `sample`).
template <class Backend, class H>
batch_rows<Backend> pack_rows(const execution<Backend>& ex, matrix_view<const H> hidden,
                              vector_view<const index_t> targets, index_t ignore_index, bool with_hidden = true) {
  batch_rows<Backend> b;
  b.dim = hidden.cols;
  b.sample = scratch_vector<Backend, index_t>(static_cast<std::size_t>(hidden.rows), ex);
  if (targets.size == 0) {
    with_light_policy(ex, hidden.rows, [&](auto policy) { thrust::sequence(policy, b.sample.begin(), b.sample.end()); });
    b.rows = hidden.rows;
  } else {
    const thrust::counting_iterator<index_t> first(0);
    count_host_read();  // the count of kept rows sizes the call's buffers
    b.rows = with_light_policy(ex, hidden.rows, [&](auto policy) {
      return thrust::copy_if(policy, first, first + hidden.rows, targets.data, b.sample.begin(),
                             kept_target{ignore_index}) -
             b.sample.begin();
    });
  }
  b.sample.resize(static_cast<std::size_t>(b.rows));
  b.target = scratch_vector<Backend, index_t>(static_cast<std::size_t>(b.rows), ex);
  b.hidden = scratch_vector<Backend, float>(with_hidden ? static_cast<std::size_t>(b.rows * b.dim) : 0, ex);
  const index_t* src = b.sample_data();
  index_t* tgt = thrust::raw_pointer_cast(b.target.data());
  float* out = with_hidden ? thrust::raw_pointer_cast(b.hidden.data()) : nullptr;
  const index_t* t = targets.data;
  const index_t d = b.dim;
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { tgt[r] = t ? t[src[r]] : 0; });
  if (out) XSOFTMAX_PARALLEL_FOR_2D(ex, b.rows, d, r, j, { out[r * d + j] = to_float(hidden.row(src[r])[j]); });
  return b;
}

/// dLoss/dloss_r for each packed row, in the execution's memory: `grad_output` is empty (1), a
/// scalar (mean/sum), or one value per *original* sample (reduction none); times the row's class
/// weight, when the batch has them (`weigh_rows`) and the pass does not apply them itself
/// (`batch_rows::weights_in_pass`), and for the mean divided by their total.
template <class Backend>
scratch_vector<Backend, float> upstream_gradients(const execution<Backend>& ex, const char* where,
                                                  const batch_rows<Backend>& b, index_t batch_rows_count,
                                                  reduction reduce, vector_view<const float> grad_output) {
  check_grad_output_shape(where, reduce, grad_output, batch_rows_count);
  scratch_vector<Backend, float> u(static_cast<std::size_t>(b.rows), ex);
  float* up = thrust::raw_pointer_cast(u.data());
  if (reduce == reduction::none && grad_output.size != 0) {
    const float* g = grad_output.data;
    const index_t* sample = b.sample_data();
    const float* w = b.weight.empty() || b.weights_in_pass ? nullptr : b.weight.data();
    XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { up[r] = w ? g[sample[r]] * w[r] : g[sample[r]]; });
    const index_t i = first_non_finite(ex, static_cast<const float*>(up), b.rows);
    if (i != b.rows)
      expects<non_finite_error>(false, where, ": grad_output gives a non-finite upstream gradient ",
                             backend_ops<Backend>::read(ex.res, up + i));
    return u;
  }
  float scale = 1.f;
  if (reduce != reduction::none && grad_output.size == 1) scale = backend_ops<Backend>::read(ex.res, grad_output.data);
  const float* w = b.weight.empty() ? nullptr : b.weight.data();
  if (reduce == reduction::mean && b.rows > 0 && !w) scale /= static_cast<float>(b.rows);
  expects<non_finite_error>(std::isfinite(scale), where, ": grad_output gives a non-finite upstream gradient ", scale);
  if (!w) {
    XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { up[r] = scale; });
    return u;
  }
  // Class weights: scale w_r (scale alone when the pass weighs), divided by the rows' total weight
  // for the mean; a mean of total weight 0 is 0 (as `reduce_losses_into`), its gradients too.
  const float* total = reduce == reduction::mean ? b.weight_total.data() : nullptr;
  const bool in_pass = b.weights_in_pass;
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, {
    const float wr = in_pass ? scale : scale * w[r];
    up[r] = !total ? wr : total[0] > 0.f ? wr / total[0] : 0.f;
  });
  return u;
}

/// Writes per-sample losses to `out` (B entries; ignored samples get 0).
template <class Backend>
void scatter_losses(const execution<Backend>& ex, const batch_rows<Backend>& b, const float* losses,
                    vector_view<float> out) {
  float* o = out.data;
  const index_t* sample = b.sample_data();
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, out.size, i, { o[i] = 0.f; });
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { o[sample[r]] = losses[r]; });
}

/// Every element of `out` (its rows x cols, not the gaps of its stride) = value.
template <class Backend>
void fill_rows(const execution<Backend>& ex, matrix_view<float> out, float value) {
  XSOFTMAX_PARALLEL_FOR_2D(ex, out.rows, out.cols, i, j, { out.row(i)[j] = value; });
}

/// Whether the elements of two matrices may share memory (the spans from their first row's start to
/// their last row's end intersect; an empty matrix shares none).
template <class T, class U>
bool rows_overlap(matrix_view<T> a, matrix_view<U> b) {
  if (a.size() == 0 || b.size() == 0) return false;
  const auto* a0 = reinterpret_cast<const char*>(a.data);
  const auto* b0 = reinterpret_cast<const char*>(b.data);
  const auto* a1 = reinterpret_cast<const char*>(a.data + (a.rows - 1) * a.stride + a.cols);
  const auto* b1 = reinterpret_cast<const char*>(b.data + (b.rows - 1) * b.stride + b.cols);
  return std::less<const char*>()(a0, b1) && std::less<const char*>()(b0, a1);
}

/// Writes packed hidden-gradient rows back to the caller's (B x dim) matrix; ignored rows get 0.
template <class Backend>
void scatter_rows(const execution<Backend>& ex, const batch_rows<Backend>& b, const float* packed,
                  matrix_view<float> out) {
  const index_t d = out.cols;
  // Every packed row is a distinct sample: with none ignored, every output row is written below.
  if (b.rows != out.rows) fill_rows(ex, out, 0.f);
  const index_t* sample = b.sample_data();
  XSOFTMAX_PARALLEL_FOR_2D(ex, b.rows, d, r, j, { out.row(sample[r])[j] = packed[r * d + j]; });
}

/// out[b] = the sum (in double) of in[b * block, min((b + 1) * block, n)).
template <class In>
struct block_sum {
  const In* in;
  index_t n, block;
  double* out;
  XSOFTMAX_HD void operator()(index_t b) const {
    double acc = 0;
    const index_t end = (b + 1) * block < n ? (b + 1) * block : n;
    for (index_t i = b * block; i < end; ++i) acc += in[i];
    out[b] = acc;
  }
};

/// out[b] = the sum (in double) of in[b * block, min((b + 1) * block, n)), for every block b; a
/// light loop (on the calling thread of the omp backend) when n values are (`light_loop_limit`).
template <class Backend, class In>
void sum_blocks(const execution<Backend>& ex, const In* in, index_t n, index_t block, double* out) {
  const block_sum<In> sum{in, n, block, out};
  if (runs_light_loop_inline(ex, n))
    parallel_for_light(ex, (n + block - 1) / block, sum);
  else
    parallel_for(ex, (n + block - 1) / block, sum);
}

/// The reduced loss of `n` per-row losses into `out[0]` (the execution's memory): their sum, or
/// their mean for `reduction::mean` (0 when n = 0, where PyTorch would return NaN: a training loop
/// should not be poisoned by a batch of padding). With `divisor` (the execution's memory: the rows'
/// total class weight) the mean is the sum divided by it (0 when it is 0). Summed in double as a tree
/// of fixed blocks of 64 in a fixed order, so the result does not depend on the backend or its
/// thread count; each level runs in parallel (one device thread summing a 1024-row batch took 35 us
/// on an H200).
template <class Backend>
void reduce_losses_into(const execution<Backend>& ex, const float* losses, index_t n, reduction reduce, float* out,
                        const float* divisor = nullptr) {
  constexpr index_t block = 64;
  index_t m = (n + block - 1) / block;
  scratch_vector<Backend, double> level(static_cast<std::size_t>(m), ex), next;
  sum_blocks(ex, losses, n, block, level.data());
  while (m > block) {  // a level of block sums per level, until one block of them is left
    const index_t count = m;
    m = (count + block - 1) / block;
    next = scratch_vector<Backend, double>(static_cast<std::size_t>(m), ex);
    sum_blocks(ex, static_cast<const double*>(level.data()), count, block, next.data());
    level.swap(next);
  }
  const double* p = level.data();
  const bool mean = reduce == reduction::mean;
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, 1, unused_index, {
    (void)unused_index;
    double total = 0;
    for (index_t b = 0; b < m; ++b) total += p[b];
    const double by = divisor ? static_cast<double>(divisor[0]) : static_cast<double>(n);
    out[0] = mean ? (by > 0 ? static_cast<float>(total / by) : 0.f) : static_cast<float>(total);
  });
}

/// Whether the softmax pass applies `o.class_weight` itself: with label smoothing PyTorch weighs every
/// class of the smoothing term (`dense_softmax_args::class_weight`), not the sample's whole loss; the
/// pass then weighs the losses and the upstream gradients carry no row weight.
[[nodiscard]] inline bool class_weights_in_pass(const loss_options& o) {
  return o.class_weight.size != 0 && o.label_smoothing > 0.f;
}

/// With class weights (`o.class_weight` non-empty): each packed row's weight class_weight[target] and
/// their total, which `upstream_gradients` and the mean (`mean_divisor`) then use. No-op otherwise.
template <class Backend>
void weigh_rows(const execution<Backend>& ex, batch_rows<Backend>& b, const loss_options& o) {
  const vector_view<const float> class_weight = o.class_weight;
  if (class_weight.size == 0) return;
  b.weights_in_pass = class_weights_in_pass(o);
  b.weight = scratch_vector<Backend, float>(static_cast<std::size_t>(b.rows), ex);
  float* w = b.weight.data();
  const float* cw = class_weight.data;
  const index_t* t = b.target_data();
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { w[r] = cw[t[r]]; });
  b.weight_total = scratch_vector<Backend, float>(1, ex);
  reduce_losses_into(ex, static_cast<const float*>(w), b.rows, reduction::sum, b.weight_total.data());
}

/// losses[r] *= class_weight[target of packed row r], when class weights are given and the softmax
/// pass did not apply them (`class_weights_in_pass`).
template <class Backend>
void weigh_losses(const execution<Backend>& ex, const batch_rows<Backend>& b, const loss_options& o, float* losses) {
  if (o.class_weight.size == 0 || class_weights_in_pass(o)) return;
  const float* cw = o.class_weight.data;
  const index_t* t = b.target_data();
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, b.rows, r, { losses[r] *= cw[t[r]]; });
}

/// `reduce_losses_into`, returned to the host.
template <class Backend>
float reduce_losses(const execution<Backend>& ex, const float* losses, index_t n, reduction reduce) {
  scratch_vector<Backend, float> out(1, ex);
  reduce_losses_into(ex, losses, n, reduce, out.data());
  return backend_ops<Backend>::read(ex.res, out.data());
}

}  // namespace xsoftmax::detail
