// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The per-sample-active-set pass of `selective_softmax`: each packed row against its own class
/// list with gather-dot (weight rows read in place, never copied). Weight-gradient contributions
/// (one per (row, class) pair) are summed per class by the deterministic sparse accumulation.
/// With a margin, each row is normalised once and each entry's weight row's norm is taken beside
/// its dot product; the gradient of an entry goes back through both normalisations in place.

#include <xsoftmax/detail/primitives/angular_margin.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/detail/primitives/sparse_accumulate.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <cmath>
#include <functional>

namespace xsoftmax::detail {

/// Losses of the packed rows (and, when `upstream` is non-null, their hidden gradient into
/// `grad_packed` (rows x dim, zeroed) and the weight gradient of the union of the lists, ascending,
/// into `g`). `target_pos[r]` is the entry of `set.ids` holding row r's target. `terms`: label
/// smoothing, z-loss, margin (the bias must be null with one), soft-capping. Every pointer is in the execution's
/// memory. Class-sharded heads pass their slice of the set (local weight rows; `target_pos[r]` -1
/// where another rank holds row r's target) and `combine` (see `dense_softmax_args::combine_rows`),
/// called once between the scores and the loss.
template <class Backend, class Set, class T, class Gradient>
void per_sample_pass(const execution<Backend>& ex, const batch_rows<Backend>& batch, const Set& set,
                     const index_t* target_pos, matrix_view<const T> w, const T* bias, const loss_options& terms,
                     const float* upstream, float* losses, float* grad_packed, Gradient* g,
                     const std::function<void(const dense_row_statistics&)>& combine = {}) {
  const index_t rows = batch.rows, d = batch.dim;
  const index_t nnz = static_cast<index_t>(set.ids.size());
  const index_t* off = thrust::raw_pointer_cast(set.offsets.data());
  const index_t* ids = thrust::raw_pointer_cast(set.ids.data());
  const float* eoff = set.id_offset.empty() ? nullptr : thrust::raw_pointer_cast(set.id_offset.data());
  const index_t* tpos = target_pos;
  const float* h = thrust::raw_pointer_cast(batch.hidden.data());
  float* loss = losses;
  float* gh = grad_packed;
  // The call's buffers are scratch: written before they are read, or filled where accumulated into.
  using floats = scratch_vector<Backend, float>;
  floats scores(static_cast<std::size_t>(nnz), ex);
  float* s = raw(scores);
  const float eps = terms.label_smoothing, z = terms.z_loss, cap = terms.softcap;
  // Class weights with label smoothing (`batch.weights_in_pass`): each entry's smoothing term weighed
  // by its class's weight, the rest of the row's loss by its target's (`dense_softmax_args::class_weight`).
  const float* cw = batch.weights_in_pass ? terms.class_weight.data : nullptr;
  const float* rw = cw ? batch.weight.data() : nullptr;
  const bool plain = eps == 0.f && z == 0.f && cap == 0.f && !cw;
  // Margin: per row 1 / |h_r|, per entry 1 / |w_id| and the entry's cosine (for the backward).
  const bool margin = terms.margin.enabled();
  const margin_logits ml = make_margin_logits(terms.margin);
  floats h_inverse_norm(margin ? static_cast<std::size_t>(rows) : 0, ex),
      w_inverse_norm(margin ? static_cast<std::size_t>(nnz) : 0, ex), cosines(w_inverse_norm.size(), ex);
  float* hinv = raw(h_inverse_norm);
  float* winv = raw(w_inverse_norm);
  float* cosv = raw(cosines);
  // Pass 1, per row: scores, then the row's statistics (log-sum-exp, target score, finite sum and
  // count for label smoothing). Sharded (`combine`): this rank's entries give a partial state
  // (max, sum of exp) that `combine` replaces by every rank's before the log-sum-exp is taken.
  const bool smooth_sums = !plain;
  floats row_lse(static_cast<std::size_t>(rows), ex), row_sum(combine ? static_cast<std::size_t>(rows) : 0, ex),
      target_logit(static_cast<std::size_t>(rows), ex, 0.f),
      finite_sum(smooth_sums ? static_cast<std::size_t>(rows) : 0, ex, 0.f), finite_weight(cw ? finite_sum.size() : 0, ex, 0.f);
  scratch_vector<Backend, index_t> finite_count(finite_sum.size(), ex, 0);
  float* fw = raw(finite_weight);
  float* lse_r = raw(row_lse);
  float* sum_r = raw(row_sum);
  float* tl = raw(target_logit);
  float* fs = raw(finite_sum);
  index_t* fc = raw(finite_count);
  const bool partial = static_cast<bool>(combine);
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float* hr = h + r * d;
    if (margin) hinv[r] = clamped_inverse_norm(squared_norm(hr, d));
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      gather_dot(hr, w, bias, ids[e], 1, s + e);
      if (margin) {
        winv[e] = clamped_inverse_norm(squared_norm(w.row(ids[e]), d));
        cosv[e] = s[e] * hinv[r] * winv[e];
        s[e] = e == tpos[r] ? ml.target_logit(cosv[e]) : ml.scale * cosv[e];
      }
      if (cap > 0.f) s[e] = cap * ::tanhf(s[e] / cap);  // soft-capping (never with a margin)
      if (eoff) s[e] += eoff[e];
    }
    if (partial) {  // (max, sum of exp(s - max)); a row with no entry here: (-inf, 0)
      float m = -INFINITY, acc = 0.f;
      for (index_t e = off[r]; e < off[r + 1]; ++e) m = s[e] > m ? s[e] : m;
      if (m != -INFINITY)
        for (index_t e = off[r]; e < off[r + 1]; ++e) acc += ::expf(s[e] - m);
      lse_r[r] = m, sum_r[r] = acc;
    } else {
      lse_r[r] = row_logsumexp(s + off[r], off[r + 1] - off[r]);
    }
    if (tpos[r] >= 0) tl[r] = s[tpos[r]];  // sharded: 0 where another rank holds the target
    if (smooth_sums) {  // with class weights: sum_e w_e s_e and sum_e w_e
      float sum = 0.f, weight = 0.f;
      index_t count = 0;
      for (index_t e = off[r]; e < off[r + 1]; ++e)
        if (s[e] > -INFINITY) {
          const float we = cw ? cw[ids[e]] : 1.f;
          sum += we * s[e], weight += we, ++count;
        }
      fs[r] = sum, fc[r] = count;
      if (cw) fw[r] = weight;
    }
  });
  if (partial) {
    combine(dense_row_statistics{lse_r, sum_r, tl, smooth_sums ? fs : nullptr, smooth_sums ? fc : nullptr, rows});
    XSOFTMAX_PARALLEL_FOR(ex, rows, r, { lse_r[r] = finish_logsumexp(lse_r[r], sum_r[r]); });
  }

  // Pass 2, per row: the loss and, with `upstream`, dloss/dscore and the hidden gradient.
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float* hr = h + r * d;
    const float lse = lse_r[r];
    float uniform = 0.f;  // label smoothing: eps / (finite scores of the row), and their mean
    const float rho = cw ? rw[r] : 1.f;  // the row's target's weight when the pass weighs
    if (plain) {
      loss[r] = lse - tl[r];
    } else {
      uniform = eps > 0.f ? eps / static_cast<float>(fc[r]) : 0.f;
      if (cw)  // rho ((1 - eps) (lse - s_t) + z lse^2) + eps / n sum_e w_e (lse - s_e)
        loss[r] = rho * ((1.f - eps) * (lse - tl[r]) + z * lse * lse) + uniform * fw[r] * lse - uniform * fs[r];
      else
        loss[r] = lse - (1.f - eps) * tl[r] - uniform * fs[r] + z * lse * lse;
    }
    if (!upstream) return;
    float* ghr = gh + r * d;
    // dloss/ds_e = p_e (rho (1 - eps + 2 z lse) + eps W / n) - rho (1 - eps) [e = t] - eps w_e / n
    // (W = n and w_e = rho = 1 without class weights).
    const float u = upstream[r], ur = u * rho;
    const float scale = cw ? ur * (1.f - eps + 2.f * z * lse) + uniform * fw[r] * u : u * (1.f + 2.f * z * lse);
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      if (plain) {
        s[e] = ::expf(s[e] - lse) * u - (e == tpos[r] ? u : 0.f);
      } else {
        const float v = s[e], we = cw ? cw[ids[e]] : 1.f;
        float g = (v > -INFINITY ? ::expf(v - lse) * scale - uniform * we * u : 0.f) -
                  (e == tpos[r] ? (1.f - eps) * ur : 0.f);
        if (cap > 0.f && v > -INFINITY) {  // dcapped/draw = 1 - (capped / cap)^2, capped = the score less its offset
          const float q = (eoff ? v - eoff[e] : v) / cap;
          g *= 1.f - q * q;
        }
        s[e] = g;
      }
      // Margin: dloss/dcos / |w|, so that the sum below is dloss/dh^ (h^ = h / |h|).
      if (margin) s[e] *= (e == tpos[r] ? ml.target_slope(cosv[e]) : ml.scale) * winv[e];
      const T* wr = w.row(ids[e]);
      for (index_t p = 0; p < d; ++p) ghr[p] += s[e] * to_float(wr[p]);
    }
    if (margin) {  // dloss/dh = (dloss/dh^ - h^ <h^, dloss/dh^>) / |h|; ghr held only this row's sum
      const float inv = hinv[r];
      float along = 0.f;
      if (!norm_was_clamped(inv))
        for (index_t p = 0; p < d; ++p) along += hr[p] * inv * ghr[p];
      for (index_t p = 0; p < d; ++p) ghr[p] = inv * (ghr[p] - along * hr[p] * inv);
    }
  });
  if (!upstream) return;

  // One contribution g_e * h_r (and g_e for the bias, as an extra column) per entry.
  const index_t dv = bias ? d + 1 : d;
  floats contrib(static_cast<std::size_t>(nnz * dv), ex);
  float* cv = raw(contrib);
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float* hr = h + r * d;
    for (index_t e = off[r]; e < off[r + 1]; ++e) {
      float* c = cv + e * dv;
      if (margin) {  // dloss/dw = (dloss/dw^ - w^ <w^, dloss/dw^>) / |w|, dloss/dw^ = dloss/dcos h^, <w^, h^> = cos
        const T* wr = w.row(ids[e]);
        const float hi = hinv[r], wi = winv[e], along = norm_was_clamped(wi) ? 0.f : cosv[e] * wi;
        for (index_t p = 0; p < d; ++p) c[p] = s[e] * (hr[p] * hi - along * to_float(wr[p]));
      } else {
        for (index_t p = 0; p < d; ++p) c[p] = s[e] * hr[p];
      }
      if (dv > d) c[d] = s[e];
    }
  });
  floats sums(0, ex);  // sized by sparse_accumulate
  g->dim = d;
  sparse_accumulate(ex, ids, nnz, cv, dv, g->rows, sums);
  const index_t n = static_cast<index_t>(g->rows.size());
  g->values.resize(static_cast<std::size_t>(n * d));
  g->bias_values.resize(bias ? static_cast<std::size_t>(n) : 0);
  float* gv = raw(g->values);
  float* gb = bias ? raw(g->bias_values) : nullptr;
  const float* sv = raw(sums);
  XSOFTMAX_PARALLEL_FOR(ex, n, i, {
    for (index_t p = 0; p < d; ++p) gv[i * d + p] = sv[i * dv + p];
    if (gb) gb[i] = sv[i * dv + d];
  });
}

}  // namespace xsoftmax::detail
