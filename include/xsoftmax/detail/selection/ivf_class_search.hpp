// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The search of the `ivf_class_probes` KNN-graph build: every vector of an IVF index is a query
/// that scans the `nprobe` lists whose centroids are nearest to *itself* (an IVF-Flat search with
/// every class as a query, FAISS's `IndexIVFFlat::search` on the index's own vectors), not the
/// lists nearest to its list's centroid (`ivf_pair_search.hpp`): a class near the border of its
/// list finds the neighbours across the border. Work: N x nprobe x N / num_lists dot products.
///
/// To keep the work in GEMMs, the (query, probed list) pairs are grouped by list: list b's queries
/// Q_b are gathered into consecutive rows and scored against b's members by one GEMM
/// (|Q_b| x |b|). Lists go in batches whose score blocks fit a bounded buffer; after a batch's
/// GEMMs, one parallel pass over the batch's pairs folds each query's blocks of that batch into its
/// heap (a query is folded by one thread only, so the heaps need no atomics; with each query's
/// lists in ascending order its lists of a batch are consecutive). The host reads only
/// sizes: the list offsets and the query count of each list (2 x (num_lists + 1) indices).

#include <xsoftmax/detail/primitives/gemm_batch.hpp>
#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/ivf_pair_search.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>

#include <algorithm>
#include <vector>

namespace xsoftmax::detail {

/// Each query's probed lists in ascending list order (probes: rows x nprobe, a query's lists
/// distinct), so that the lists of a batch [b0, b1) are consecutive slots of each query. The order
/// of the offers to a heap does not change the entries it keeps (ties are broken by id).
struct sort_query_probes {
  const index_t* probes;
  index_t nprobe;
  index_t* sorted;
  XSOFTMAX_HD void operator()(index_t r) const {
    index_t* out = sorted + r * nprobe;
    for (index_t j = 0; j < nprobe; ++j) {  // insertion sort: nprobe is small
      const index_t v = probes[r * nprobe + j];
      index_t p = j;
      for (; p > 0 && out[p - 1] > v; --p) out[p] = out[p - 1];
      out[p] = v;
    }
  }
};

/// For the pair at position i of the grouped order (pair items[i] = query * nprobe + slot): its
/// query's row, and the position at[items[i]] = i where the query's fold finds it.
struct place_pairs {
  const index_t* items;
  index_t nprobe;
  index_t* query_rows;
  index_t* at;
  XSOFTMAX_HD void operator()(index_t i) const {
    query_rows[i] = items[i] / nprobe;
    at[items[i]] = i;
  }
};

/// Folds the scores of batch [b0, b1) into the heaps. Runs over the batch's pairs (positions
/// first + i of the grouped order); the pair that is its query's first slot in the batch offers
/// that query's blocks of every list of the batch it probes (consecutive slots, lists ascending),
/// the others return: one thread per query, work in proportion to the batch, not to N. Pair
/// (r, slot) is row at[r * nprobe + slot] - query_offsets[b] of list b's block, which starts at
/// block[b - b0] in `s`.
struct offer_class_probes {
  const float* s;
  const index_t* block;          ///< per list of the batch: offset of its |Q_b| x |b| block in s
  const index_t* items;          ///< the grouped order's pairs (query * nprobe + slot)
  const index_t* probes;         ///< N x nprobe: each query's lists, ascending
  const index_t* at;             ///< N x nprobe: each pair's position in the grouped order
  const index_t* query_offsets;  ///< num_lists + 1: list b's pairs are [query_offsets[b], query_offsets[b + 1])
  const index_t* offsets;        ///< num_lists + 1: list b's members are [offsets[b], offsets[b + 1])
  const index_t* list_ids;
  index_t nprobe, b0, b1, k, first;
  float* hs;
  index_t* hi;
  index_t* size;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t pair = items[first + i], r = pair / nprobe, slot0 = pair % nprobe;
    if (slot0 > 0 && probes[pair - 1] >= b0) return;  // an earlier slot of r is in the batch
    topk_heap heap{hs + r * k, hi + r * k, size[r]};
    for (index_t slot = slot0; slot < nprobe && probes[r * nprobe + slot] < b1; ++slot) {
      const index_t b = probes[r * nprobe + slot], start = offsets[b], len = offsets[b + 1] - start;
      const float* row = s + block[b - b0] + (at[r * nprobe + slot] - query_offsets[b]) * len;
      for (index_t j = 0; j < len; ++j) heap.offer(row[j], list_ids[start + j], k);
    }
    size[r] = heap.n;
  }
};

/// The graph rows (N x k ids and similarities, in the execution's memory) of the N vectors `lv`
/// (list order; list b is rows [offsets[b], offsets[b + 1]) and holds classes list_ids[...]), each
/// searching the lists probes[r * nprobe .. + nprobe) of its own row r (N x nprobe, in the
/// execution's memory). `offsets_host` is the host copy of `offsets`. `max_scores`: the score
/// buffer's size in floats (a batch holds at least one list whatever this is).
template <class Ex>
void ivf_class_probe_topk(const Ex& ex_in, matrix_view<const float> lv, const index_t* offsets,
                          const std::vector<index_t>& offsets_host, const index_t* list_ids, const index_t* probes,
                          index_t nprobe, index_t k, index_t* ids, float* sims, index_t max_scores = index_t(8) << 20) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using index_vector = typename execution_type::template vector<index_t>;
  const index_t nl = static_cast<index_t>(offsets_host.size()) - 1, n = lv.rows, d = lv.cols, pairs = n * nprobe;
  // Each query's lists ascending; the pairs grouped by probed list (queries ascending within a
  // list), their query rows and positions.
  index_vector sorted_probes(static_cast<std::size_t>(pairs)), sorted_lists, items, query_offsets,
      query_rows(static_cast<std::size_t>(pairs)), at(static_cast<std::size_t>(pairs)), block_here;
  parallel_for(ex, n, sort_query_probes{probes, nprobe, raw(sorted_probes)});
  group_by_key(ex, raw(sorted_probes), pairs, nl, sorted_lists, items, query_offsets);
  parallel_for(ex, pairs, place_pairs{raw(items), nprobe, raw(query_rows), raw(at)});
  std::vector<index_t> qoff(static_cast<std::size_t>(nl + 1));
  execution_type::ops::copy(ex.res, qoff.data(), raw(query_offsets), nl + 1);

  basic_row_topk_state<typename execution_type::backend> best(n, k, ex);
  typename execution_type::template vector<float> s, gathered;
  std::vector<index_t> block;
  std::vector<host::gemm_args> gemms;
  auto scores_of = [&](index_t b) { return (qoff[b + 1] - qoff[b]) * (offsets_host[b + 1] - offsets_host[b]); };
  for (index_t b0 = 0; b0 < nl;) {
    // The batch: lists [b0, b1) whose score blocks fit the buffer (at least one list).
    index_t b1 = b0, total = 0;
    while (b1 < nl && (b1 == b0 || total + scores_of(b1) <= max_scores)) total += scores_of(b1++);
    const index_t batch_pairs = qoff[b1] - qoff[b0];
    if (batch_pairs == 0) {
      b0 = b1;
      continue;
    }
    if (s.size() < static_cast<std::size_t>(total)) s.resize(static_cast<std::size_t>(total));
    if (gathered.size() < static_cast<std::size_t>(batch_pairs * d)) gathered.resize(static_cast<std::size_t>(batch_pairs * d));
    float* sp = raw(s);
    float* gp = raw(gathered);
    copy_listed_rows(ex, lv.data, d, raw(query_rows) + qoff[b0], batch_pairs, gp);  // lv is dense (stride d)
    block.clear();
    gemms.clear();
    index_t offset = 0;
    for (index_t b = b0; b < b1; ++b) {  // list b's queries against list b's members
      const index_t queries = qoff[b + 1] - qoff[b], first = offsets_host[b], len = offsets_host[b + 1] - first;
      block.push_back(offset);
      offset += queries * len;
      if (queries == 0 || len == 0) continue;
      gemms.push_back(
          score_block_gemm(gp + (qoff[b] - qoff[b0]) * d, d, queries, lv.row(first), lv.stride, len, d, sp + block.back(), len));
    }
    block_here.assign(block.begin(), block.end());
    gemm_batch(ex, gemms.data(), static_cast<index_t>(gemms.size()));
    parallel_for(ex, batch_pairs,
                 offer_class_probes{sp, raw(block_here), raw(items), raw(sorted_probes), raw(at), raw(query_offsets),
                                    offsets, list_ids, nprobe, b0, b1, k, qoff[b0], raw(best.score), raw(best.index),
                                    raw(best.size)});
    b0 = b1;
  }
  row_topk_finish(ex, n, best);
  parallel_for(ex, n, write_graph_rows{list_ids, raw(best.score), raw(best.index), raw(best.size), k, ids, sims});
}

}  // namespace xsoftmax::detail
