// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `knn_graph` and `knn_graph_builder` on any backend: the exact build (GEMM tiles and a running
/// top-k) and the IVF build (the index, then one GEMM per list pair) are generic algorithms over
/// the primitives, run on the execution's policy and memory; only the finished graph is copied to
/// its (host) storage.

#include <xsoftmax/detail/primitives/convert.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/selection/checks.hpp>
#include <xsoftmax/detail/selection/ivf_class_search.hpp>
#include <xsoftmax/detail/selection/ivf_pair_search.hpp>
#include <xsoftmax/detail/selection/knn_refine.hpp>
#include <xsoftmax/detail/selection/knn_ring_build.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/functional.h>
#include <thrust/sort.h>

#include <math.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace xsoftmax {

inline knn_graph knn_graph::from_lists(index_t num_classes, index_t dim, index_t k, std::vector<index_t> ids) {
  const char* where = "knn_graph::from_lists";
  detail::expects(num_classes >= 1 && dim >= 1, where, ": num_classes = ", num_classes, ", dim = ", dim,
                  " must both be >= 1");
  detail::check_count(where, "k", k, num_classes, "num_classes");
  detail::expects<shape_error>(static_cast<index_t>(ids.size()) == num_classes * k, where, ": ", ids.size(),
                               " ids given for num_classes x k = ", num_classes, " x ", k);
  for (std::size_t i = 0; i < ids.size(); ++i)
    detail::expects<out_of_range>(ids[i] >= -1 && ids[i] < num_classes, where, ": ids[", i, "] = ", ids[i],
                                  " is out of range [-1, ", num_classes, ")");
  knn_graph g;
  g.n_ = num_classes;
  g.d_ = dim;
  g.k_ = k;
  g.held_ = num_classes;
  g.ids_.assign(std::move(ids));
  g.builds_ = 1;
  return g;
}

inline knn_graph_builder::knn_graph_builder(knn_build_options options) : options_(options) {
  const char* where = "knn_graph_builder";
  detail::expects(options.k >= 1, where, ": k = ", options.k, " must be >= 1");
  detail::expects(options.nprobe >= 1, where, ": nprobe = ", options.nprobe, " must be >= 1");
  detail::expects(options.metric == similarity::cosine || options.metric == similarity::inner_product, where,
                  ": metric = ", static_cast<int>(options.metric), " is not a similarity");
  detail::expects(options.method == knn_build_method::exact || options.method == knn_build_method::ivf ||
                      options.method == knn_build_method::ivf_class_probes,
                  where, ": method = ", static_cast<int>(options.method), " is not a knn_build_method");
  detail::expects(options.refresh_iterations >= -1, where, ": refresh_iterations = ", options.refresh_iterations,
                  " must be >= 0, or -1 for none");
  detail::expects(options.query_tile >= 1 && options.class_tile >= 1, where, ": query_tile = ", options.query_tile,
                  ", class_tile = ", options.class_tile, " must be >= 1");
  const knn_refine_options& r = options.refine;
  detail::expects(r.build_passes >= 0 && r.refresh_passes >= 0 && r.reverse >= 0, where,
                  ": refine.build_passes = ", r.build_passes, ", refine.refresh_passes = ", r.refresh_passes,
                  ", refine.reverse = ", r.reverse, " must be >= 0");
  detail::expects(r.fanout >= 1 && r.sample >= 1, where, ": refine.fanout = ", r.fanout, ", refine.sample = ",
                  r.sample, " must be >= 1");
  detail::expects(r.moved >= 0 && r.moved <= 1, where, ": refine.moved = ", r.moved, " must be in [0, 1]");
}

namespace detail {

/// The exact KNN rows of the classes [first, first + count) of `w` (all N when count < 0) against
/// all N classes (count x k ids and similarities, in the execution's memory): tiles of `query_tile`
/// classes scored against tiles of `class_tile` classes by the GEMM (scaled by both inverse norms
/// under cosine), folded into a running top-k per class (`exact_knn_rows_of_blocks` with `w` as its
/// one block). A part's rows are scored in the whole build's query tiles (padded), so the parts of a
/// sharded build are bitwise the whole's.
template <class Ex, class T>
void exact_knn_rows(const Ex& ex, matrix_view<const T> w, index_t k, bool cosine, index_t query_tile,
                    index_t class_tile, index_t* ids, float* sims, index_t first = 0, index_t count = -1) {
  const index_t n = w.rows, last = count < 0 ? n : first + count;
  exact_knn_rows_of_blocks(ex, matrix_view<const T>(w.row(first), last - first, w.cols, w.stride), first, n, n, k,
                           cosine, query_tile, class_tile, ids, sims, [&](auto visit) { visit(w, index_t(0)); });
}

/// The IVF list probes: each list's own list first, then the nprobe - 1 lists whose centroids
/// score highest with its centroid (num_lists x nprobe, in the execution's memory).
template <class Ex>
void ivf_list_probes(const Ex& ex_in, matrix_view<const float> centroids, index_t nprobe, index_t* probes) {
  const auto& ex = as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t nl = centroids.rows;
  typename execution_type::template vector<float> cs(static_cast<std::size_t>(nl * nl)), scratch;
  float* c = raw(cs);
  dense_scores(ex, centroids, centroids, static_cast<const float*>(nullptr), 0, nl, c, nl, scratch);
  XSOFTMAX_PARALLEL_FOR(ex, nl, l, { c[l * nl + l] = INFINITY; });
  basic_row_topk_state<typename execution_type::backend> best(nl, nprobe, ex);
  row_topk_update(ex, c, nl, nl, nl, 0, best);
  row_topk_finish(ex, nl, best);
  thrust::copy(ex.policy(), best.index.begin(), best.index.end(), probes);
}

}  // namespace detail

template <class Ex, class T>
void knn_graph_builder::build_on(const Ex& ex_in, matrix_view<const T> weights, knn_graph& out,
                                 const knn_build_share* share) {
  const char* where = "knn_graph_builder::build";
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const bool ring = share && share->shift;
  if (ring) {
    detail::expects(share->bounds.size() >= 2 && share->rank >= 0 &&
                        share->rank + 2 <= static_cast<int>(share->bounds.size()) &&
                        share->first == share->bounds[static_cast<std::size_t>(share->rank)] &&
                        share->count == weights.rows,
                    where, ": a ring share of rows [", share->first, ", ", share->first + share->count, ") at rank ",
                    share->rank, " does not match its bounds or the ", weights.rows, " local weight rows");
    if (options_.method != knn_build_method::exact) {  // every vector is needed: the whole matrix
      const auto all = detail::ring_gather_weights(ex, weights, *share);
      build_on(ex, matrix_view<const T>(detail::raw(all), share->bounds.back(), weights.cols), out, nullptr);
      return;
    }
  }
  const index_t n = ring ? share->bounds.back() : weights.rows, d = weights.cols, k = options_.k;
  detail::expects(n >= 1 && d >= 1 && weights.data != nullptr, where, ": weights are ", n, " x ", d,
                  "; need at least one row and one column");
  detail::check_count(where, "k", k, n, "num_classes");
  const index_t first = ring ? share->first : 0, held = ring ? share->count : n;
  typename execution_type::template vector<index_t> ids(static_cast<std::size_t>(held * k));
  typename execution_type::template vector<float> sims(static_cast<std::size_t>(held * k));
  const bool cosine = options_.metric == similarity::cosine;
  if (ring) {  // exact: this process's rows, its block and the others' visiting round the ring
    detail::exact_knn_ring_rows(ex, weights, *share, k, cosine, options_.query_tile, options_.class_tile,
                                detail::raw(ids), detail::raw(sims));
  } else if (options_.method == knn_build_method::exact && share) {  // this share's rows, then every share's
    detail::expects(share->first >= 0 && share->count >= 0 && share->first + share->count <= n, where,
                    ": share rows [", share->first, ", ", share->first + share->count, ") outside [0, ", n, ")");
    typename execution_type::template vector<index_t> own_ids(static_cast<std::size_t>(share->count * k));
    typename execution_type::template vector<float> own_sims(own_ids.size());
    detail::exact_knn_rows(ex, weights, k, cosine, options_.query_tile, options_.class_tile, detail::raw(own_ids),
                           detail::raw(own_sims), share->first, share->count);
    share->all_gather(detail::raw(own_ids), detail::raw(own_sims), k, detail::raw(ids), detail::raw(sims));
  } else if (options_.method == knn_build_method::exact) {
    detail::exact_knn_rows(ex, weights, k, cosine, options_.query_tile, options_.class_tile, detail::raw(ids),
                           detail::raw(sims));
  } else {
    ivf_options io = options_.ivf;
    io.metric = options_.metric;
    if (options_.refresh_iterations >= 0 && !index_.empty()) {  // a refresh: k-means from the last centroids
      io.warm_start = true;
      io.iterations = options_.refresh_iterations;
    }
    // Each class probing its own lists gains from finer lists (a class's neighbours spread over
    // fewer of them): by default 3 sqrt(N) lists instead of the index's sqrt(N) (bench/RESULTS.md,
    // "KNN graph builds": recall 0.88 -> 0.99 at N = 1e5 for about 1.5x the time).
    if (options_.method == knn_build_method::ivf_class_probes && io.num_lists == 0)
      io.num_lists = std::min<index_t>(n, std::max<index_t>(1, static_cast<index_t>(std::lround(3 * std::sqrt(double(n))))));
    const index_t np = options_.nprobe;
    const bool class_probes = options_.method == knn_build_method::ivf_class_probes;
    typename execution_type::template vector<index_t> probes_by_id(static_cast<std::size_t>(class_probes ? n * np : 0));
    if (class_probes) {  // each class's own probes, from the build's own scores under cosine (the
                         // index checks nprobe against its list count before building)
      index_.build_probing_on(ex, weights, io, np, detail::raw(probes_by_id));
    } else {
      index_.build_on(ex, weights, io);
    }
    const index_t nl = index_.num_lists();
    detail::expects(np <= nl, where, ": nprobe = ", np, " must be in [1, num_lists = ", nl, "]");
    std::vector<index_t> offsets_host(static_cast<std::size_t>(nl + 1));
    execution_type::ops::copy(ex.res, offsets_host.data(), index_.list_offsets_.data(ex), nl + 1);
    const matrix_view<const float> lv(index_.vectors_.data(ex), n, d);
    if (class_probes) {
      // The probes in the index's list order, as its rows.
      typename execution_type::template vector<index_t> probes(static_cast<std::size_t>(n * np));
      detail::copy_listed_rows(ex, detail::raw(probes_by_id), np, index_.list_ids_.data(ex), n, detail::raw(probes));
      detail::ivf_class_probe_topk(ex, lv, index_.list_offsets_.data(ex), offsets_host, index_.list_ids_.data(ex),
                                   detail::raw(probes), np, k, detail::raw(ids), detail::raw(sims));
    } else {
      // Members of a list share its probes: one GEMM per (list, probed list).
      typename execution_type::template vector<index_t> probes(static_cast<std::size_t>(nl * np));
      detail::ivf_list_probes(ex, matrix_view<const float>(index_.centroids_.data(ex), nl, d), np,
                              detail::raw(probes));
      std::vector<index_t> probes_host(probes.size());
      execution_type::ops::copy(ex.res, probes_host.data(), detail::raw(probes), nl * np);
      detail::ivf_list_pair_topk(ex, lv, index_.list_offsets_.data(ex), offsets_host, index_.list_ids_.data(ex),
                                 detail::raw(probes), probes_host, np, k, detail::raw(ids), detail::raw(sims));
    }
  }
  // After an approximate build, the refine passes; with `moved`, the rows kept for the next
  // refresh's turns (a ring's exact share holds only its rows, and is never refreshed).
  const bool refine_now = options_.method != knn_build_method::exact && options_.refine.build_passes > 0;
  const bool keep_now = options_.refine.moved > 0 && held == n;
  detail::backend_array<float> kept;  // swapped into last_rows_ once the graph is written
  if (refine_now || keep_now) {
    auto x = detail::similarity_rows(ex, weights, cosine);
    const matrix_view<const float> xv(detail::raw(x), n, d);
    if (refine_now)
      detail::refine_knn_graph(ex, xv, detail::raw(ids), detail::raw(sims), k, options_.refine.fanout,
                               options_.refine.sample, options_.refine.reverse, options_.refine.build_passes);
    if (keep_now) kept = detail::backend_array<float>::adopting(ex, std::move(x));
  }
  // The graph's public storage is on the host (ids mirrored to a device on use).
  std::vector<index_t>& gids = out.ids_.edit();
  gids.resize(static_cast<std::size_t>(held * k));
  out.sims_.resize(static_cast<std::size_t>(held * k));
  execution_type::ops::copy(ex.res, gids.data(), detail::raw(ids), held * k);
  execution_type::ops::copy(ex.res, out.sims_.data(), detail::raw(sims), held * k);
  out.first_ = first;
  out.held_ = held;
  out.n_ = n;
  out.d_ = d;
  out.k_ = k;
  out.metric_ = options_.metric;
  out.element_ = element_name<std::remove_cv_t<T>>();
  ++out.builds_;
  if (keep_now) last_rows_ = std::move(kept);
}

template <class Ex, class T>
void knn_graph_builder::refresh_on(const Ex& ex_in, matrix_view<const T> weights, knn_graph& graph,
                                   const knn_build_share* share) {
  const char* where = "knn_graph_builder::refresh";
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  if (share && share->shift) {  // a ring share: every class's row is read, so gather them first
    detail::expects(share->bounds.size() >= 2 && share->count == weights.rows, where, ": a ring share of ",
                    share->count, " rows does not match the ", weights.rows, " local weight rows");
    const auto all = detail::ring_gather_weights(ex, weights, *share);
    refresh_on(ex, matrix_view<const T>(detail::raw(all), share->bounds.back(), weights.cols), graph, nullptr);
    return;
  }
  const index_t n = weights.rows, d = weights.cols, k = graph.k();
  detail::expects(!graph.empty(), where, ": the graph is empty; build it first (knn_graph_builder::build)");
  detail::expects(graph.held_rows() == graph.num_classes(), where, ": the graph holds ", graph.held_rows(), " of ",
                  graph.num_classes(), " rows (a ring-built share); a refresh reads every class's list: rebuild it");
  detail::expects<shape_error>(graph.num_classes() == n && graph.dim() == d && k == options_.k, where,
                               ": the graph is ", graph.num_classes(), " classes x ", graph.dim(), " dims with k = ", k,
                               " but the weights are ", n, " x ", d, " and the options' k = ", options_.k);
  const knn_refine_options& r = options_.refine;
  if (r.refresh_passes == 0 && r.moved == 0) return;
  typename execution_type::template vector<index_t> ids(static_cast<std::size_t>(n * k));
  typename execution_type::template vector<float> sims(ids.size());
  execution_type::ops::copy(ex.res, detail::raw(ids), graph.ids().data(), n * k);
  const bool cosine = options_.metric == similarity::cosine;
  auto x = detail::similarity_rows(ex, weights, cosine);
  const matrix_view<const float> xv(detail::raw(x), n, d);
  if (r.refresh_passes > 0) {
    detail::refine_knn_graph(ex, xv, detail::raw(ids), detail::raw(sims), k, r.fanout, r.sample, r.reverse,
                             r.refresh_passes);
  } else {  // no passes: the lists only rescored for the new rows (a pass without candidates)
    detail::refine_knn_graph(ex, xv, detail::raw(ids), detail::raw(sims), k, 0, 0, 0, 1);
  }
  if (r.moved > 0 && last_rows_.size() == n * d) search_moved(ex, xv, detail::raw(ids), detail::raw(sims));
  // The rows kept for the next refresh replace the last ones only once the graph is written.
  detail::backend_array<float> kept;
  if (r.moved > 0) kept = detail::backend_array<float>::adopting(ex, std::move(x));
  // Into the graph's own (host) buffers, as a build: nothing above changed them.
  execution_type::ops::copy(ex.res, graph.ids_.edit().data(), detail::raw(ids), n * k);
  graph.sims_.resize(static_cast<std::size_t>(n * k));  // empty for caller-given lists
  execution_type::ops::copy(ex.res, graph.sims_.data(), detail::raw(sims), n * k);
  graph.metric_ = options_.metric;
  graph.element_ = element_name<std::remove_cv_t<T>>();
  ++graph.builds_;
  if (r.moved > 0) last_rows_ = std::move(kept);
}

template <class Ex>
void knn_graph_builder::search_moved(const Ex& ex_in, matrix_view<const float> x, index_t* ids, float* sims) {
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  const index_t n = x.rows, d = x.cols, k = options_.k;
  const index_t m = std::min(n, std::max<index_t>(1, static_cast<index_t>(std::ceil(options_.refine.moved * n))));
  typename execution_type::template vector<float> turn(static_cast<std::size_t>(n)), queries(static_cast<std::size_t>(m * d)),
      found_sims(static_cast<std::size_t>(m * k));
  typename execution_type::template vector<index_t> order(static_cast<std::size_t>(n)), found_ids(found_sims.size());
  const bool cosine = options_.metric == similarity::cosine;
  detail::parallel_for(ex, n, detail::row_turn{x.data, last_rows_.data(ex), d, cosine, detail::raw(turn),
                                               detail::raw(order)});
  // The m classes that turned most (ties: smaller id), their rows searched against every class.
  thrust::stable_sort_by_key(ex.policy(), turn.begin(), turn.end(), order.begin(), thrust::greater<float>());
  detail::copy_listed_rows(ex, x.data, d, detail::raw(order), m, detail::raw(queries));
  // x is already unit under cosine: its inner products are the cosines.
  detail::exact_knn_rows_of_blocks(ex, matrix_view<const float>(detail::raw(queries), m, d), 0, n, n, k, false,
                                   options_.query_tile, options_.class_tile, detail::raw(found_ids),
                                   detail::raw(found_sims), [&](auto visit) { visit(x, index_t(0)); });
  detail::parallel_for(ex, m, detail::write_graph_rows{detail::raw(order), detail::raw(found_sims),
                                                       detail::raw(found_ids), nullptr, k, ids, sims});
}

inline double knn_graph_recall(const knn_graph& approx, const knn_graph& exact) {
  detail::expects<shape_error>(approx.num_classes() == exact.num_classes() && approx.k() == exact.k(),
                               "knn_graph_recall: the approximate graph has num_classes = ", approx.num_classes(),
                               ", k = ", approx.k(), " but the exact one has num_classes = ", exact.num_classes(),
                               ", k = ", exact.k());
  detail::expects(approx.held_rows() == approx.num_classes() && exact.held_rows() == exact.num_classes(),
                  "knn_graph_recall: the graphs hold ", approx.held_rows(), " and ", exact.held_rows(),
                  " rows of ", exact.num_classes(), "; a ring-built share holds only its process's rows");
  const index_t n = exact.num_classes(), k = exact.k();
  if (n == 0) return 1.0;
  double total = 0;
  std::vector<index_t> a, e;
  for (index_t c = 0; c < n; ++c) {
    a.assign(approx.neighbors(c), approx.neighbors(c) + k);
    e.assign(exact.neighbors(c), exact.neighbors(c) + k);
    std::sort(a.begin(), a.end());
    std::sort(e.begin(), e.end());
    index_t hit = 0;
    for (std::size_t i = 0, j = 0; i < a.size() && j < e.size();) {
      if (a[i] < 0) { ++i; continue; }
      if (a[i] == e[j]) ++hit, ++i, ++j;
      else if (a[i] < e[j]) ++i;
      else ++j;
    }
    total += static_cast<double>(hit) / k;
  }
  return total / n;
}

}  // namespace xsoftmax
