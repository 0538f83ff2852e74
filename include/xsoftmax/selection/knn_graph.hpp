// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `knn_graph`: each class's K nearest classes among the class weight vectors (cosine or inner
/// product), the structure behind KNN softmax. `knn_graph_builder` builds it exactly (brute force in
/// tiles: dense scores of a tile of classes against a tile of classes, folded into a running top-K;
/// never an N x N matrix) or approximately through an IVF index (each list's members searching the
/// lists nearest to their list's centroid, or each class the lists nearest to itself), rebuilds it
/// into the same buffers on a schedule, or refreshes it from its last lists (neighbours-of-neighbours
/// passes). Builds and refreshes run on the backend of the weights (the same generic code on
/// serial, omp and cuda); the finished graph is stored on the host. `knn_graph_recall` measures an
/// approximate graph against the exact one.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/mirrored_vector.hpp>
#include <xsoftmax/detail/selection/backend_array.hpp>
#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/selection_types.hpp>
#include <xsoftmax/types.hpp>

#include <vector>

namespace xsoftmax {

/// How `knn_graph_builder` finds neighbours.
enum class knn_build_method {
  exact,  ///< brute force over all N classes, in tiles: O(N^2 d) work, O(tile^2 + tile K) memory
  ivf,    ///< the members of each IVF list search the `nprobe` lists nearest to the list's centroid
  /// every class searches the `nprobe` IVF lists nearest to itself (an IVF-Flat search with each
  /// class as a query): O(N nprobe N / num_lists d) work, as `ivf`, at a far higher recall for the
  /// same nprobe (bench/RESULTS.md, "KNN graph builds")
  ivf_class_probes,
};

/// Neighbours-of-neighbours passes over a KNN graph (NN-descent's local join in its "pull" form):
/// each class rescores its own list, then scores the first `sample` entries of the lists of its
/// first `fanout` neighbours and of up to `reverse` classes that have it among their first
/// `fanout`, and keeps its K best. They lift an approximate build's recall (`build_passes`) and
/// bring a graph built from older weights up to date (`knn_graph_builder::refresh`) at a fraction
/// of a rebuild's cost: N (K + (fanout + reverse) sample + reverse) dot products a pass at most.
/// Defaults: the best recall per second measured on the KNN study's weights (bench/RESULTS.md,
/// "KNN graph refresh").
struct knn_refine_options {
  index_t build_passes = 0;    ///< passes after every approximate (ivf*) build, >= 0 (0: none)
  index_t refresh_passes = 1;  ///< passes of each `knn_graph_builder::refresh`, >= 0
  index_t fanout = 20;         ///< neighbours whose lists a class reads, >= 1 (at most K are)
  index_t sample = 10;         ///< entries read from each of those lists, >= 1 (at most K are)
  index_t reverse = 30;        ///< reverse neighbours a class takes (smallest ids first), >= 0 (0: none)
  /// A refresh also searches exactly (against every class, in GEMM tiles) the rows of this fraction
  /// of the classes, in [0, 1]: those whose rows turned most since the last build or refresh
  /// (1 - cos of then and now; the squared distance under the inner product). Neighbours of
  /// neighbours follow a class that moved a little; one that moved far (a class trained hard
  /// between two updates) has left its old neighbourhood, and only a search finds its new one.
  /// Costs O(fraction N^2 d) a refresh, and the builder keeps a copy of the rows (N x d floats) to
  /// measure the turn. 0 (the default): none. Measured (bench/RESULTS.md, "KNN graph refresh"):
  /// on a long-tailed problem it raised the trained classes' recall and *lowered* KNN softmax's
  /// top-1 (their true neighbours crowd out the near-random negatives the rest of the classes got).
  double moved = 0;
};

/// Options of `knn_graph_builder`.
struct knn_build_options {
  index_t k = 50;                                  ///< neighbours per class, in [1, N]
  similarity metric = similarity::cosine;
  knn_build_method method = knn_build_method::exact;
  ivf_options ivf;                                 ///< methods ivf*: the index (its metric is set to `metric`;
                                                   ///< num_lists 0: round(sqrt N) for ivf, 3 sqrt N for ivf_class_probes)
  index_t nprobe = 8;                              ///< methods ivf*: lists searched per list (ivf) or per class
                                                   ///< (ivf_class_probes), in [1, num_lists]
  /// methods ivf*: rebuilds after the first (a `knn_graph_builder` keeps its index) start k-means
  /// from the last build's centroids and run this many rounds instead of `ivf.iterations` (-1:
  /// every build from seeded rows). Weights move little between rebuilds, so 1-2 rounds keep the
  /// lists good at a fraction of the cost (bench/RESULTS.md, "KNN graph builds").
  index_t refresh_iterations = -1;
  knn_refine_options refine;                       ///< neighbours-of-neighbours passes: after ivf* builds, and
                                                   ///< of `knn_graph_builder::refresh`
  index_t query_tile = 1024;                       ///< method exact: classes whose neighbours one pass finds
  index_t class_tile = 4096;                       ///< method exact: classes scored per GEMM
};

/// Neighbour lists of N classes: row c holds the K classes most similar to class c, best first
/// (ties: smaller id), c itself included when it ranks (it always does under cosine unless its
/// vector is zero). Entries are -1 (similarity -inf) only when an approximate search found fewer
/// than K candidates. Memory: N x K x (8 + 4) bytes (ids and similarities).
///
/// A graph built by a class-sharded head through the ring (see `knn_build_share`) holds only the
/// rows of its process's classes, [first_row(), first_row() + held_rows()): `ids()`,
/// `similarities()` and `neighbors(c)` (c in that range) are those rows'; every other graph holds
/// all N rows (first_row() = 0, held_rows() = N).
class knn_graph {
 public:
  knn_graph() = default;

  /// A graph from caller-given lists (N x K ids, row-major; -1 marks an empty slot) for a head of
  /// `num_classes` classes of width `dim`; usable with a head of any precision. Throws
  /// `invalid_argument` / `shape_error` / `out_of_range` naming the value for K outside [1, N], a
  /// wrong number of ids, or an id outside [-1, N).
  [[nodiscard]] static knn_graph from_lists(index_t num_classes, index_t dim, index_t k, std::vector<index_t> ids);

  [[nodiscard]] bool empty() const { return n_ == 0; }
  [[nodiscard]] index_t num_classes() const { return n_; }
  [[nodiscard]] index_t dim() const { return d_; }
  [[nodiscard]] index_t k() const { return k_; }
  [[nodiscard]] similarity metric() const { return metric_; }
  /// Element type of the weights the graph was built from ("fp32", "bf16", ...); null for
  /// caller-given lists.
  [[nodiscard]] const char* element() const { return element_; }
  /// The first class whose row is held (0 unless built in shares through the ring).
  [[nodiscard]] index_t first_row() const { return first_; }
  /// The rows held: N, or this process's classes when built in shares through the ring.
  [[nodiscard]] index_t held_rows() const { return held_; }
  /// The K neighbours of class c (c in [first_row(), first_row() + held_rows())).
  [[nodiscard]] const index_t* neighbors(index_t c) const { return ids_.host().data() + (c - first_) * k_; }
  /// The held rows' neighbour ids (held_rows() x K, all N rows but for a ring-built share) and
  /// their similarities (the same shape; empty for caller-given lists).
  [[nodiscard]] const std::vector<index_t>& ids() const { return ids_.host(); }
  /// The neighbour ids in `ex`'s memory (a device backend gets a copy made once per build).
  template <class Ex>
  [[nodiscard]] const index_t* ids_on(const Ex& ex) const { return ids_.data(ex); }
  [[nodiscard]] const std::vector<float>& similarities() const { return sims_; }
  /// How many times the graph was (re)built into this object.
  [[nodiscard]] index_t builds() const { return builds_; }

 private:
  friend class knn_graph_builder;
  index_t n_ = 0, d_ = 0, k_ = 0, first_ = 0, held_ = 0;
  similarity metric_ = similarity::cosine;
  const char* element_ = nullptr;
  detail::mirrored_vector<index_t> ids_;
  std::vector<float> sims_;
  index_t builds_ = 0;
};

/// Builds KNN graphs over class weights on any backend. Keeps the IVF index between builds; the
/// work buffers (tiles, norms, top-K heaps) are allocated per build in the backend's memory, a
/// small cost next to the build's O(N^2 d) (exact) or O(N nprobe N / num_lists d) (IVF methods) work.
class knn_graph_builder {
 public:
  /// Throws `invalid_argument` naming the value when k < 1, nprobe < 1 or a tile size < 1
  /// (k > N and nprobe > num_lists are checked at build time, when N is known).
  explicit knn_graph_builder(knn_build_options options = {});

  [[nodiscard]] const knn_build_options& options() const { return options_; }
  /// The IVF index of the last approximate build (empty for exact builds).
  [[nodiscard]] const ivf_index& index() const { return index_; }

  /// Builds the graph of `weights` (N x d, any supported element type) into `out`, reusing its
  /// storage. Throws `invalid_argument` naming the value when k > N or nprobe > num_lists.
  template <class Backend = serial, class T>
  void build(matrix_view<const T> weights, knn_graph& out, const backend_resources<Backend>& resources = {}) {
    build_on(detail::execution<Backend>{resources}, weights, out);
  }
  /// `build` on an execution (`detail::execution<Backend>`) or a Thrust host policy
  /// (`thrust::cpp::par`, `thrust::omp::par`); `weights` in its memory. `out` is changed only when
  /// the build succeeds.
  /// With `share` (a class-sharded head; see `knn_build_share`): gathered weights, this process
  /// finds only the share's rows (exact method) and `share->all_gather` assembles the graph; ring
  /// (`share->shift` set), `weights` are this process's rows only, and the exact method keeps only
  /// their graph rows (the IVF method builds the whole graph from the weights gathered by the ring).
  template <class Ex, class T>
  void build_on(const Ex& ex, matrix_view<const T> weights, knn_graph& out, const knn_build_share* share = nullptr);

  /// Brings `graph` (built by any method from weights that have moved since, or given) up to date
  /// with `weights` without a rebuild: `options().refine.refresh_passes` neighbours-of-neighbours
  /// passes starting from its lists (see `knn_refine_options`). Between rebuilds weights move
  /// little, so the old lists are a far better start than nothing (bench/RESULTS.md, "KNN graph
  /// refresh"). Throws `invalid_argument` when `graph` is empty or holds only a ring-built share of
  /// the rows (a refresh reads every class's list), `shape_error` naming both when its N, d or K
  /// differ from `weights`' and the options'. `graph` is changed only when the refresh succeeds.
  template <class Backend = serial, class T>
  void refresh(matrix_view<const T> weights, knn_graph& graph, const backend_resources<Backend>& resources = {}) {
    refresh_on(detail::execution<Backend>{resources}, weights, graph);
  }
  /// `refresh` on an execution or a Thrust host policy; `weights` in its memory. With a ring
  /// `share` (`share->shift` set), `weights` are this process's rows and the ring gathers the
  /// others first (the graph must hold every row, as an ivf* ring build's does).
  template <class Ex, class T>
  void refresh_on(const Ex& ex, matrix_view<const T> weights, knn_graph& graph, const knn_build_share* share = nullptr);

 private:
  knn_build_options options_;
  ivf_index index_;
  /// The rows (fp32, unit under cosine) of the last build or refresh, kept when `refine.moved` > 0
  /// to find the classes that moved most by the next refresh.
  detail::backend_array<float> last_rows_;
  template <class Ex>
  void search_moved(const Ex& ex, matrix_view<const float> x, index_t* ids, float* sims);
};

/// The graph of `weights` with `options` (a one-off `knn_graph_builder`).
template <class Backend = serial, class T>
[[nodiscard]] knn_graph build_knn_graph(matrix_view<const T> weights, const knn_build_options& options = {},
                                        const backend_resources<Backend>& resources = {}) {
  knn_graph g;
  knn_graph_builder(options).build<Backend>(weights, g, resources);
  return g;
}

/// Recall of `approx` against `exact`: the mean over classes of |approx row ∩ exact row| / K.
/// Throws `shape_error` naming both when N or K differ.
[[nodiscard]] double knn_graph_recall(const knn_graph& approx, const knn_graph& exact);

}  // namespace xsoftmax

#include <xsoftmax/detail/selection/knn_graph.inl>
