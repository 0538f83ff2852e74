// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `ivf_index`: an inverted-file index over class weight vectors for approximate maximum-similarity
/// search. k-means splits the N vectors into `num_lists` lists; a query scores the centroids, then
/// scans only the vectors of its `nprobe` best lists. With `nprobe == num_lists` it scans every
/// vector and equals exact search. Used by the approximate KNN-graph builder and the approximate
/// feature-query selector. Built and searched on any backend by the same code (k-means, list
/// building and search are generic algorithms over the primitives); the index lives in the
/// memory of the backend that built it.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/selection/backend_array.hpp>
#include <xsoftmax/selection/selection_types.hpp>
#include <xsoftmax/types.hpp>

#include <vector>

namespace xsoftmax {

/// Options of `ivf_index::build`.
struct ivf_options {
  index_t num_lists = 0;         ///< k-means clusters; 0: round(sqrt(N))
  index_t iterations = 10;       ///< Lloyd iterations
  index_t train_points = 0;      ///< vectors k-means trains on (a seeded sample); 0: min(N, 64 * num_lists)
  similarity metric = similarity::cosine;  ///< cosine: spherical k-means over unit vectors; inner product: L2 k-means
  unsigned long long seed = 0;
  /// Start k-means from this index's centroids when it already has `num_lists` lists of the same
  /// width and metric (a refresh after the vectors moved a little: `iterations` can then be 1-2);
  /// otherwise, and by default, from seeded rows.
  bool warm_start = false;
};

/// An IVF index over N vectors of width d. Holds the centroids (num_lists x d), the lists (ids of
/// each list ascending, concatenated) and an fp32 copy of the vectors in list order (unit length
/// for cosine): N x d x 4 bytes besides the caller's weights, in the memory of the backend that
/// built it (the host accessors below copy it to the host on first use after a build; a search on
/// another backend copies it there once). Build it again after the weights change (a KNN selector
/// or feature-query selector does so on its schedule).
class ivf_index {
 public:
  ivf_index() = default;

  /// Clusters the rows of `vectors` (N x d, any supported element type) on `Backend`. Throws
  /// `invalid_argument` naming the value when N or d is not positive, num_lists is outside [1, N],
  /// iterations < 0 or train_points is outside [0, N]. Reuses this object's buffers.
  template <class Backend = serial, class T>
  void build(matrix_view<const T> vectors, const ivf_options& options = {},
             const backend_resources<Backend>& resources = {}) {
    build_on(detail::execution<Backend>{resources}, vectors, options);
  }
  /// `build` on an execution (`detail::execution<Backend>`) or a Thrust host policy
  /// (`thrust::cpp::par`, `thrust::omp::par`); `vectors` in its memory.
  template <class Ex, class T>
  void build_on(const Ex& ex, matrix_view<const T> vectors, const ivf_options& options);

  /// For each query row (fp32, rows x d), the `k` vectors with the highest score among the lists of
  /// its `nprobe` best centroids, best first (ties: smaller id), into `ids` and `scores` (rows x k;
  /// -1 and -inf where the probed lists hold fewer than k vectors). The score is the inner product
  /// with the stored vector (unit length under cosine), plus `bias[id]` when `bias` is given (the
  /// logits of a softmax head). Throws `shape_error` / `invalid_argument` naming the value for a
  /// wrong query width or output shape, k < 1, nprobe outside [1, num_lists], or an empty index.
  template <class Backend = serial, class T = float>
  void search(matrix_view<const float> queries, index_t k, index_t nprobe, matrix_view<index_t> ids,
              matrix_view<float> scores, const T* bias = nullptr,
              const backend_resources<Backend>& resources = {}) const {
    search_on(detail::execution<Backend>{resources}, queries, k, nprobe, ids, scores, bias);
  }
  /// `search` on an execution or a Thrust host policy; queries, outputs and bias in its memory.
  template <class Ex, class T = float>
  void search_on(const Ex& ex, matrix_view<const float> queries, index_t k, index_t nprobe,
                 matrix_view<index_t> ids, matrix_view<float> scores, const T* bias = nullptr) const;

  /// For each query row, its `nprobe` best lists by inner product with the centroids, best first,
  /// into `lists` (rows x nprobe, in the execution's memory). Working memory: the centroid scores
  /// of a tile of queries (at most 16 MB, whatever the number of queries) and rows x nprobe floats.
  template <class Ex>
  void probe_on(const Ex& ex, matrix_view<const float> queries, index_t nprobe, index_t* lists) const;

  [[nodiscard]] bool empty() const { return n_ == 0; }
  [[nodiscard]] index_t num_vectors() const { return n_; }
  [[nodiscard]] index_t dim() const { return d_; }
  [[nodiscard]] index_t num_lists() const { return list_offsets_.empty() ? 0 : list_offsets_.size() - 1; }
  [[nodiscard]] similarity metric() const { return metric_; }
  /// Element type of the vectors the index was built from ("fp32", "bf16", ...).
  [[nodiscard]] const char* element() const { return element_; }
  /// Centroids, num_lists x d, on the host.
  [[nodiscard]] matrix_view<const float> centroids() const { return {centroids_.host().data(), num_lists(), d_}; }
  /// List l is `list_ids()[list_offsets()[l] .. list_offsets()[l + 1])`, ids ascending (on the host).
  [[nodiscard]] const std::vector<index_t>& list_offsets() const { return list_offsets_.host(); }
  [[nodiscard]] const std::vector<index_t>& list_ids() const { return list_ids_.host(); }
  /// The vectors in list order (N x d, fp32; unit length under cosine), on the host.
  [[nodiscard]] matrix_view<const float> list_vectors() const { return {vectors_.host().data(), n_, d_}; }

 private:
  friend class knn_graph_builder;  // its IVF build searches the lists in the index's memory
  /// `build_on`; with `nprobe` > 0 also every vector's `nprobe` best lists, as `probe_on` finds
  /// them, into `probes` (N x nprobe in id order, the execution's memory): under cosine from the
  /// scores that put the vectors into lists (one N x num_lists GEMM less), else by `probe_on`.
  template <class Ex, class T>
  void build_probing_on(const Ex& ex, matrix_view<const T> vectors, const ivf_options& o, index_t nprobe,
                        index_t* probes);
  index_t n_ = 0, d_ = 0;
  similarity metric_ = similarity::cosine;
  const char* element_ = nullptr;
  detail::backend_array<float> centroids_;
  detail::backend_array<index_t> list_offsets_;
  detail::backend_array<index_t> list_ids_;
  detail::backend_array<float> vectors_;
};

}  // namespace xsoftmax

#include <xsoftmax/detail/selection/ivf_index.inl>
