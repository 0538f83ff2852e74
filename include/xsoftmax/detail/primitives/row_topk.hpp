// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Running top-k per row over column chunks: each row keeps a min-heap of its k best (score, column)
/// pairs, so a row's candidates never exceed k however many classes stream past.

#include <xsoftmax/detail/primitives/parallel_for.hpp>

#include <algorithm>
#include <limits>
#include <vector>

namespace xsoftmax::detail {

/// Top-k buffers of `rows` rows: row r's heap is entries [r * k, r * k + size[r]).
struct row_topk_state {
  index_t k = 0;
  std::vector<float> score;
  std::vector<index_t> index;
  std::vector<index_t> size;

  row_topk_state(index_t rows, index_t k_)
      : k(k_), score(static_cast<std::size_t>(rows * k_)), index(static_cast<std::size_t>(rows * k_)),
        size(static_cast<std::size_t>(rows), 0) {}
};

/// Heap order: the worst entry on top; ties broken towards the larger index being worse, so results
/// are deterministic and equal to a stable sort by (score desc, index asc).
inline bool topk_better(float sa, index_t ia, float sb, index_t ib) {
  return sa > sb || (sa == sb && ia < ib);
}

/// Offers scores `s` (rows x cols, leading dimension `lds`) whose column j is candidate `id_of(j)`
/// (any ids, in any order: ties are broken by id, so the kept set does not depend on the order).
template <class Policy, class IdOf>
void row_topk_update_by(const Policy& policy, const float* s, index_t rows, index_t cols, index_t lds,
                        IdOf id_of, row_topk_state& st) {
  float* sc = st.score.data();
  index_t* ix = st.index.data();
  index_t* sz = st.size.data();
  const index_t k = st.k;
  parallel_for(policy, rows, [=](index_t r) {
    float* hs = sc + r * k;
    index_t* hi = ix + r * k;
    index_t n = sz[r];
    // Sift-down / sift-up on a k-entry binary heap whose root is the worst kept entry.
    auto worse = [&](index_t a, index_t b) { return topk_better(hs[b], hi[b], hs[a], hi[a]); };
    auto sift_down = [&](index_t p) {
      for (;;) {
        index_t w = p, l = 2 * p + 1, rr = l + 1;
        if (l < n && worse(l, w)) w = l;
        if (rr < n && worse(rr, w)) w = rr;
        if (w == p) return;
        std::swap(hs[p], hs[w]);
        std::swap(hi[p], hi[w]);
        p = w;
      }
    };
    const float* row = s + r * lds;
    for (index_t j = 0; j < cols; ++j) {
      const float v = row[j];
      const index_t c = id_of(j);
      if (n < k) {
        index_t p = n++;
        hs[p] = v;
        hi[p] = c;
        while (p > 0 && worse(p, (p - 1) / 2)) {
          std::swap(hs[p], hs[(p - 1) / 2]);
          std::swap(hi[p], hi[(p - 1) / 2]);
          p = (p - 1) / 2;
        }
      } else if (topk_better(v, c, hs[0], hi[0])) {
        hs[0] = v;
        hi[0] = c;
        sift_down(0);
      }
    }
    sz[r] = n;
  });
}

/// Offers scores `s` (rows x cols, leading dimension `lds`) of columns [col_offset, +cols).
template <class Policy>
void row_topk_update(const Policy& policy, const float* s, index_t rows, index_t cols, index_t lds,
                     index_t col_offset, row_topk_state& st) {
  row_topk_update_by(policy, s, rows, cols, lds, [=](index_t j) { return col_offset + j; }, st);
}

/// Offers scores `s` (rows x cols, leading dimension `lds`) whose column j is candidate `col_ids[j]`
/// (a gathered, non-contiguous set of classes: IVF lists, active sets).
template <class Policy>
void row_topk_update_ids(const Policy& policy, const float* s, index_t rows, index_t cols, index_t lds,
                         const index_t* col_ids, row_topk_state& st) {
  row_topk_update_by(policy, s, rows, cols, lds, [=](index_t j) { return col_ids[j]; }, st);
}

/// Sorts every row's kept entries best first.
template <class Policy>
void row_topk_finish(const Policy& policy, index_t rows, row_topk_state& st) {
  float* sc = st.score.data();
  index_t* ix = st.index.data();
  const index_t* sz = st.size.data();
  const index_t k = st.k;
  parallel_for(policy, rows, [=](index_t r) {
    std::vector<std::pair<float, index_t>> e(static_cast<std::size_t>(sz[r]));
    for (index_t i = 0; i < sz[r]; ++i) e[i] = {sc[r * k + i], ix[r * k + i]};
    std::sort(e.begin(), e.end(), [](const auto& a, const auto& b) {
      return topk_better(a.first, a.second, b.first, b.second);
    });
    for (index_t i = 0; i < sz[r]; ++i) {
      sc[r * k + i] = e[i].first;
      ix[r * k + i] = e[i].second;
    }
  });
}

}  // namespace xsoftmax::detail
