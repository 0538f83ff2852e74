// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Softmax cross-entropy of packed rows over one contiguous block of weight rows, with its
/// gradients, never holding more than rows x chunk scores: pass 1 folds score chunks into an online
/// log-sum-exp; pass 2 recomputes each chunk (or takes it from the score cache: see
/// `dense_softmax_args::score_cache_bytes`), turns it into dLoss/dscore in place and produces the
/// chunk's hidden- and weight-gradient contributions. The exact full softmax is this primitive over
/// all classes; the hierarchical softmax uses it for every node run scored through a GEMM; the
/// selective softmax uses it over a gathered set of classes with per-column logit offsets. With a
/// margin (ArcFace / CosFace), the rows are normalised once, each chunk's weight rows' norms are
/// taken from the fp32 rows the GEMM reads, and the scores become margin logits before any offset.

#include <xsoftmax/detail/primitives/angular_margin.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/exp_rows.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/kept_columns.hpp>
#include <xsoftmax/detail/primitives/online_logsumexp.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/error.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

namespace xsoftmax::detail {

/// Each row's statistics after the first pass over a block, in the execution's memory: the online
/// log-sum-exp state (running max, sum of exp(score - max)), the target's score (0 where the target
/// is outside the block) and, with label smoothing, the sum and count of finite scores (else null).
struct dense_row_statistics {
  float* max = nullptr;
  float* sum = nullptr;
  float* target_logit = nullptr;
  float* finite_sum = nullptr;
  index_t* finite_count = nullptr;
  index_t rows = 0;
};

/// One dense softmax problem: rows of `h` against weight rows [first, first + n).
struct dense_softmax_args {
  matrix_view<const float> h;        ///< rows x d, packed fp32
  const index_t* target = nullptr;   ///< rows; column of each row's target in [0, n)
  index_t first = 0;                 ///< first weight row of the block
  index_t n = 0;                     ///< weight rows in the block
  index_t chunk = 0;                 ///< columns scored at a time (> 0)
  float* loss = nullptr;             ///< rows; receives += logsumexp - target score
  const float* upstream = nullptr;   ///< rows; dLoss/dloss_r. Null: forward only
  float* grad_h = nullptr;           ///< rows x d (stride d); receives += G * W_block
  float* grad_w = nullptr;           ///< n x d (stride d); overwritten with G^T * H
  /// Instead of grad_w (which is then null): n x d (stride d) in the weights' storage type T (bf16
  /// or fp16, never float), each element rounded from its fp32 value once per call (a later row
  /// block: from the stored value plus its block's fp32 sum). Type-erased: the args are untyped.
  void* grad_w_storage = nullptr;
  float* grad_b = nullptr;           ///< n; overwritten with the column sums of G (may be null)
  /// grad_w and grad_b receive += instead of being overwritten (a later block of rows).
  bool accumulate_weight_gradient = false;
  /// Backward only: rows solved in blocks of at most this many (0: all at once). Each block is a
  /// complete softmax over the n columns (its own log-sum-exp, loss and grad_h rows); its weight and
  /// bias gradients are added to the previous blocks'. The point: a score cache of
  /// row_block x n x 4 bytes then keeps every score of a block, so pass 2 recomputes no chunk (one
  /// GEMM of 2 x rows x n x d FLOPs saved), at the price of one more read and write of the n x d
  /// fp32 weight gradient per extra block. The sums over rows are grouped by block: the weight
  /// gradients are within rounding (not bitwise) of those of one block.
  index_t row_block = 0;
  /// Optional: column j is weight row `columns[j]` instead of `first + j` (strictly ascending; a
  /// chunk whose rows are contiguous is read in place, any other is gathered into fp32 first).
  const index_t* columns = nullptr;
  /// Optional, n entries each: added to column j's score when it is not / is the row's target
  /// (-inf removes the column from that row's softmax; every row's target offset must be finite).
  const float* negative_offset = nullptr;
  const float* target_offset = nullptr;
  /// Loss terms (see `loss_options`): label smoothing over the row's finite-score columns, z-loss.
  float label_smoothing = 0.f;
  float z_loss = 0.f;
  /// Optional, class weights with label smoothing (PyTorch's formula, see `loss_options::class_weight`):
  /// `class_weight[c]` for every weight row c (column j's is that of its weight row, `first + j` or
  /// `columns[j]`) and `row_weight[r]`, row r's target's weight. Row r's loss is then
  ///   rho_r ((1 - eps) (lse - s_t) + z lse^2) + eps / n_r sum_j w_j (lse - s_j)
  /// over its n_r finite-score columns, and `upstream` must not include rho_r. Both null: rho = w = 1
  /// (the caller weighs the losses and upstream gradients, if at all).
  const float* class_weight = nullptr;
  const float* row_weight = nullptr;
  /// Bytes of pass-1 scores that may be kept for pass 2 (backward only; 0: none). Chunks are kept in
  /// order while each fits what is left of the budget (rows x chunk x 4 bytes each); pass 2 takes a
  /// kept chunk's scores instead of recomputing them, with the same GEMM and chunking, so the results
  /// are bitwise those of no cache. When every chunk is kept, no rows x chunk work buffer is needed.
  index_t score_cache_bytes = 0;
  /// Optional (class-sharded heads): called once between the two passes; replaces the block's row
  /// statistics by those of every class (all-reduces over the ranks that hold the other blocks).
  std::function<void(const dense_row_statistics&)> combine_rows;
  /// Logit soft-capping (see `loss_options::softcap`): c > 0 makes every score c tanh(s / c) before
  /// the offsets are added; 0: none.
  float softcap = 0.f;
  /// Gradient filtering (see `loss_options::gradient_filter`): f > 0 takes every entry of G with
  /// |G_rj| < f |u_r rho_r| as 0 (u: `upstream`, rho: `row_weight` or 1); 0: none. Backward only.
  float gradient_filter = 0.f;
  [[nodiscard]] bool plain_loss() const {
    return label_smoothing == 0.f && z_loss == 0.f && softcap == 0.f && class_weight == nullptr;
  }
  /// Optional additive margin on normalised rows and weights (see `margin_options`); the bias must
  /// be null with one. The loss terms and offsets then apply to the margin logits.
  margin_options margin = {};
  /// Optional: a second reader of pass 1's scores, called once a chunk with its final scores (rows x
  /// cn, stride cn, columns c0 ...; soft-capped, with margins and offsets) before the log-sum-exp
  /// reads them. The full softmax's `forward_topk` keeps its top-k here: one GEMM for both. Not with
  /// row blocks (a block's rows would start at its own row 0).
  std::function<void(index_t c0, index_t cn, const float* s)> observe_scores;
  /// Optional, rows: receives each row's log-sum-exp over the block (after `combine_rows`).
  float* row_lse = nullptr;
};

/// Default columns per chunk for `rows` rows: about 32 MiB of fp32 scores, large enough for the
/// GEMM to run near its peak, small enough to stay cache-friendly between the score and gradient GEMMs.
[[nodiscard]] inline index_t default_chunk_columns(index_t rows) {
  return std::clamp<index_t>((index_t(8) << 20) / std::max<index_t>(rows, 1), 256, 16384);
}

/// A backend's tuned kernels of the dense softmax for storage type T, when it has them: specialised
/// with `available = true`, `applies(args)` (the problems they serve: at most the plain loss, with
/// or without gathered columns and logit offsets) and, per call, an object built by `(ex, args, chunk)` with
///   void scores(w, bias, c0, cn, float* s);  // s (rows x cn) = H W_chunk^T + bias_chunk, chunk c0's
///                                     // columns (weight rows first + c0 ..., or columns[c0 ...])
///   void backward(w, c0, cn, float* s, const float* lse);  // chunk c0's scores -> G in place;
///                                     // grad_h += G W_chunk, grad_w[c0 : c0 + cn] = G^T H (args')
/// Everything else (chunking, score cache, log-sum-exp, loss, bias gradient) stays the generic
/// algorithm's. The generic kernels (weight rows widened to fp32, the backend's fp32 GEMM) are their
/// oracle: `dense_softmax_generic` never uses the tuned ones.
template <class Backend, class T>
struct dense_softmax_tuning {
  static constexpr bool available = false;
};

/// The dense softmax: solves `a` (see `dense_softmax_args`) on `ex` (an execution, or a Thrust host
/// policy); every pointer of `a` is in the execution's memory. `w`/`bias` hold the weights in
/// storage type `T`. With `Tuned`, the backend's tuned kernels when it has them for T and `a`.
template <bool Tuned, class Ex, class T>
void dense_softmax_solve(const Ex& ex_in, matrix_view<const T> w, const T* bias, const dense_softmax_args& a);

/// Where pass 1 keeps the scores of `rows` rows of `a` in chunks of `chunk` columns: the first
/// `kept` chunks (in order) whose scores fit the budget, `kept_floats` in all, in the cache; every
/// other chunk in one rows x chunk work buffer of `work_floats` (none when all are kept).
struct score_cache_plan {
  index_t kept = 0, kept_floats = 0, work_floats = 0;
  [[nodiscard]] index_t floats() const { return kept_floats + work_floats; }
};

[[nodiscard]] inline score_cache_plan plan_score_cache(const dense_softmax_args& a, index_t rows, index_t chunk) {
  score_cache_plan p;
  const index_t chunks = chunk > 0 ? (a.n + chunk - 1) / chunk : 0;  // none for an empty block
  if (a.upstream && a.score_cache_bytes > 0) {
    const index_t budget = a.score_cache_bytes / static_cast<index_t>(sizeof(float));
    while (p.kept < chunks) {
      const index_t next = rows * std::min(chunk, a.n - p.kept * chunk);
      if (p.kept_floats + next > budget) break;
      p.kept_floats += next, ++p.kept;
    }
  }
  p.work_floats = p.kept < chunks ? rows * chunk : 0;
  return p;
}

/// Solves `a` for all its rows together (`a.row_block` aside): see `dense_softmax_solve`. `memory`:
/// at least `plan_score_cache(a, rows, chunk).floats()` floats for the score cache and work buffer
/// (null: allocated here).
template <bool Tuned, class Ex, class T>
void dense_softmax_rows(const Ex& ex_in, matrix_view<const T> w, const T* bias, const dense_softmax_args& a,
                        float* memory = nullptr);

/// Solves `a` with the backend's tuned kernels when it has them for T and this problem.
template <class Ex, class T>
void dense_softmax(const Ex& ex, matrix_view<const T> w, const T* bias, const dense_softmax_args& a) {
  dense_softmax_solve<true>(ex, w, bias, a);
}

/// Solves `a` with the generic kernels only (the tuned ones' oracle).
template <class Ex, class T>
void dense_softmax_generic(const Ex& ex, matrix_view<const T> w, const T* bias, const dense_softmax_args& a) {
  dense_softmax_solve<false>(ex, w, bias, a);
}

/// One chunk of pass 2 in the exponential form (see `dense_softmax_rows`): its scores `s` (rows x
/// cn; the exponentials e^(s - shift_r) already when kept, the recomputed scores otherwise), its
/// first column `c0`, each row's shift and log-sum-exp, and the chunk's fp32 weight rows (widened
/// from bf16/fp16 when `low_precision_weights`).
struct exp_form_chunk {
  float* s;
  index_t c0, cn;
  bool recomputed;
  const float* shift;
  const float* lse;
  matrix_view<const float> w;
  bool low_precision_weights;
  float* grad_w;    ///< the chunk's cn x d weight-gradient rows
  bool accumulate;  ///< grad_w receives += (a later row block) instead of =
};
/// Its per-chunk buffers: a_r (rows), E W and a H (rows x d each).
struct exp_form_buffers {
  float* row_scale;
  float* exp_times_w;
  float* scaled_h;
};

/// Pass 2 of chunk `c` in the exponential form (host backends): grad_h += a (E W) - u w_t,
/// grad_w[c0 : c0 + cn] (+)= E^T (a H) - [t] u h and grad_b likewise, with a_r = u_r e^(shift_r -
/// lse_r): the sums of dloss/ds_j = a_r e_j - u_r [j = t_r] without forming them. Rows that share a
/// target subtract in row order (a fixed order at every thread count).
template <class Ex>
void exp_form_backward(const Ex& ex, const exp_form_chunk& c, const exp_form_buffers& b, const dense_softmax_args& a) {
  const index_t rows = a.h.rows, d = a.h.cols, c0 = c.c0, cn = c.cn;
  float* s = c.s;
  const float* m = c.shift;
  const float* l = c.lse;
  const float* u = a.upstream;
  const index_t* t = a.target;
  if (c.recomputed) {  // e^(s - shift), as pass 1 left a kept chunk (0 in a row with no finite score)
    XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
      float* sr = s + r * cn;
      if (m[r] == -INFINITY) {
        for (index_t j = 0; j < cn; ++j) sr[j] = 0.f;
      } else {
        exp_shifted_scaled(sr, cn, m[r], 1.f);
      }
    });
  }
  // a_r and a H, a task per row
  float* scale = b.row_scale;
  const float* h = a.h.data;
  const index_t hs = a.h.stride;
  float* ah = b.scaled_h;
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    const float ar = u[r] * fast_exp(m[r] - l[r]);
    scale[r] = ar;
    for (index_t p = 0; p < d; ++p) ah[r * d + p] = ar * h[r * hs + p];
  });

  const float* wd = c.w.data;
  const index_t ws = c.w.stride;
  host::gemm_args ew;  // E W: rows x d = E (rows x cn) W (cn x d)
  ew.m = rows, ew.n = d, ew.k = cn, ew.a = s, ew.lda = cn, ew.b = wd, ew.ldb = ws;
  ew.beta = 0.f, ew.c = b.exp_times_w, ew.ldc = d;
  ew.low_precision_inputs = c.low_precision_weights;
  gemm(ex, ew);
  host::gemm_args dw;  // grad_w[c0 : c0 + cn] (+)= E^T (cn x rows) (a H) (rows x d)
  dw.op_a = host::op::transpose;
  dw.m = cn, dw.n = d, dw.k = rows, dw.a = s, dw.lda = cn, dw.b = ah, dw.ldb = d;
  dw.beta = c.accumulate ? 1.f : 0.f;
  dw.c = c.grad_w, dw.ldc = d;
  gemm(ex, dw);

  // The target terms, a task per feature p (rows in order: rows that share a target subtract in a
  // fixed order): grad_h[r][p] += a_r (E W)[r][p] - u_r w_t[p], grad_w[t][p] -= u_r h_r[p].
  const float* e_w = b.exp_times_w;
  float* gh = a.grad_h;
  float* gw = c.grad_w;
  XSOFTMAX_PARALLEL_FOR(ex, d, p, {
    for (index_t r = 0; r < rows; ++r) {
      const index_t tj = t[r] - c0;
      const bool here = tj >= 0 && tj < cn;
      gh[r * d + p] += scale[r] * e_w[r * d + p] - (here ? u[r] * wd[tj * ws + p] : 0.f);
      if (here) gw[tj * d + p] -= u[r] * h[r * hs + p];
    }
  });
  if (a.grad_b) {
    float* gb = a.grad_b + c0;
    const bool accumulate = a.accumulate_weight_gradient;
    XSOFTMAX_PARALLEL_FOR(ex, cn, j, {
      float acc = 0.f;  // rows in fixed order: deterministic
      for (index_t r = 0; r < rows; ++r) acc += scale[r] * s[r * cn + j] - (t[r] - c0 == j ? u[r] : 0.f);
      gb[j] = accumulate ? gb[j] + acc : acc;
    });
  }
}

template <bool Tuned, class Ex, class T>
void dense_softmax_solve(const Ex& ex_in, matrix_view<const T> w, const T* bias, const dense_softmax_args& a) {
  const index_t rows = a.h.rows, block = a.row_block;
  if (!a.upstream || block <= 0 || block >= rows) {  // a forward pass keeps no score: nothing to gain
    dense_softmax_rows<Tuned>(ex_in, w, bias, a);
    return;
  }
  expects(!a.observe_scores, "dense_softmax: observe_scores is not offered with row blocks");
  // One score cache and work buffer for every block (the largest block's, or the last's, which may
  // keep more chunks): allocated per block, a host cache of hundreds of MiB would be page-faulted
  // in again by each block.
  const auto& ex = as_execution(ex_in);
  using backend_type = typename std::decay_t<decltype(ex)>::backend;
  const index_t chunk = std::min(a.chunk, a.n), last = rows - (rows - 1) / block * block;
  const index_t floats = std::max(plan_score_cache(a, block, chunk).floats(), plan_score_cache(a, last, chunk).floats());
  scratch_buffer<backend_type, float> memory(static_cast<std::size_t>(floats), ex);
  dense_softmax_args b = a;
  for (index_t r0 = 0; r0 < rows; r0 += block) {
    const index_t rn = std::min(block, rows - r0);
    b.h = matrix_view<const float>(a.h.row(r0), rn, a.h.cols, a.h.stride);
    b.target = a.target + r0;
    b.loss = a.loss + r0;
    b.upstream = a.upstream + r0;
    b.row_weight = a.row_weight ? a.row_weight + r0 : nullptr;
    b.grad_h = a.grad_h ? a.grad_h + r0 * a.h.cols : nullptr;
    b.row_lse = a.row_lse ? a.row_lse + r0 : nullptr;
    b.accumulate_weight_gradient = a.accumulate_weight_gradient || r0 > 0;
    b.row_block = 0;
    dense_softmax_rows<Tuned>(ex_in, w, bias, b, memory.data());
  }
}

/// out[i] = g[i] rounded to T, or out[i] + g[i] when `accumulate` (a chunk of a weight gradient
/// in the storage type: rounded once per row block).
template <class T>
struct round_gradient_rows {
  const float* g;
  T* out;
  bool accumulate;
  XSOFTMAX_HD void operator()(index_t i) const {
    out[i] = from_float<T>(accumulate ? to_float(out[i]) + g[i] : g[i]);
  }
};

/// out[2 c], out[2 c + 1] = column[c chunk], column[min((c + 1) chunk, n) - 1].
struct chunk_end_columns {
  const index_t* column;
  index_t n, chunk;
  index_t* out;
  XSOFTMAX_HD void operator()(index_t c) const {
    const index_t first = c * chunk, last = first + chunk < n ? first + chunk - 1 : n - 1;
    out[2 * c] = column[first], out[2 * c + 1] = column[last];
  }
};

/// Every chunk's first and last id of `column` (n ids in the execution's memory), on the host: one
/// copy back.
template <class Ex>
std::vector<index_t> chunk_first_and_last(const Ex& ex, const index_t* column, index_t n, index_t chunk,
                                          index_t chunks) {
  using backend = typename Ex::backend;
  scratch_buffer<backend, index_t> ends(2 * static_cast<std::size_t>(chunks), ex);
  parallel_for(ex, chunks, chunk_end_columns{column, n, chunk, ends.data()});
  std::vector<index_t> host(ends.size());
  Ex::ops::copy(ex.res, host.data(), ends.data(), static_cast<index_t>(host.size()));
  return host;
}

template <bool Tuned, class Ex, class T>
void dense_softmax_rows(const Ex& ex_in, matrix_view<const T> w, const T* bias, const dense_softmax_args& a,
                        float* memory) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  // Every buffer of the call is scratch (never value-initialised; filled where it is accumulated into).
  using backend = typename execution_type::backend;
  using fvector = scratch_vector<backend, float>;
  const auto floats = [&](std::size_t n) { return fvector(n, ex); };
  const auto zeros = [&](std::size_t n) { return fvector(n, ex, 0.f); };
  const index_t rows = a.h.rows, d = a.h.cols;
  // An empty block still takes part in `combine_rows` (a rank with no class of a sharded active set).
  if (rows == 0 || (a.n == 0 && !a.combine_rows)) return;
  const index_t chunk = std::min(a.chunk, a.n);

  // The backend's tuned kernels when it has them for this problem (see `dense_softmax_tuning`).
  using tuning = dense_softmax_tuning<typename execution_type::backend, T>;
  constexpr bool has_tuned = Tuned && tuning::available;
  std::optional<tuning> tg;
  if constexpr (has_tuned) {
    if (tuning::applies(a)) tg.emplace(ex, a, chunk);
  }

  // The score cache: the first chunks (in order) whose scores fit the budget, pass 1 writing them in
  // place; the work buffer (after the cache) holds every other chunk, and is not needed when all
  // are kept. Written by pass 1's GEMMs (beta = 0) before anything reads them: no value-initialisation.
  const score_cache_plan plan = plan_score_cache(a, rows, chunk);
  const index_t kept = plan.kept;
  scratch_buffer<backend, float> own(memory ? 0 : static_cast<std::size_t>(plan.floats()), ex);
  float* const cache = memory ? memory : own.data();
  float* const scores = cache + plan.kept_floats;
  fvector scratch = floats(0), gathered = floats(0), gathered_bias = floats(0);  // sized per chunk
  // Where chunk c0's scores live: kept chunk k at rows * chunk * k in the cache (all but the last
  // chunk are full, and a kept last chunk is last in the cache), the others in the work buffer.
  auto chunk_scores = [&](index_t c0) { return c0 / chunk < kept ? cache + rows * c0 : scores; };

  // A margin scores the normalised rows (normalised once here) against each chunk's weight rows,
  // then divides column j by |w_j|; the target's cosine is kept for the backward slope.
  const bool margin = a.margin.enabled();
  const margin_logits ml = make_margin_logits(a.margin);
  const std::size_t margin_rows = margin ? static_cast<std::size_t>(rows) : 0;
  fvector unit_h = floats(margin_rows * static_cast<std::size_t>(d)), h_inverse_norm = floats(margin_rows),
          target_cos = zeros(margin_rows), w_inverse_norm = floats(margin ? static_cast<std::size_t>(chunk) : 0),
          grad_unit_h = zeros(unit_h.size());
  float* hinv = raw(h_inverse_norm);
  float* tcos = raw(target_cos);
  float* winv = raw(w_inverse_norm);
  if (margin) normalize_rows(ex, a.h, raw(unit_h), hinv);
  const matrix_view<const float> hv = margin ? matrix_view<const float>(raw(unit_h), rows, d) : a.h;

  // Scores of columns [c0, c0 + cn) into `s` (with the optional logit offsets); returns the fp32
  // weight rows used, for the backward GEMMs. Without `s` (a kept chunk in pass 2) only those rows
  // (and, with a margin, their inverse norms) are produced, exactly as when scoring.
  const index_t* col = a.columns;
  // Gathered columns on the generic path: every chunk's first and last column id, read back once for
  // both passes (a contiguous block of rows is read in place: the columns are strictly ascending, so
  // a chunk is contiguous when its last id is its first + cn - 1). Were two reads a chunk a pass.
  const index_t chunk_count = chunk > 0 ? (a.n + chunk - 1) / chunk : 0;  // (an empty sharded block: none)
  const std::vector<index_t> chunk_ends =
      tg || !col ? std::vector<index_t>() : chunk_first_and_last(ex, col, a.n, chunk, chunk_count);
  auto score_chunk = [&](index_t c0, index_t cn, float* s) {
    matrix_view<const float> wf;
    const std::size_t k = 2 * static_cast<std::size_t>(c0 / chunk);
    const index_t first_row = tg || !col ? a.first + c0 : chunk_ends[k];
    if (tg) {  // the tuned kernels read (or gather) the weight rows themselves: `wf` stays empty
      if constexpr (has_tuned) {
        if (s) tg->scores(w, bias, c0, cn, s);
      }
    } else if (!col || chunk_ends[k + 1] - first_row == cn - 1) {
      wf = s ? dense_scores(ex, hv, w, bias, first_row, cn, s, cn, scratch)
             : rows_as_float(ex, w, first_row, cn, scratch);
    } else {  // gather the chunk's rows (widened to fp32) into one block
      gathered.resize(static_cast<std::size_t>(cn * d));
      float* g = raw(gathered);
      XSOFTMAX_PARALLEL_FOR_2D(ex, cn, d, j, p, { g[j * d + p] = to_float(w.row(col[c0 + j])[p]); });
      float* gb = nullptr;
      if (bias && s) {
        gathered_bias.resize(static_cast<std::size_t>(cn));
        gb = raw(gathered_bias);
        XSOFTMAX_PARALLEL_FOR(ex, cn, j, { gb[j] = to_float(bias[col[c0 + j]]); });
      }
      wf = matrix_view<const float>(g, cn, d);
      if (s) dense_scores(ex, hv, wf, static_cast<const float*>(gb), 0, cn, s, cn, scratch);
    }
    if (margin) row_inverse_norms(ex, wf, winv);
    if (!s) return wf;
    // On a device these element-wise passes over the chunk run a thread per element (a thread per
    // row walking thousands of columns took 0.7 ms a chunk on an H200: bench/RESULTS.md); on the
    // host a task per row.
    if (margin) {
      const index_t* t = a.target;
      XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
        float* sr = s + r * cn;
        const float cosine = sr[j] * winv[j];
        if (j == t[r] - c0) {
          tcos[r] = cosine;
          sr[j] = ml.target_logit(cosine);
        } else {
          sr[j] = ml.scale * cosine;
        }
      });
    }
    if (a.softcap > 0.f) {
      const float cap = a.softcap, inverse = 1.f / a.softcap;
      XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
        float* e = s + r * cn + j;
        *e = cap * ::tanhf(*e * inverse);
      });
    }
    if (a.negative_offset || a.target_offset) {
      const float* no = a.negative_offset;
      const float* to = a.target_offset;
      const index_t* t = a.target;
      XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
        const float* o = c0 + j == t[r] ? to : no;
        if (o) s[r * cn + j] += o[c0 + j];
      });
    }
    return wf;
  };

  // The exponential form of the backward (host backends; the plain loss without a margin): pass 1
  // leaves e_j = e^(s_j - m_r) in a kept chunk, m_r being row r's running max then (kept per chunk
  // in `shifts`), and pass 2 takes dloss/ds_j = a_r e_j - u_r [j = t_r], with
  // a_r = u_r e^(m_r - lse_r), inside its GEMMs: grad_h += a (E W) - u w_t and
  // grad_w = E^T (a H) - [t] u h. Why: the gradient's own pass over the chunk (an exponential per
  // score, and a read and write of the chunk) was 4 % of a CPU step at 1e5 classes, while a and the
  // target terms cost rows x d (bench/RESULTS.md, "Full softmax on the CPU: the backward from the
  // kept exponentials"). A recomputed chunk's exponentials are taken against the same m_r, so kept
  // and recomputed chunks give the same bits, as before. Only for at least 64 rows over at least
  // 4 d columns: a hierarchical softmax's nodes (317 columns at d = 256, a few rows a run) took 8 %
  // longer a step with it (its buffers and passes cost more than the exponentials they save;
  // bench/tools/hs_uniform_step.cpp). Not on a device: there the plain loss runs the tuned kernels,
  // and each extra pass would be a kernel launch per chunk, never measured on a GPU.
  // Gradient filtering needs G's entries, which the exponential form never forms.
  const bool exp_form = !runs_on_device<execution_type> && !tg && a.upstream && a.plain_loss() && !margin &&
                        a.gradient_filter == 0.f && rows >= 64 && a.n >= 4 * d;
  const index_t chunks = chunk_count;
  fvector shifts = floats(exp_form ? static_cast<std::size_t>(rows * chunks) : 0);
  auto chunk_shift = [&](index_t c0) { return raw(shifts) + rows * (c0 / chunk); };

  basic_online_lse_state<typename execution_type::backend> lse(rows, ex);
  // Label smoothing needs each row's sum and count of finite scores (masked columns are -inf); with
  // class weights, the weighted sum and the total weight of those columns too.
  const float eps = a.label_smoothing, z = a.z_loss;
  const float* cw = a.class_weight;
  const float* rw = a.row_weight;
  fvector finite_sum = zeros(eps > 0.f ? static_cast<std::size_t>(rows) : 0),
          finite_weight = zeros(cw ? finite_sum.size() : 0);
  scratch_vector<backend, index_t> finite_count(finite_sum.size(), ex, 0);
  float* fs = raw(finite_sum);
  float* fw = raw(finite_weight);
  index_t* fc = raw(finite_count);
  for (index_t c0 = 0; c0 < a.n; c0 += chunk) {
    const index_t cn = std::min(chunk, a.n - c0);
    float* s = chunk_scores(c0);
    score_chunk(c0, cn, s);
    if (a.observe_scores) a.observe_scores(c0, cn, s);
    if (exp_form && c0 / chunk < kept) {
      online_lse_update_keeping_exp(ex, s, rows, cn, cn, c0, a.target, lse, chunk_shift(c0));
    } else {
      online_lse_update(ex, s, rows, cn, cn, c0, a.target, lse);
      if (exp_form) {  // the shift a recomputed chunk's exponentials are taken against in pass 2
        float* m = chunk_shift(c0);
        const float* mx = raw(lse.max);
        XSOFTMAX_PARALLEL_FOR(ex, rows, r, { m[r] = mx[r]; });
      }
    }
    if (eps > 0.f && !cw) {
      XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
        const float* sr = s + r * cn;
        float sum = 0.f;
        index_t count = 0;
        for (index_t j = 0; j < cn; ++j)
          if (sr[j] > -INFINITY) sum += sr[j], ++count;
        fs[r] += sum;
        fc[r] += count;
      });
    } else if (eps > 0.f) {  // column j's weight is its weight row's
      const index_t first = a.first;
      XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
        const float* sr = s + r * cn;
        float sum = 0.f, weight = 0.f;
        index_t count = 0;
        for (index_t j = 0; j < cn; ++j)
          if (sr[j] > -INFINITY) {
            const float wj = cw[col ? col[c0 + j] : first + c0 + j];
            sum += wj * sr[j], weight += wj, ++count;
          }
        fs[r] += sum;
        fw[r] += weight;
        fc[r] += count;
      });
    }
  }
  if (a.combine_rows)
    a.combine_rows(dense_row_statistics{raw(lse.max), raw(lse.sum), raw(lse.target_logit), eps > 0.f ? fs : nullptr,
                                        eps > 0.f ? fc : nullptr, rows});
  scratch_vector<backend, float> row_lse_buffer(a.row_lse ? 0 : static_cast<std::size_t>(rows), ex);
  float* l = a.row_lse ? a.row_lse : raw(row_lse_buffer);
  online_lse_finish(ex, lse, rows, l);
  {
    float* loss = a.loss;
    const float* tl = raw(lse.target_logit);
    if (a.plain_loss()) {
      XSOFTMAX_PARALLEL_FOR(ex, rows, r, { loss[r] += l[r] - tl[r]; });
    } else {
      XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
        const float smooth = eps > 0.f ? eps * (fs[r] / static_cast<float>(fc[r])) : 0.f;
        if (cw) {  // rho ((1 - eps) (lse - s_t) + z lse^2) + eps / n (W lse - sum_j w_j s_j)
          const float rho = rw[r], lr = l[r];
          const float weighted_lse = eps > 0.f ? eps * (fw[r] / static_cast<float>(fc[r])) * lr : 0.f;
          loss[r] += rho * ((1.f - eps) * (lr - tl[r]) + z * lr * lr) + weighted_lse - smooth;
        } else {
          loss[r] += l[r] - (1.f - eps) * tl[r] - smooth + z * l[r] * l[r];
        }
      });
    }
  }
  if (!a.upstream) return;

  // The exponential form's per-chunk buffers: a_r, E W (rows x d) and a H (rows x d).
  const std::size_t exp_form_rows = exp_form ? static_cast<std::size_t>(rows) : 0;
  fvector row_scale = floats(exp_form_rows), exp_times_w = floats(exp_form_rows * static_cast<std::size_t>(d)),
          scaled_h = floats(exp_times_w.size());
  // A weight gradient in the storage type (`grad_w_storage`): the generic kernels produce each
  // chunk's fp32 rows in `chunk_gradient`, then round them into it (the tuned ones write it from
  // their GEMM).
  expects(!a.grad_w_storage || (!std::is_same_v<T, float> && !a.grad_w),
          "dense_softmax: grad_w_storage is for bf16 / fp16 weights, instead of grad_w");
  T* const grad_w_low = static_cast<T*>(a.grad_w_storage);
  fvector chunk_gradient = floats(grad_w_low && !tg ? static_cast<std::size_t>(chunk * d) : 0);
  // Gradient filtering on the generic path: the chunk's kept-column flags (kept_columns.hpp).
  const bool host_filter = !runs_on_device<execution_type> && a.gradient_filter > 0.f && !tg;
  scratch_vector<backend, unsigned char> column_flags(host_filter ? static_cast<std::size_t>(chunk) : 0, ex);
  const auto chunk_grad_w = [&](index_t c0) { return grad_w_low ? raw(chunk_gradient) : a.grad_w + c0 * d; };
  const bool accumulate_chunk = !grad_w_low && a.accumulate_weight_gradient;
  const auto round_chunk_gradient = [&](index_t c0, index_t cn) {
    if (grad_w_low && !tg)
      parallel_for(ex, cn * d, round_gradient_rows<T>{raw(chunk_gradient), grad_w_low + c0 * d,
                                                      a.accumulate_weight_gradient});
  };
  for (index_t c0 = 0; c0 < a.n; c0 += chunk) {
    const index_t cn = std::min(chunk, a.n - c0);
    float* s = chunk_scores(c0);
    const matrix_view<const float> wf = score_chunk(c0, cn, c0 / chunk < kept ? nullptr : s);
    const float* u = a.upstream;
    const index_t* t = a.target;
    const float filter = a.gradient_filter;  // |G_rj| < filter |u_r rho_r|: 0 (none when 0)
    const unsigned char* kept_flags = nullptr;  // set by the host's filtered plain pass as it goes
    if constexpr (!runs_on_device<execution_type>) {
      if (exp_form) {
        exp_form_backward(ex,
                          exp_form_chunk{s, c0, cn, c0 / chunk >= kept, chunk_shift(c0), l, wf,
                                         !std::is_same_v<T, float>, chunk_grad_w(c0), accumulate_chunk},
                          exp_form_buffers{raw(row_scale), raw(exp_times_w), raw(scaled_h)}, a);
        round_chunk_gradient(c0, cn);
        continue;
      }
    }
    if (tg) {  // G in place and both gradient GEMMs
      if constexpr (has_tuned) tg->backward(w, c0, cn, s, l);
    } else if (a.plain_loss()) {
      if constexpr (runs_on_device<execution_type>) {  // a thread per element (see the forward)
        XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
          float* e = s + r * cn + j;
          const float g = fast_exp(*e - l[r]) * u[r] - (j == t[r] - c0 ? u[r] : 0.f);
          *e = ::fabsf(g) < filter * ::fabsf(u[r]) ? 0.f : g;
        });
      } else if (filter > 0.f) {  // filtered: G, the cut and the column flags of the kept-column GEMMs
        // in one pass, a task per block of 64 columns over every row (a flag pass of its own, over
        // the chunk again, column by column, took about as long as G itself: bench/RESULTS.md).
        unsigned char* flags = raw(column_flags);
        kept_flags = flags;
        constexpr index_t width = 64;
        XSOFTMAX_PARALLEL_FOR(ex, (cn + width - 1) / width, b, {
          const index_t j0 = b * width, n = cn - j0 < width ? cn - j0 : width;
          unsigned char any[width] = {};
          for (index_t r = 0; r < rows; ++r) {
            float* sr = s + r * cn + j0;
            exp_shifted_scaled(sr, n, l[r], u[r]);
            const index_t tj = t[r] - c0 - j0;
            if (tj >= 0 && tj < n) sr[tj] -= u[r];
            const float cut = filter * std::fabs(u[r]);
            for (index_t k = 0; k < n; ++k) {
              if (std::fabs(sr[k]) < cut) sr[k] = 0.f;
              any[k] |= sr[k] != 0.f;
            }
          }
          for (index_t k = 0; k < n; ++k) flags[j0 + k] = any[k];
        });
      } else {  // a task per row, its exp loop on 8 lanes (exp_rows.hpp)
        XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
          float* sr = s + r * cn;
          exp_shifted_scaled(sr, cn, l[r], u[r]);
          const index_t tj = t[r] - c0;
          if (tj >= 0 && tj < cn) sr[tj] -= u[r];
        });
      }
    } else {  // dloss/ds_j = p_j (1 + 2 z lse) - (1 - eps) [j = t] - eps / count [s_j finite], and with a
              // cap c, times dcapped/draw = 1 - (capped / c)^2 (capped: the score less its offset).
              // With class weights: p_j (rho (1 - eps + 2 z lse) + eps W / count) - rho (1 - eps) [j = t]
              // - eps w_j / count [s_j finite].
      const float cap = a.softcap;
      const float* no = a.negative_offset;
      const float* to = a.target_offset;
      const index_t first = a.first;
      XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
        float* e = s + r * cn + j;
        const float v = *e, lr = l[r], rho = cw ? rw[r] : 1.f, ur = u[r] * rho;
        const float per_column = eps > 0.f ? eps * u[r] / static_cast<float>(fc[r]) : 0.f;
        const float scale = !cw ? ur * (1.f + 2.f * z * lr)
                                : ur * (1.f - eps + 2.f * z * lr) + (eps > 0.f ? per_column * fw[r] : 0.f);
        const float uniform = cw && eps > 0.f ? per_column * cw[col ? col[c0 + j] : first + c0 + j] : per_column;
        const bool target = j == t[r] - c0;
        float g = v > -INFINITY ? fast_exp(v - lr) * scale - uniform : 0.f;
        if (target) g -= (1.f - eps) * ur;
        if (::fabsf(g) < filter * ::fabsf(ur)) g = 0.f;  // on dloss/dz, z the capped logit
        if (cap > 0.f && v > -INFINITY) {
          const float* o = target ? to : no;
          const float q = (o ? v - o[c0 + j] : v) / cap;
          g *= 1.f - q * q;
        }
        *e = g;
      });
    }
    if (margin) {  // dloss/dcos_j, divided by |w_j|: G W is then dloss/dh^, G^T H^ is dloss/dw^ / |w_j|
      XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cn, r, j, {
        float* e = s + r * cn + j;
        *e *= ml.scale * winv[j];
        if (j == t[r] - c0) *e *= ml.target_slope(tcos[r]) / ml.scale;
      });
    }
    // Gradient filtering: when at most half the chunk's columns keep an entry, both GEMMs run over
    // those columns alone (kept_columns.hpp; not with a margin, whose projection reads every row).
    const bool kept_only = !tg && filter > 0.f && !margin &&
                           backward_kept_columns(ex, s, rows, cn, kept_flags,
                                                 wf, !std::is_same_v<T, float>, hv, a.grad_h, chunk_grad_w(c0),
                                                 accumulate_chunk);
    if (!tg && !kept_only) {
      host::gemm_args dh;  // grad_h += G(rows x cn) * W(cn x d)  (with a margin: dloss/dh^ += ...)
      dh.m = rows, dh.n = d, dh.k = cn, dh.a = s, dh.lda = cn, dh.b = wf.data, dh.ldb = wf.stride;
      dh.beta = 1.f, dh.c = margin ? raw(grad_unit_h) : a.grad_h, dh.ldc = d;
      dh.low_precision_inputs = !std::is_same_v<T, float>;
      gemm(ex, dh);
      host::gemm_args dw;  // grad_w[c0 : c0 + cn] = G^T(cn x rows) * H(rows x d)
      dw.op_a = host::op::transpose;
      dw.m = cn, dw.n = d, dw.k = rows, dw.a = s, dw.lda = cn, dw.b = hv.data, dw.ldb = hv.stride;
      dw.beta = accumulate_chunk ? 1.f : 0.f;
      dw.c = chunk_grad_w(c0), dw.ldc = d;
      gemm(ex, dw);
    }
    // The projection is linear and idempotent: projecting an accumulated gradient again adds this
    // block's projected part to the earlier blocks' (within rounding).
    if (margin) project_weight_gradient(ex, wf, winv, chunk_grad_w(c0));
    round_chunk_gradient(c0, cn);
    if (a.grad_b) {
      float* gb = a.grad_b + c0;
      const bool accumulate = a.accumulate_weight_gradient;
      XSOFTMAX_PARALLEL_FOR(ex, cn, j, {
        float acc = 0.f;  // rows in fixed order: deterministic
        for (index_t r = 0; r < rows; ++r) acc += s[r * cn + j];
        gb[j] = accumulate ? gb[j] + acc : acc;
      });
    }
  }
  if (margin) unnormalize_gradient(ex, rows, d, raw(unit_h), hinv, raw(grad_unit_h), a.grad_h);
}

}  // namespace xsoftmax::detail
