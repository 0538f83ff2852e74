// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The GEMM path of a hierarchical-softmax level: a run of at least `gemm_min_run` samples is a
/// dense softmax of its rows over its node's block of child rows (the `dense_softmax` primitive:
/// chunked over the block's columns, so a wide node never holds more than len x chunk scores).
/// Generic version: long runs one after another, each using every thread (or the device) inside
/// its GEMMs; short runs side by side on a host backend. A backend may specialise
/// `dense_runs_tuning` (the cuda backend groups a level's small runs into grouped GEMMs; see
/// `xsoftmax::dense_grouping`); the generic version stays its oracle.

#include <xsoftmax/detail/hierarchical/node_runs.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>

#include <vector>

namespace xsoftmax {
enum class dense_grouping;
}  // namespace xsoftmax

namespace xsoftmax::detail {

/// One run as a dense softmax problem on `ex` (an execution or a Thrust host policy).
template <class Ex, class T>
void dense_run(const Ex& ex, const node_run_data<T>& a, const node_run& run) {
  const index_t len = run.end - run.begin, d = a.dim;
  dense_softmax_args s;
  s.h = matrix_view<const float>(a.h + run.begin * d, len, d);
  s.target = a.child + run.begin;
  s.first = run.block_begin;
  s.n = run.block_size;
  s.chunk = default_chunk_columns(len);
  s.loss = a.loss + run.begin;
  if (a.backward()) {
    s.upstream = a.upstream + run.begin;
    s.grad_h = a.grad_h + run.begin * d;
    s.grad_w = a.grad_w + run.grad_offset * d;
    s.grad_b = a.grad_b ? a.grad_b + run.grad_offset : nullptr;
  }
  dense_softmax(ex, a.w, a.bias, s);
}

/// A backend's tuned GEMM path for storage type T, when it has one: specialised with
/// `available = true` and `run(ex, data, runs, grouping)`.
template <class Backend, class T>
struct dense_runs_tuning {
  static constexpr bool available = false;
};

/// The generic GEMM path over one level's `runs` (host memory).
template <class B, class T>
void dense_runs_generic(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs) {
  std::vector<node_run> short_runs;
  for (const node_run& run : runs) {
    if (run.end - run.begin >= run_parallel_inside) dense_run(ex, a, run);
    else short_runs.push_back(run);
  }
  const node_run* sr = short_runs.data();
  for_each_task(ex, static_cast<index_t>(short_runs.size()),
                [&](const auto& inner, index_t i) { dense_run(inner, a, sr[i]); });
}

/// The GEMM path over one level's `runs`: the backend's tuned version when it has one.
template <class B, class T>
void dense_runs(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs,
                xsoftmax::dense_grouping grouping) {
  if (runs.empty()) return;
  using tuning = dense_runs_tuning<B, T>;
  if constexpr (tuning::available) tuning::run(ex, a, runs, grouping);
  else dense_runs_generic(ex, a, runs), (void)grouping;
}

}  // namespace xsoftmax::detail
