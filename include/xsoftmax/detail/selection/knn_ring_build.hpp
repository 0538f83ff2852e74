// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The exact KNN build of a class-sharded head over a ring (`knn_build_share` with `shift`): each
/// process holds its own weight rows; the processes' blocks travel round the ring (S - 1 steps, one
/// block sent to the next process and one received from the previous per step) and every process
/// scores its own rows against each visiting block, folding the scores into a running top-k per
/// own row. Memory per process: its own rows (widened to fp32), the running top-k of its rows and
/// two visiting blocks, O(N/S x d + N/S x K); never the N x d matrix nor the N x K graph.
///
/// The result equals the unsharded exact build's rows bitwise: both are `exact_knn_rows_of_blocks`
/// (one block, or the blocks of the ring), whose GEMMs are the whole build's whatever the blocks.

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/selection/selection_types.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>

#include <algorithm>
#include <type_traits>
#include <utility>

namespace xsoftmax::detail {

/// A pointer posing as a vector (`.data()`), for `row_topk_rows`.
template <class T>
struct raw_span {
  T* p;
  T* data() const { return p; }
};
/// A top-k state (as `basic_row_topk_state`, which `row_topk_update` and `row_topk_finish` take)
/// over caller arrays: row r's heap is score / index [r * k, r * k + size[r]).
struct row_topk_rows {
  index_t k;
  raw_span<float> score;
  raw_span<index_t> index;
  raw_span<index_t> size;
};
/// The rows from `first` on of `st`.
inline row_topk_rows topk_rows_of(const row_topk_rows& st, index_t first) {
  return {st.k, {st.score.p + first * st.k}, {st.index.p + first * st.k}, {st.size.p + first}};
}

/// out (rows x d fp32) = `w` widened (the ring's transport type).
template <class Ex, class T>
void block_to_float(const Ex& ex, matrix_view<const T> w, float* out) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, w.rows * d, e, { out[e] = to_float(w(e / d, e % d)); });
}
/// out (n elements of T) = `in` (fp32 that came from T: exact).
template <class Ex, class T>
void block_from_float(const Ex& ex, const float* in, index_t n, T* out) {
  XSOFTMAX_PARALLEL_FOR(ex, n, e, { out[e] = from_float<T>(in[e]); });
}

/// out (rows x cols, dense) = `w` (rows `stride` apart).
template <class Ex, class T>
void dense_copy(const Ex& ex, matrix_view<const T> w, std::remove_cv_t<T>* out) {
  const index_t d = w.cols;
  XSOFTMAX_PARALLEL_FOR(ex, w.rows * d, e, { out[e] = w(e / d, e % d); });
}

/// Calls `visit(block, first_class)` for every process's weight block, this process's `local` first,
/// then the blocks of rank - 1, rank - 2, ... as they arrive round the ring (`share.shift`; blocks
/// travel as fp32 and are converted back to T: the views are the original values). Every block is
/// dense (rows `cols` apart).
template <class Ex, class T, class Visit>
void for_each_ring_block(const Ex& ex_in, matrix_view<const T> local, const knn_build_share& share, Visit visit) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t d = local.cols;
  if (local.stride != d) {  // every block visited is dense (rows d apart)
    typename execution_type::template vector<std::remove_cv_t<T>> dense(static_cast<std::size_t>(local.rows * d));
    dense_copy(ex, local, raw(dense));
    for_each_ring_block(ex, matrix_view<const T>(raw(dense), local.rows, d), share, visit);
    return;
  }
  const int size = static_cast<int>(share.bounds.size()) - 1;
  const auto rows_of = [&](int q) {
    return share.bounds[static_cast<std::size_t>(q) + 1] - share.bounds[static_cast<std::size_t>(q)];
  };
  index_t largest = 0;
  for (int q = 0; q < size; ++q) largest = std::max(largest, rows_of(q));
  visit(local, share.first);
  if (size == 1) return;
  // fp32 rows travel as they are; the others as an fp32 copy. Two buffers take
  // turns receiving (the block just received is the next one sent).
  using storage = std::remove_cv_t<T>;
  constexpr bool direct = std::is_same_v<storage, float>;
  typename execution_type::template vector<float> one(static_cast<std::size_t>(largest * d)),
      two(static_cast<std::size_t>(direct && size == 2 ? 0 : largest * d));
  typename execution_type::template vector<storage> block(
      std::is_same_v<storage, float> ? 0 : static_cast<std::size_t>(largest * d));
  const float* sending = nullptr;
  if constexpr (direct) {
    sending = local.data;
  } else {
    block_to_float(ex, local, raw(two));
    sending = raw(two);
  }
  float* receiving = raw(one);
  float* spare = raw(two);
  for (int step = 1; step < size; ++step) {
    const int sent = (share.rank - step + 1 + size) % size, got = (share.rank - step + size) % size;
    const index_t n = rows_of(got);
    share.shift(sending, rows_of(sent) * d, receiving, n * d);
    sending = receiving;
    std::swap(receiving, spare);
    const T* view = nullptr;
    if constexpr (std::is_same_v<storage, float>) {
      view = sending;
    } else {
      block_from_float(ex, sending, n * d, raw(block));
      view = raw(block);
    }
    visit(matrix_view<const T>(view, n, d), share.bounds[static_cast<std::size_t>(got)]);
  }
}

/// The whole N x d matrix assembled from every process's block through the ring (the IVF build
/// needs every vector: N x d x sizeof(T) bytes on every process while it lives).
template <class Ex, class T>
auto ring_gather_weights(const Ex& ex_in, matrix_view<const T> local, const knn_build_share& share) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t d = local.cols;
  typename execution_type::template vector<std::remove_cv_t<T>> all(static_cast<std::size_t>(share.bounds.back() * d));
  for_each_ring_block(ex, local, share, [&](matrix_view<const T> block, index_t first) {
    thrust::copy(ex.policy(), block.data, block.data + block.rows * d, all.begin() + first * d);
  });
  return all;
}

/// The exact KNN rows (own.rows x k ids and similarities, in the execution's memory) of the classes
/// [first, first + own.rows), whose weights are `own`, against all `n` classes, which
/// `for_each_block(visit)` hands over as blocks: `visit(block, first_class)` for blocks (of at most
/// `largest` rows) that together cover [0, n) once. One algorithm for the whole build (one block),
/// a part of it, and the ring.
///
/// Every GEMM is one of the whole build's, of the same shape with each row and column at the same
/// place: tiles of `query_tile` x `class_tile` classes at multiples of the tile sizes; a query tile
/// cut by [first, first + own.rows), or a class tile cut by a block, is padded with zero rows to the
/// whole build's tile and only its real part is offered to the top-k. So every similarity is
/// bitwise the whole build's whatever the GEMM's blocking, and the top-k (ties broken by class id)
/// does not depend on the order of the blocks.
template <class Ex, class T, class ForEachBlock>
void exact_knn_rows_of_blocks(const Ex& ex_in, matrix_view<const T> own, index_t first, index_t n, index_t largest,
                              index_t k, bool cosine, index_t query_tile, index_t class_tile, index_t* ids,
                              float* sims, ForEachBlock for_each_block) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using float_vector = typename execution_type::template vector<float>;
  using storage = std::remove_cv_t<T>;
  const auto policy = ex.policy();
  const index_t d = own.cols, count = own.rows;
  if (count == 0) return;  // no rows (a rank with no class): not even one query tile to score
  const index_t tq = std::min(query_tile, n), tc = std::min(class_tile, n);
  // The whole build's query tiles [q_first, q_end) that hold the rows: one at a time, the rows at
  // their places (fp32, unit length under cosine), the rest zero.
  const index_t q_first = first / tq * tq, q_end = std::min(n, (first + count + tq - 1) / tq * tq);
  float_vector inv_own(static_cast<std::size_t>(cosine ? count : 0)), query(static_cast<std::size_t>(tq * d)),
      inv_block(static_cast<std::size_t>(cosine ? largest : 0)), scores(static_cast<std::size_t>(tq * tc)),
      class_scratch;
  typename execution_type::template vector<storage> class_tile_rows;
  if (cosine) inverse_row_norms(ex, own, raw(inv_own));
  const float* own_scale = cosine ? raw(inv_own) : static_cast<const float*>(nullptr);
  // The running top-k lives in the result arrays (a heap per row until the rows are finished).
  typename execution_type::template vector<index_t> kept(static_cast<std::size_t>(count), 0);
  const row_topk_rows best{k, {sims}, {ids}, {raw(kept)}};
  float* s = raw(scores);
  for_each_block([&](matrix_view<const T> block, index_t b0) {
    const index_t b1 = b0 + block.rows;
    if (cosine) inverse_row_norms(ex, block, raw(inv_block));
    for (index_t qa = q_first; qa < q_end; qa += tq) {
      const index_t qn_whole = std::min(tq, n - qa);
      const index_t r0 = std::max(qa, first), r1 = std::min(qa + tq, first + count);
      if (r1 - r0 != qn_whole) thrust::fill(policy, query.begin(), query.begin() + qn_whole * d, 0.f);
      widen_rows(ex, own, r0 - first, r1 - r0, own_scale, raw(query) + (r0 - qa) * d);
      row_topk_rows rows = topk_rows_of(best, r0 - first);
      for (index_t ca = b0 / tc * tc; ca < b1; ca += tc) {
        const index_t cn_whole = std::min(tc, n - ca), c0 = std::max(ca, b0), cn = std::min(ca + tc, b1) - c0;
        matrix_view<const T> classes(block.row(c0 - b0), cn, d, block.stride);
        if (cn != cn_whole) {  // cut by the block: padded to the whole build's tile
          class_tile_rows.resize(static_cast<std::size_t>(tc * d));
          thrust::fill(policy, class_tile_rows.begin(), class_tile_rows.begin() + cn_whole * d,
                       from_float<storage>(0.f));
          dense_copy(ex, classes, raw(class_tile_rows) + (c0 - ca) * d);
          classes = matrix_view<const T>(raw(class_tile_rows), cn_whole, d);
        }
        dense_scores(ex, matrix_view<const float>(raw(query), qn_whole, d), classes, static_cast<const T*>(nullptr), 0,
                     classes.rows, s, classes.rows, class_scratch);
        // The real part: rows [r0, r1) of the tile, columns [c0, c0 + cn).
        float* part = s + (r0 - qa) * classes.rows + (classes.rows == cn ? 0 : c0 - ca);
        if (cosine) scale_columns(ex, part, r1 - r0, cn, classes.rows, raw(inv_block) + (c0 - b0));
        row_topk_update(ex, part, r1 - r0, cn, classes.rows, c0, rows);
      }
    }
  });
  row_topk_rows rows = best;
  row_topk_finish(ex, count, rows);
}

/// The exact KNN rows (share.count x k ids and similarities, in the execution's memory) of this
/// process's classes [share.first, share.first + share.count), whose weights are `local`, against
/// all N = share.bounds.back() classes, the blocks visiting round the ring.
template <class Ex, class T>
void exact_knn_ring_rows(const Ex& ex, matrix_view<const T> local, const knn_build_share& share, index_t k,
                         bool cosine, index_t query_tile, index_t class_tile, index_t* ids, float* sims) {
  index_t largest = 0;
  for (std::size_t q = 0; q + 1 < share.bounds.size(); ++q)
    largest = std::max(largest, share.bounds[q + 1] - share.bounds[q]);
  exact_knn_rows_of_blocks(ex, local, share.first, share.bounds.back(), largest, k, cosine, query_tile, class_tile,
                           ids, sims, [&](auto visit) { for_each_ring_block(ex, local, share, visit); });
}

}  // namespace xsoftmax::detail
