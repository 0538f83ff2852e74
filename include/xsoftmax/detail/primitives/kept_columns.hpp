// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Gradient filtering's saving (`dense_softmax_args::gradient_filter`): once a chunk's dloss/dscore
/// G (rows x cn) has its filtered entries at 0, a column with no non-zero entry adds nothing to
/// either gradient GEMM (grad_h += G W, grad_w = G^T H). When at most half a chunk's columns are
/// kept, both GEMMs run over the kept columns alone: their G columns and weight rows gathered, G^T
/// H's rows added into the chunk's weight-gradient rows (zeroed first unless accumulated into). The
/// generic form here (fp32, any backend); the cuda backend's tuned kernels do the same with G and
/// the weights in bf16 / fp16 (detail/cuda/dense_tuned.cuh), sharing these element functors.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/copy.h>
#include <thrust/iterator/counting_iterator.h>

namespace xsoftmax::detail {

/// Whether a column flag is set.
struct is_set {
  XSOFTMAX_HD bool operator()(unsigned char f) const { return f != 0; }
};

/// flags[j] = whether column j of g (rows x cn) has a non-zero entry, a task per column.
struct column_has_nonzero {
  const float* g;
  index_t rows, cn;
  unsigned char* flags;
  XSOFTMAX_HD void operator()(index_t j) const {
    unsigned char any = 0;
    for (index_t r = 0; r < rows && !any; ++r) any = g[r * cn + j] != 0.f;
    flags[j] = any;
  }
};

/// out[r * count + k] = g[r * cn + kept[k]], one element a task: G with its kept columns only.
template <class T>
struct gather_kept_columns {
  const T* g;
  index_t cn;
  const index_t* kept;
  index_t count;
  T* out;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t r = e / count, k = e - r * count;
    out[e] = g[r * cn + kept[k]];
  }
};

/// out[k * d + p] = w[ids[k] * stride + p], one element a task: listed rows of a matrix gathered
/// into a dense one (the kept columns' weight rows; on the cuda tuned path also a chunk's gathered
/// columns and, with d = 1 and stride 1, their bias entries).
template <class T>
struct gather_listed_rows {
  const T* w;
  index_t stride;
  const index_t* ids;
  index_t d;
  T* out;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t k = e / d, p = e - k * d;
    out[e] = w[ids[k] * stride + p];
  }
};

/// out[kept[k] * d + p] += rows[k * d + p] (in fp32, stored as C), one element a task: the kept
/// columns' weight-gradient rows added into the chunk's rows.
template <class C>
struct add_kept_rows {
  const float* rows;
  const index_t* kept;
  index_t d;
  C* out;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t k = e / d, p = e - k * d;
    C& o = out[kept[k] * d + p];
    o = from_float<C>(to_float(o) + rows[e]);
  }
};

/// The ids of the set flags among `cn` (ascending, into `ids`), and their count: on a device one
/// read-back (the count sizes the GEMMs).
template <class Ex>
index_t kept_column_ids(const Ex& ex, const unsigned char* flags, index_t cn, index_t* ids) {
  const auto first = thrust::counting_iterator<index_t>(0);
  return static_cast<index_t>(thrust::copy_if(ex.policy(), first, first + cn, flags, ids, is_set{}) - ids);
}

/// The generic kept-column backward of one chunk (see the file comment): G in `g` (rows x cn, fp32,
/// filtered), its column flags (`flags`: cn, 1 for a column with a non-zero entry; null: taken
/// here, a task per column), the chunk's fp32 weight rows `wc` (`low_precision_weights`: widened from bf16 / fp16,
/// as the caller's GEMMs are told), the rows `h`; grad_h (rows x d) receives += G W; grad_w (the
/// chunk's cn x d rows) = G^T H, or += with `accumulate`. Returns false, doing nothing but flag the
/// columns, when more than half of them are kept (the caller's dense GEMMs are then the cheaper form).
template <class Ex>
bool backward_kept_columns(const Ex& ex, const float* g, index_t rows, index_t cn, const unsigned char* flags,
                           matrix_view<const float> wc, bool low_precision_weights, matrix_view<const float> h,
                           float* grad_h, float* grad_w, bool accumulate) {
  using backend = typename Ex::backend;
  const index_t d = h.cols;
  scratch_vector<backend, unsigned char> own_flags(flags ? 0 : static_cast<std::size_t>(cn), ex);
  if (!flags) parallel_for(ex, cn, column_has_nonzero{g, rows, cn, raw(own_flags)});
  scratch_vector<backend, index_t> ids(static_cast<std::size_t>(cn), ex);
  const index_t count = kept_column_ids(ex, flags ? flags : raw(own_flags), cn, raw(ids));
  if (2 * count > cn) return false;
  if (!accumulate) parallel_for(ex, cn * d, store_zero<float>{grad_w});
  if (count == 0) return true;
  scratch_vector<backend, float> g_kept(static_cast<std::size_t>(rows * count), ex),
      w_kept(static_cast<std::size_t>(count * d), ex), grad_kept(w_kept.size(), ex);
  parallel_for(ex, rows * count, gather_kept_columns<float>{g, cn, raw(ids), count, raw(g_kept)});
  parallel_for(ex, count * d, gather_listed_rows<float>{wc.data, wc.stride, raw(ids), d, raw(w_kept)});
  host::gemm_args dh;  // grad_h += G_kept (rows x count) W_kept (count x d)
  dh.m = rows, dh.n = d, dh.k = count, dh.a = raw(g_kept), dh.lda = count, dh.b = raw(w_kept), dh.ldb = d;
  dh.beta = 1.f, dh.c = grad_h, dh.ldc = d;
  dh.low_precision_inputs = low_precision_weights;
  gemm(ex, dh);
  host::gemm_args dw;  // grad_kept = G_kept^T (count x rows) H (rows x d)
  dw.op_a = host::op::transpose;
  dw.m = count, dw.n = d, dw.k = rows, dw.a = raw(g_kept), dw.lda = count, dw.b = h.data, dw.ldb = h.stride;
  dw.beta = 0.f, dw.c = raw(grad_kept), dw.ldc = d;
  gemm(ex, dw);
  parallel_for(ex, count * d, add_kept_rows<float>{raw(grad_kept), raw(ids), d, grad_w});
  return true;
}

}  // namespace xsoftmax::detail
