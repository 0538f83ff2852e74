// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The search of the IVF KNN-graph build: every vector of an IVF index (in list order) finds its K
/// best among the members of the lists its own list probes. All members of a list share its
/// probes, so list a against probed list b is one GEMM (|a| x |b| scores). The GEMMs of a range of
/// lists (all their probes) are issued from the host as one batch into a bounded score buffer in
/// the execution's memory, each list's GEMMs followed by the pass that folds its members' scores
/// into their heaps (`gemm_groups_then_rows`: one parallel pass per batch, whatever nprobe). The
/// host reads only sizes: the list offsets and the probes (num_lists x nprobe indices).

#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/gemm_batch.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>

#include <thrust/fill.h>

#include <math.h>

#include <vector>

namespace xsoftmax::detail {

/// Offers row r's scores against its list's probed lists to r's heap, probe by probe: r (a vector
/// in list order) belongs to list a = `list_of[r]`, whose block of scores against its probe `slot`
/// starts at `block[(a - first_list) * nprobe + slot]` in `s`.
struct offer_probed_lists {
  const float* s;
  const index_t* block;    ///< per (list of the batch, probe slot): offset of its |a| x |b| block in s
  const index_t* list_of;  ///< N: the list of each vector
  const index_t* probes;   ///< num_lists x nprobe
  const index_t* offsets;  ///< num_lists + 1
  const index_t* list_ids;
  index_t nprobe, first_list, k;
  float* hs;
  index_t* hi;
  index_t* size;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t a = list_of[r];
    topk_heap heap{hs + r * k, hi + r * k, size[r]};
    for (index_t slot = 0; slot < nprobe; ++slot) {
      const index_t b = probes[a * nprobe + slot], first = offsets[b], len = offsets[b + 1] - first;
      const float* row = s + block[(a - first_list) * nprobe + slot] + (r - offsets[a]) * len;
      for (index_t j = 0; j < len; ++j) heap.offer(row[j], list_ids[first + j], k);
    }
    size[r] = heap.n;
  }
};

/// The list of each vector: list_of[r] = a for r in [offsets[a], offsets[a + 1]).
struct mark_list_members {
  const index_t* offsets;
  index_t* list_of;
  XSOFTMAX_HD void operator()(index_t a) const {
    for (index_t r = offsets[a]; r < offsets[a + 1]; ++r) list_of[r] = a;
  }
};

/// Graph row rows[r] (k ids and similarities) from found row r, sorted best first; -1 / -inf past
/// its size[r] candidates (every found row is full when `size` is null). The IVF searches write
/// their heaps to the classes of their lists; a refresh writes the moved classes' exact rows.
struct write_graph_rows {
  const index_t* rows;
  const float* hs;
  const index_t* hi;
  const index_t* size;
  index_t k;
  index_t* ids;
  float* sims;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t c = rows[r];
    for (index_t j = 0; j < k; ++j) {
      const bool have = size == nullptr || j < size[r];
      ids[c * k + j] = have ? hi[r * k + j] : -1;
      sims[c * k + j] = have ? hs[r * k + j] : -INFINITY;
    }
  }
};

/// The graph rows (N x k ids and similarities, in the execution's memory) of the N vectors `lv`
/// (list order; list a is rows [offsets[a], offsets[a + 1]) and holds classes list_ids[...]), each
/// searching the lists probes[a * nprobe .. + nprobe) of its list a. `offsets_host` and
/// `probes_host` are the host copies of `offsets` and `probes`. `max_scores`: the score buffer's
/// size in floats (a batch holds at least one list pair whatever this is).
template <class Ex>
void ivf_list_pair_topk(const Ex& ex_in, matrix_view<const float> lv, const index_t* offsets,
                        const std::vector<index_t>& offsets_host, const index_t* list_ids, const index_t* probes,
                        const std::vector<index_t>& probes_host, index_t nprobe, index_t k, index_t* ids, float* sims,
                        index_t max_scores = index_t(4) << 20) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_vector = typename execution_type::template vector<index_t>;
  const index_t nl = static_cast<index_t>(offsets_host.size()) - 1, n = lv.rows, d = lv.cols;
  basic_row_topk_state<typename execution_type::backend> best(n, k, ex);
  index_vector list_of(static_cast<std::size_t>(n)), block_here;
  parallel_for(ex, nl, mark_list_members{offsets, raw(list_of)});
  typename execution_type::template vector<float> s;
  std::vector<index_t> block, gemm_at, row_at;
  std::vector<host::gemm_args> gemms;
  auto scores_of = [&](index_t a) {  // list a against all its probes
    index_t total = 0;
    for (index_t slot = 0; slot < nprobe; ++slot) {
      const index_t b = probes_host[a * nprobe + slot];
      total += (offsets_host[a + 1] - offsets_host[a]) * (offsets_host[b + 1] - offsets_host[b]);
    }
    return total;
  };
  for (index_t a0 = 0; a0 < nl;) {
    // The batch: lists [a0, a1) whose score blocks fit the buffer (at least one list).
    index_t a1 = a0, total = 0;
    while (a1 < nl && (a1 == a0 || total + scores_of(a1) <= max_scores)) total += scores_of(a1++);
    if (s.size() < static_cast<std::size_t>(total)) s.resize(static_cast<std::size_t>(total));
    float* sp = raw(s);
    block.clear();
    gemms.clear();
    gemm_at.clear();
    row_at.clear();
    index_t at = 0;
    for (index_t a = a0; a < a1; ++a) {
      gemm_at.push_back(static_cast<index_t>(gemms.size()));
      row_at.push_back(offsets_host[a]);
      for (index_t slot = 0; slot < nprobe; ++slot) {  // scores of list a's members against list b's
        const index_t qa = offsets_host[a + 1] - offsets_host[a], b = probes_host[a * nprobe + slot];
        const index_t first = offsets_host[b], len = offsets_host[b + 1] - first;
        block.push_back(at);
        at += qa * len;
        if (qa == 0 || len == 0) continue;
        gemms.push_back(score_block_gemm(lv.row(offsets_host[a]), lv.stride, qa, lv.row(first), lv.stride, len, d,
                                         sp + block.back(), len));
      }
    }
    gemm_at.push_back(static_cast<index_t>(gemms.size()));
    row_at.push_back(offsets_host[a1]);
    block_here.assign(block.begin(), block.end());
    gemm_groups_then_rows(ex, gemms.data(), gemm_at.data(), row_at.data(), a1 - a0,
                          offer_probed_lists{sp, raw(block_here), raw(list_of), probes, offsets, list_ids, nprobe, a0,
                                             k, raw(best.score), raw(best.index), raw(best.size)});
    a0 = a1;
  }
  row_topk_finish(ex, n, best);
  parallel_for(ex, n, write_graph_rows{list_ids, raw(best.score), raw(best.index), raw(best.size), k, ids, sims});
}

}  // namespace xsoftmax::detail
