// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The per-sample-active-set pass of `selective_softmax`: each packed row against its own class
/// list with gather-dot (weight rows read in place, never copied). Weight-gradient contributions
/// (one per (row, class) pair) are summed per class by the deterministic sparse accumulation.

#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/sparse_accumulate.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <cmath>
#include <vector>

namespace xsoftmax::detail {

/// Losses of the packed rows (and, when `upstream` is non-null, their hidden gradient into
/// `grad_packed` (rows x dim, zeroed) and the weight gradient of the union of the lists, ascending,
/// into `g`). `target_pos[r]` is the entry of `set.ids` holding row r's target.
template <class Policy, class Batch, class T, class Gradient>
void per_sample_pass(const Policy& policy, const Batch& batch, const active_set& set,
                     const std::vector<index_t>& target_pos, matrix_view<const T> w, const T* bias,
                     const float* upstream, std::vector<float>& losses, std::vector<float>& grad_packed,
                     Gradient* g) {
  const index_t rows = batch.rows, d = batch.dim;
  const index_t nnz = static_cast<index_t>(set.ids.size());
  const index_t* off = set.offsets.data();
  const index_t* ids = set.ids.data();
  const float* eoff = set.id_offset.empty() ? nullptr : set.id_offset.data();
  const index_t* tpos = target_pos.data();
  const float* h = batch.hidden.data();
  float* loss = losses.data();
  float* gh = grad_packed.data();
  std::vector<float> scores(static_cast<std::size_t>(nnz));
  float* s = scores.data();
  parallel_for(policy, rows, [=](index_t r) {
    const float* hr = h + r * d;
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      gather_dot(hr, w, bias, ids[e], 1, s + e);
      if (eoff) s[e] += eoff[e];
    }
    const float lse = row_logsumexp(s + off[r], off[r + 1] - off[r]);
    loss[r] = lse - s[tpos[r]];
    if (!upstream) return;
    float* ghr = gh + r * d;
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      s[e] = std::exp(s[e] - lse) * upstream[r] - (e == tpos[r] ? upstream[r] : 0.f);
      const T* wr = w.row(ids[e]);
      for (index_t p = 0; p < d; ++p) ghr[p] += s[e] * to_float(wr[p]);
    }
  });
  if (!upstream) return;

  // One contribution g_e * h_r (and g_e for the bias, as an extra column) per entry.
  const index_t dv = bias ? d + 1 : d;
  std::vector<float> contrib(static_cast<std::size_t>(nnz * dv));
  float* cv = contrib.data();
  parallel_for(policy, rows, [=](index_t r) {
    const float* hr = h + r * d;
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      float* c = cv + e * dv;
      for (index_t p = 0; p < d; ++p) c[p] = s[e] * hr[p];
      if (dv > d) c[d] = s[e];
    }
  });
  std::vector<index_t> keys(set.ids.begin(), set.ids.end()), out_keys;
  std::vector<float> sums;
  sparse_accumulate(policy, keys, contrib, dv, out_keys, sums);
  const index_t n = static_cast<index_t>(out_keys.size());
  g->dim = d;
  g->rows.assign(out_keys.begin(), out_keys.end());
  g->values.resize(static_cast<std::size_t>(n * d));
  g->bias_values.resize(bias ? static_cast<std::size_t>(n) : 0);
  float* gv = thrust::raw_pointer_cast(g->values.data());
  float* gb = bias ? thrust::raw_pointer_cast(g->bias_values.data()) : nullptr;
  const float* sv = sums.data();
  parallel_for(policy, n, [=](index_t i) {
    for (index_t p = 0; p < d; ++p) gv[i * d + p] = sv[i * dv + p];
    if (gb) gb[i] = sv[i * dv + d];
  });
}

}  // namespace xsoftmax::detail
