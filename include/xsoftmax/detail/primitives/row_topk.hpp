// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Running top-k per row over column chunks: each row keeps a binary heap of its k best (score,
/// column) pairs, so a row's candidates never exceed k however many classes stream past. One
/// thread (host) or one device thread (cuda) per row.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <thrust/memory.h>

namespace xsoftmax::detail {

/// Top-k buffers of `rows` rows in `Backend`'s memory: row r's heap is entries [r * k, r * k + size[r]).
template <class Backend>
struct basic_row_topk_state {
  index_t k = 0;
  scratch_vector<Backend, float> score;
  scratch_vector<Backend, index_t> index;
  scratch_vector<Backend, index_t> size;
  /// On any backend: the state in `ex`'s memory, every heap empty.
  basic_row_topk_state(index_t rows, index_t k_, const execution<Backend>& ex)
      : k(k_), score(static_cast<std::size_t>(rows * k_), ex), index(static_cast<std::size_t>(rows * k_), ex),
        size(static_cast<std::size_t>(rows), ex, 0) {}
  /// Host backends only (and host algorithms handed a Thrust host policy).
  basic_row_topk_state(index_t rows, index_t k_)
      : k(k_), score(static_cast<std::size_t>(rows * k_)), index(static_cast<std::size_t>(rows * k_)),
        size(static_cast<std::size_t>(rows), 0) {}
};

/// The state of the host backends (and of host algorithms handed a Thrust host policy).
using row_topk_state = basic_row_topk_state<serial>;

/// The order of results: higher score first, ties towards the smaller index, so results are
/// deterministic and equal to a stable sort by (score desc, index asc).
XSOFTMAX_HD inline bool topk_better(float sa, index_t ia, float sb, index_t ib) {
  return sa > sb || (sa == sb && ia < ib);
}

/// One row's heap (root = the worst kept entry) over arrays `hs` (scores) and `hi` (ids).
struct topk_heap {
  float* hs;
  index_t* hi;
  index_t n;

  XSOFTMAX_HD bool worse(index_t a, index_t b) const { return topk_better(hs[b], hi[b], hs[a], hi[a]); }
  XSOFTMAX_HD void swap(index_t a, index_t b) const {
    const float s = hs[a];
    hs[a] = hs[b];
    hs[b] = s;
    const index_t i = hi[a];
    hi[a] = hi[b];
    hi[b] = i;
  }
  XSOFTMAX_HD void sift_down(index_t p) const {
    for (;;) {
      index_t w = p;
      const index_t l = 2 * p + 1, r = l + 1;
      if (l < n && worse(l, w)) w = l;
      if (r < n && worse(r, w)) w = r;
      if (w == p) return;
      swap(p, w);
      p = w;
    }
  }
  /// Offers (v, c) to a heap that may keep at most k entries.
  XSOFTMAX_HD void offer(float v, index_t c, index_t k) {
    if (n < k) {
      index_t p = n++;
      hs[p] = v;
      hi[p] = c;
      while (p > 0 && worse(p, (p - 1) / 2)) {
        swap(p, (p - 1) / 2);
        p = (p - 1) / 2;
      }
    } else if (topk_better(v, c, hs[0], hi[0])) {
      hs[0] = v;
      hi[0] = c;
      sift_down(0);
    }
  }
  /// Heap sort in place: the worst goes last, so the entries end best first.
  XSOFTMAX_HD void sort_best_first() {
    const index_t total = n;
    while (n > 1) {
      swap(0, n - 1);
      --n;
      sift_down(0);
    }
    n = total;
  }
};

/// `row_topk_update_by`'s generic form (the tuned forms' oracle): one thread per row offers every
/// column in turn.
template <class Ex, class IdOf, class State>
void row_topk_update_generic(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds, IdOf id_of,
                             State& st) {
  float* sc = thrust::raw_pointer_cast(st.score.data());
  index_t* ix = thrust::raw_pointer_cast(st.index.data());
  index_t* sz = thrust::raw_pointer_cast(st.size.data());
  const index_t k = st.k;
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    topk_heap heap{sc + r * k, ix + r * k, sz[r]};
    const float* row = s + r * lds;
    for (index_t j = 0; j < cols; ++j) heap.offer(row[j], id_of(j), k);
    sz[r] = heap.n;
  });
}

/// A backend's tuned `row_topk_update_by` for executions of type `Ex`: `available` when there is
/// one; `update(ex, s, rows, cols, lds, id_of, st)` must keep the same entries (the kept set does
/// not depend on the order of the offers, so any order of offering gives the generic result). The
/// cuda backend's (detail/cuda/topk_tuned.cuh) gives each row a block: a thread per row walking
/// every column took 25 ms for a top-10 over 32768 classes of 1024 rows on an H100
/// (bench/RESULTS.md).
template <class Ex>
struct row_topk_tuning {
  static constexpr bool available = false;
};

/// Offers scores `s` (rows x cols, leading dimension `lds`) whose column j is candidate `id_of(j)`
/// (any ids, in any order: ties are broken by id, so the kept set does not depend on the order).
/// `id_of` must be callable where the execution runs (an `XSOFTMAX_HD` function object).
template <class Ex, class IdOf, class State>
void row_topk_update_by(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds, IdOf id_of,
                        State& st) {
  if constexpr (row_topk_tuning<Ex>::available) row_topk_tuning<Ex>::update(ex, s, rows, cols, lds, id_of, st);
  else row_topk_update_generic(ex, s, rows, cols, lds, id_of, st);
}

/// Column j is class `offset + j`.
struct offset_ids {
  index_t offset;
  XSOFTMAX_HD index_t operator()(index_t j) const { return offset + j; }
};
/// Column j is class `ids[j]`.
struct listed_ids {
  const index_t* ids;
  XSOFTMAX_HD index_t operator()(index_t j) const { return ids[j]; }
};

/// Offers scores `s` (rows x cols, leading dimension `lds`) of columns [col_offset, +cols).
template <class Ex, class State>
void row_topk_update(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds, index_t col_offset,
                     State& st) {
  row_topk_update_by(ex, s, rows, cols, lds, offset_ids{col_offset}, st);
}

/// Offers scores `s` (rows x cols, leading dimension `lds`) whose column j is candidate `col_ids[j]`
/// (a gathered, non-contiguous set of classes: IVF lists, active sets).
template <class Ex, class State>
void row_topk_update_ids(const Ex& ex, const float* s, index_t rows, index_t cols, index_t lds,
                         const index_t* col_ids, State& st) {
  row_topk_update_by(ex, s, rows, cols, lds, listed_ids{col_ids}, st);
}

/// Sorts every row's kept entries best first.
template <class Ex, class State>
void row_topk_finish(const Ex& ex, index_t rows, State& st) {
  float* sc = thrust::raw_pointer_cast(st.score.data());
  index_t* ix = thrust::raw_pointer_cast(st.index.data());
  const index_t* sz = thrust::raw_pointer_cast(st.size.data());
  const index_t k = st.k;
  XSOFTMAX_PARALLEL_FOR(ex, rows, r, {
    topk_heap heap{sc + r * k, ix + r * k, sz[r]};
    heap.sort_best_first();
  });
}

}  // namespace xsoftmax::detail
