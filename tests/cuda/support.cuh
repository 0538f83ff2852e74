// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Helpers of the CUDA tests. The oracle is the `serial` backend: every test builds a serial head
/// and a cuda head over the same weights (host copy / device copy), runs both on the same inputs
/// and compares what comes back.
///
/// Tolerances (`tolerance_for<Storage>`), as max |cuda - serial| / max |serial| over an output:
///  * fp32: 1e-4. Both sides compute in fp32; only the summation order differs (cuBLAS vs the host
///    GEMM, block reductions vs loops): relative differences ~1e-6 on these small problems.
///  * fp16: 1e-2, bf16: 3e-2. The cuda backend rounds the hidden rows to the storage type before its
///    tensor-core GEMMs (the host keeps them in fp32) and rounds dLoss/dscore to it for the gradient
///    GEMMs: relative errors of 2^-11 (fp16) / 2^-8 (bf16) per product, summed over dim <= 130
///    terms of both signs.
///  Losses use the same numbers relative to max(|loss|, 1).

#include <xsoftmax/cuda.cuh>

#include <doctest/doctest.h>

#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace xsoftmax_cuda_test {

using xsoftmax::index_t;
using xsoftmax::loss_options;
using xsoftmax::matrix_view;
using xsoftmax::reduction;
using xsoftmax::vector_view;

template <class S>
constexpr double tolerance_for() {
  if constexpr (std::is_same_v<S, float>) return 1e-4;
  else if constexpr (std::is_same_v<S, __half>) return 1e-2;
  else return 3e-2;
}

// ------------------------------------------------------------------------------------------------
// Host <-> device
// ------------------------------------------------------------------------------------------------

template <class T>
thrust::device_vector<T> to_device(const std::vector<T>& v) {
  return thrust::device_vector<T>(v.begin(), v.end());
}

/// A device vector (any allocator: the cuda backend's vectors take `vector_allocator`) to the host.
template <class T, class A>
std::vector<T> to_host(const thrust::device_vector<T, A>& v) {
  std::vector<T> h(v.size());
  thrust::copy(v.begin(), v.end(), h.begin());
  return h;
}

/// `v` in a call's device scratch (detail::scratch_vector) of execution `ex`.
template <class T>
xsoftmax::detail::scratch_vector<xsoftmax::cuda, T> to_scratch(const xsoftmax::detail::execution<xsoftmax::cuda>& ex,
                                                            const std::vector<T>& v) {
  xsoftmax::detail::scratch_vector<xsoftmax::cuda, T> d(v.size(), ex);
  thrust::copy(v.begin(), v.end(), d.begin());
  return d;
}

/// A call's device scratch (detail::scratch_vector), to the host.
template <class T>
std::vector<T> to_host(const xsoftmax::detail::scratch_vector<xsoftmax::cuda, T>& v) {
  std::vector<T> h(v.size());
  thrust::copy(v.begin(), v.end(), h.begin());
  return h;
}

template <class T, class A>
T* raw(thrust::device_vector<T, A>& v) {
  return thrust::raw_pointer_cast(v.data());
}
template <class T, class A>
const T* raw(const thrust::device_vector<T, A>& v) {
  return thrust::raw_pointer_cast(v.data());
}

template <class T>
T* raw(xsoftmax::detail::scratch_vector<xsoftmax::cuda, T>& v) {
  return v.data();
}
template <class T>
const T* raw(const xsoftmax::detail::scratch_vector<xsoftmax::cuda, T>& v) {
  return v.data();
}

/// max |a - b| / max(max |b|, 1e-30): a tuned kernel's output against its generic oracle's.
inline double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return gap / scale;
}

// ------------------------------------------------------------------------------------------------
// Random problems
// ------------------------------------------------------------------------------------------------

struct rng {
  std::mt19937_64 gen;
  explicit rng(unsigned long long seed) : gen(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  index_t integer(index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(gen); }
};

/// A hidden batch stored with padding between rows (NaN-filled, so reading past `dim` shows up).
struct batch {
  index_t rows = 0, dim = 0, stride = 0;
  std::vector<float> h;  ///< rows x stride
  std::vector<index_t> targets;

  matrix_view<const float> host_view() const { return {h.data(), rows, dim, stride}; }
};

inline batch make_batch(rng& g, index_t rows, index_t dim, index_t num_classes, double ignore_fraction,
                        index_t padding = 3) {
  batch b;
  b.rows = rows;
  b.dim = dim;
  b.stride = dim + padding;
  b.h.assign(static_cast<std::size_t>(rows * b.stride), std::numeric_limits<float>::quiet_NaN());
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < dim; ++j) b.h[static_cast<std::size_t>(i * b.stride + j)] = g.uniform(-1.f, 1.f);
  b.targets.resize(static_cast<std::size_t>(rows));
  for (auto& t : b.targets)
    t = std::uniform_real_distribution<double>(0, 1)(g.gen) < ignore_fraction ? -100 : g.integer(0, num_classes - 1);
  return b;
}

/// Weights (and optional bias) in storage type S, uniform in [-1, 1]: a host copy for the serial
/// head and a device copy for the cuda head, with the same values.
template <class S>
struct weights {
  index_t rows = 0, dim = 0;
  std::vector<S> w, b;
  thrust::device_vector<S> dw, db;

  weights(rng& g, index_t rows_, index_t dim_, bool bias) : rows(rows_), dim(dim_) {
    w.resize(static_cast<std::size_t>(rows * dim));
    for (auto& x : w) x = xsoftmax::from_float<S>(g.uniform(-1.f, 1.f));
    if (bias) {
      b.resize(static_cast<std::size_t>(rows));
      for (auto& x : b) x = xsoftmax::from_float<S>(g.uniform(-1.f, 1.f));
    }
    dw = to_device(w);
    db = to_device(b);
  }
  matrix_view<S> host_view() { return {w.data(), rows, dim}; }
  S* host_bias() { return b.empty() ? nullptr : b.data(); }
  matrix_view<S> device_view() { return {raw(dw), rows, dim}; }
  S* device_bias() { return db.empty() ? nullptr : raw(db); }
};

// ------------------------------------------------------------------------------------------------
// Running a head
// ------------------------------------------------------------------------------------------------

/// Everything one forward_backward call outputs, on the host.
struct fb_outputs {
  float loss = 0;
  std::vector<float> per_sample, grad_hidden, grad_values, grad_bias;
  std::vector<index_t> grad_rows;
};

template <class Head>
fb_outputs forward_backward_host(const Head& head, const batch& b, loss_options opt,
                                 const std::vector<float>& grad_output) {
  fb_outputs o;
  o.per_sample.assign(static_cast<std::size_t>(b.rows), std::numeric_limits<float>::quiet_NaN());
  o.grad_hidden.assign(static_cast<std::size_t>(b.rows * b.dim), std::numeric_limits<float>::quiet_NaN());
  typename Head::gradient_type g;
  o.loss = head.forward_backward(b.host_view(), vector_view<const index_t>(b.targets.data(), b.rows),
                                 matrix_view<float>(o.grad_hidden.data(), b.rows, b.dim), g, opt,
                                 vector_view<float>(o.per_sample.data(), b.rows),
                                 vector_view<const float>(grad_output.data(), static_cast<index_t>(grad_output.size())));
  o.grad_rows.assign(g.rows.begin(), g.rows.end());
  o.grad_values.assign(g.values.begin(), g.values.end());
  o.grad_bias.assign(g.bias_values.begin(), g.bias_values.end());
  return o;
}

/// The device copies of a batch.
struct device_batch {
  thrust::device_vector<float> h;
  thrust::device_vector<index_t> targets;
  index_t rows, dim, stride;
  explicit device_batch(const batch& b)
      : h(to_device(b.h)), targets(to_device(b.targets)), rows(b.rows), dim(b.dim), stride(b.stride) {}
  matrix_view<const float> view() const { return {raw(h), rows, dim, stride}; }
  vector_view<const index_t> target_view() const { return {raw(targets), rows}; }
};

template <class Head>
fb_outputs forward_backward_device(const Head& head, const device_batch& db, loss_options opt,
                                   const std::vector<float>& grad_output) {
  thrust::device_vector<float> per(static_cast<std::size_t>(db.rows), std::numeric_limits<float>::quiet_NaN());
  thrust::device_vector<float> gh(static_cast<std::size_t>(db.rows * db.dim), std::numeric_limits<float>::quiet_NaN());
  thrust::device_vector<float> up = to_device(grad_output);
  typename Head::gradient_type g;
  fb_outputs o;
  o.loss = head.forward_backward(db.view(), db.target_view(), matrix_view<float>(raw(gh), db.rows, db.dim), g, opt,
                                 vector_view<float>(raw(per), db.rows),
                                 vector_view<const float>(raw(up), static_cast<index_t>(grad_output.size())));
  o.per_sample = to_host(per);
  o.grad_hidden = to_host(gh);
  o.grad_rows = to_host(g.rows);
  o.grad_values = to_host(g.values);
  o.grad_bias = to_host(g.bias_values);
  return o;
}

// ------------------------------------------------------------------------------------------------
// Comparisons
// ------------------------------------------------------------------------------------------------

/// max |a - ref| <= tol * max |ref| (NaN anywhere in `a` fails), with a message naming `what`.
inline void check_close(const std::vector<float>& a, const std::vector<float>& ref, double tol,
                        const std::string& what) {
  REQUIRE_MESSAGE(a.size() == ref.size(), what, ": ", a.size(), " values vs ", ref.size());
  double scale = 0, err = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    const double e = std::fabs(static_cast<double>(a[i]) - ref[i]);
    if (!(e <= err)) {  // also catches NaN
      err = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      worst = i;
    }
  }
  const double bound = tol * std::max(scale, 1e-30);
  CHECK_MESSAGE(err <= bound, what, ": max error ", err, " at ", worst, " (cuda ", (a.empty() ? 0.f : a[worst]),
                ", serial ", (ref.empty() ? 0.f : ref[worst]), "), bound ", bound);
}

inline void check_close(float a, float ref, double tol, const std::string& what) {
  const double bound = tol * std::max(1.0, std::fabs(static_cast<double>(ref)));
  CHECK_MESSAGE(std::fabs(static_cast<double>(a) - ref) <= bound, what, ": cuda ", a, " vs serial ", ref);
}

inline void check_same_outputs(const fb_outputs& dev, const fb_outputs& ref, double tol, const std::string& what) {
  check_close(dev.loss, ref.loss, tol, what + ": loss");
  check_close(dev.per_sample, ref.per_sample, tol, what + ": per-sample losses");
  check_close(dev.grad_hidden, ref.grad_hidden, tol, what + ": grad_hidden");
  CHECK_MESSAGE(dev.grad_rows == ref.grad_rows, what, ": gradient rows differ");
  check_close(dev.grad_values, ref.grad_values, tol, what + ": weight gradient");
  check_close(dev.grad_bias, ref.grad_bias, tol, what + ": bias gradient");
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline bool bitwise_equal(const fb_outputs& a, const fb_outputs& b) {
  return std::memcmp(&a.loss, &b.loss, sizeof(float)) == 0 && bitwise_equal(a.per_sample, b.per_sample) &&
         bitwise_equal(a.grad_hidden, b.grad_hidden) && a.grad_rows == b.grad_rows &&
         bitwise_equal(a.grad_values, b.grad_values) && bitwise_equal(a.grad_bias, b.grad_bias);
}

/// The serial and cuda heads over the same weights agree on forward_backward under every reduction
/// (none with a per-sample upstream gradient), forward alone, log_prob, top-k and log_distribution;
/// and the cuda head is bitwise repeatable. `ref` and `dev` are heads of the same kind.
template <class Ref, class Dev>
void check_head(const Ref& ref, const Dev& dev, const batch& b, double tol, const std::string& what, index_t k) {
  const device_batch db(b);
  rng g(99);
  std::vector<float> grad_output(static_cast<std::size_t>(b.rows));
  for (auto& x : grad_output) x = g.uniform(0.1f, 2.f);
  for (reduction r : {reduction::none, reduction::mean, reduction::sum}) {
    loss_options opt;
    opt.reduce = r;
    const std::vector<float> up = r == reduction::none ? grad_output : std::vector<float>{0.75f};
    const std::string w = what + (r == reduction::none ? " [none]" : r == reduction::mean ? " [mean]" : " [sum]");
    const fb_outputs h = forward_backward_host(ref, b, opt, up);
    const fb_outputs d = forward_backward_device(dev, db, opt, up);
    check_same_outputs(d, h, tol, w);
    const fb_outputs again = forward_backward_device(dev, db, opt, up);
    CHECK_MESSAGE(bitwise_equal(d, again), w, ": two identical cuda runs differ");
    // forward alone, with and without per-sample losses.
    thrust::device_vector<float> per(static_cast<std::size_t>(b.rows));
    const float lf = dev.forward(db.view(), db.target_view(), opt, vector_view<float>(raw(per), b.rows));
    check_close(lf, h.loss, tol, w + ": forward");
    check_close(to_host(per), h.per_sample, tol, w + ": forward per-sample");
    if (r != reduction::none) {
      const float again_loss = dev.forward(db.view(), db.target_view(), opt);
      CHECK_MESSAGE(again_loss == lf, w, ": forward without per_sample gives ", again_loss, " vs ", lf);
    }
  }

  // log_prob of valid targets.
  std::vector<index_t> valid = b.targets;
  for (auto& t : valid) t = t < 0 ? 0 : t;
  std::vector<float> lp_ref(static_cast<std::size_t>(b.rows));
  ref.log_prob(b.host_view(), vector_view<const index_t>(valid.data(), b.rows), vector_view<float>(lp_ref.data(), b.rows));
  thrust::device_vector<index_t> dvalid = to_device(valid);
  thrust::device_vector<float> lp_dev(static_cast<std::size_t>(b.rows));
  dev.log_prob(db.view(), vector_view<const index_t>(raw(dvalid), b.rows), vector_view<float>(raw(lp_dev), b.rows));
  check_close(to_host(lp_dev), lp_ref, tol, what + ": log_prob");

  // log_distribution: all classes, and a range inside.
  const index_t n = ref.num_classes();
  std::vector<float> dist_ref(static_cast<std::size_t>(b.rows * n));
  ref.log_distribution(b.host_view(), 0, n, matrix_view<float>(dist_ref.data(), b.rows, n));
  thrust::device_vector<float> dist_dev(static_cast<std::size_t>(b.rows * n));
  dev.log_distribution(db.view(), 0, n, matrix_view<float>(raw(dist_dev), b.rows, n));
  check_close(to_host(dist_dev), dist_ref, tol, what + ": log_distribution");
  if (n >= 3) {
    const index_t lo = n / 3, hi = n - 1, m = hi - lo;
    std::vector<float> part_ref(static_cast<std::size_t>(b.rows * m));
    ref.log_distribution(b.host_view(), lo, hi, matrix_view<float>(part_ref.data(), b.rows, m));
    thrust::device_vector<float> part_dev(static_cast<std::size_t>(b.rows * m));
    dev.log_distribution(db.view(), lo, hi, matrix_view<float>(raw(part_dev), b.rows, m));
    check_close(to_host(part_dev), part_ref, tol, what + ": log_distribution of a range");
  }

  // top-k: the same classes, except where the serial head's own log-probabilities say two classes
  // are within the tolerance of each other (a near tie may order differently).
  k = std::min(k, n);
  std::vector<index_t> cls_ref(static_cast<std::size_t>(b.rows * k));
  std::vector<float> tlp_ref(static_cast<std::size_t>(b.rows * k));
  ref.topk(b.host_view(), k, matrix_view<index_t>(cls_ref.data(), b.rows, k), matrix_view<float>(tlp_ref.data(), b.rows, k));
  thrust::device_vector<index_t> cls_dev(static_cast<std::size_t>(b.rows * k));
  thrust::device_vector<float> tlp_dev(static_cast<std::size_t>(b.rows * k));
  dev.topk(db.view(), k, matrix_view<index_t>(raw(cls_dev), b.rows, k), matrix_view<float>(raw(tlp_dev), b.rows, k));
  const std::vector<index_t> cls = to_host(cls_dev);
  check_close(to_host(tlp_dev), tlp_ref, tol, what + ": topk log-probabilities");
  for (index_t i = 0; i < b.rows * k; ++i) {
    if (cls[i] == cls_ref[i]) continue;
    const index_t r = i / k;
    const bool valid_class = cls[i] >= 0 && cls[i] < n;
    const double gap = valid_class ? std::fabs(dist_ref[r * n + cls[i]] - tlp_ref[i]) : 1e30;
    CHECK_MESSAGE(gap <= tol * std::max(1.0, std::fabs(static_cast<double>(tlp_ref[i]))), what,
                  ": topk row ", r, " rank ", i % k, ": cuda class ", cls[i], " vs serial class ", cls_ref[i],
                  " (not a near tie: log-prob gap ", gap, ")");
  }
}

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

/// The host call and the device call throw the same exception type with the same message (or,
/// with expect_throw = false, neither throws).
template <class HostCall, class DeviceCall>
void check_same_error(HostCall host_call, DeviceCall device_call, const std::string& what, bool expect_throw = true) {
  std::string host_type, host_msg, dev_type = "(nothing thrown)", dev_msg;
  try {
    host_call();
  } catch (const std::exception& e) {
    host_type = typeid(e).name();
    host_msg = e.what();
  }
  try {
    device_call();
  } catch (const std::exception& e) {
    dev_type = typeid(e).name();
    dev_msg = e.what();
  }
  if (!expect_throw) {
    CHECK_MESSAGE(host_msg.empty(), what, ": the serial head threw ", host_msg);
    CHECK_MESSAGE(dev_msg.empty(), what, ": the cuda head threw ", dev_msg);
    return;
  }
  REQUIRE_MESSAGE(!host_msg.empty(), what, ": the serial head did not throw");
  CHECK_MESSAGE(dev_type == host_type, what, ": cuda threw ", dev_type, " (", dev_msg, "), serial ", host_type);
  CHECK_MESSAGE(dev_msg == host_msg, what, ": cuda message \"", dev_msg, "\" vs serial \"", host_msg, "\"");
}

}  // namespace xsoftmax_cuda_test
