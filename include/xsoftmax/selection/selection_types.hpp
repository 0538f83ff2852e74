// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Plain types shared by `selective_softmax` and its selectors: the active set a selector produces
/// for one batch, the request a head hands a selector, the similarity of class vectors used by
/// the KNN graph and the IVF index, and a class-sharded head's share of a graph build. Host code
/// can use all of them.
///
/// A *selector* is any type with
///
///     template <class Execution, class T>
///     void select(const Execution& ex, const selection_request<T>& request,
///                 active_set_for<typename Execution::backend>& out) const;
///
/// and, optionally, a step hook called by `selective_softmax::next_step()` after each training step:
///
///     template <class Execution, class T>
///     void next_step(const Execution& ex, matrix_view<const T> weights);   // or: void next_step();
///
/// `Execution` is `detail::execution<Backend>` (`ex.policy()` is the backend's Thrust execution
/// policy; the request's views and `out` are in the backend's memory). The library's selectors
/// also accept a Thrust host policy (`thrust::cpp::par`, `thrust::omp::par`) in its place.
///
/// A selector whose `select` is generic in the set type and uses on the set only `reset` and, on its
/// vectors, `resize`, `size`, `empty`, `begin`, `end` and `data`, declares `static constexpr bool
/// fills_scratch_sets = true;`: a head's training step then hands it a set of working memory of the
/// call (scratch vectors, no allocation per step) instead of an `active_set_for<Backend>`. One whose
/// sets meet the contract below by construction declares `static constexpr bool
/// sets_valid_by_construction = true;`: a training step then finds each row's target in the set
/// without checking the set first (two values read back a step; five per sample). The library's
/// selectors declare both.
///
/// A selector whose `select` reads `request.weights` declares `static constexpr bool scores_weights =
/// true;` (a class-sharded head, which holds only a slice of the weights, then rejects it).
///
/// `select` must be a pure function of the selector's state and the request, so that a forward
/// and a backward pass of one step see the same active set; randomness (sampled negatives) comes
/// from a seed and a step counter held by the selector and advanced by `next_step`.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/types.hpp>

#include <functional>
#include <type_traits>
#include <vector>

namespace xsoftmax {

/// Similarity of two class weight vectors (KNN graph, IVF index).
enum class similarity {
  inner_product,  ///< u . v
  cosine,         ///< u . v / (|u| |v|); a zero vector has similarity 0 to everything
};

/// How an `active_set` is laid out.
enum class active_layout {
  shared,      ///< one sorted class list for the whole batch: scored with one GEMM per chunk
  per_sample,  ///< one class list per row (CSR): scored row by row with gather-dot
};

/// The classes a selective softmax scores for one batch, in `Backend`'s memory. Rows are the
/// batch's *packed* rows: the samples whose target is not `ignore_index`, in their original order
/// (`selection_request::samples` maps them back).
///
/// `shared` layout: `classes` is strictly ascending, in [0, N), and holds every row's target. Row r
/// scores every class `classes[j]` with logit `h_r . w_c + b_c + offset`, where offset is
/// `target_offset[j]` when `classes[j]` is row r's target and `negative_offset[j]` otherwise. An
/// offset of -inf removes the class from that row's softmax (sampled softmax: another row's target
/// that was not sampled; an accidental hit is handled by the target/negative split). Empty offset
/// vectors mean 0.
///
/// `per_sample` layout: row r scores `ids[offsets[r] .. offsets[r + 1])`, which must include its
/// target (a class listed twice counts twice), with logit offsets `id_offset` (empty: 0).
///
/// Memory: the backend's vectors (host vectors on serial/omp, device vectors on cuda). Reusing one
/// object avoids reallocation.
template <class Backend>
struct basic_active_set {
  template <class T>
  using vector = backend_vector<Backend, T>;

  active_layout layout = active_layout::shared;
  // shared layout
  vector<index_t> classes;
  vector<float> negative_offset;  ///< empty, or one per class
  vector<float> target_offset;    ///< empty, or one per class
  // per_sample layout
  vector<index_t> offsets;  ///< rows + 1 entries, offsets[0] = 0, non-decreasing
  vector<index_t> ids;
  vector<float> id_offset;  ///< empty, or one per entry of `ids`

  /// Empties every buffer (keeping capacity) and sets the layout.
  void reset(active_layout l) {
    layout = l;
    classes.clear();
    negative_offset.clear();
    target_offset.clear();
    offsets.clear();
    ids.clear();
    id_offset.clear();
  }
  /// Classes scored per step: shared, the number of classes; per sample, the number of (row, class)
  /// pairs.
  [[nodiscard]] index_t entries() const {
    return static_cast<index_t>(layout == active_layout::shared ? classes.size() : ids.size());
  }
};

/// One process's share of a graph build (a class-sharded head: each rank finds the rows of its
/// own classes, against every class), in one of two forms:
///  * gathered weights (`shift` empty): the builder is handed the whole N x d matrix, finds the rows
///    [first, first + count), and `all_gather(ids, sims, k, all_ids, all_sims)` assembles every
///    share's count x k ids and similarities (the build's memory) into the N x k arrays, in row
///    order. The IVF method ignores the share (each process builds the whole graph).
///  * ring (`shift` set): the builder is handed only this process's rows (count x d, classes
///    [first, first + count)); `bounds` (size + 1 entries) are every process's first class and N;
///    `shift(send, send_count, recv, recv_count)` sends floats (in the build's execution memory) to
///    the next process and receives the previous one's. The exact method passes each process's block
///    round the ring and keeps the graph rows of this process's classes only; the IVF method
///    assembles the whole matrix through the ring and builds the whole graph. `gather_rows(targets,
///    rows, own, k, used, out)` (host memory, collective; kept by the selector for its selections)
///    fills `out` (rows x used) with the first `used` neighbours of each of the `rows` global
///    `targets`, from every owner's `own` graph rows (its count x k ids); every process passes the
///    same targets.
struct knn_build_share {
  index_t first = 0;
  index_t count = 0;
  std::function<void(const index_t*, const float*, index_t, index_t*, float*)> all_gather;
  std::vector<index_t> bounds;
  int rank = 0;
  std::function<void(const float*, index_t, float*, index_t)> shift;
  std::function<void(const index_t*, index_t, const index_t*, index_t, index_t, index_t*)> gather_rows;
};

namespace detail {
/// Whether `Selector::scores_weights` is true (false when absent).
template <class Selector, class = void>
inline constexpr bool selector_scores_weights = false;
template <class Selector>
inline constexpr bool selector_scores_weights<Selector, std::void_t<decltype(Selector::scores_weights)>> =
    Selector::scores_weights;
}  // namespace detail

/// The active set of the host backends (`serial`, `omp`): host vectors.
using active_set = basic_active_set<serial>;

/// The active-set type of a head on `Backend`: `active_set` on the host backends.
template <class Backend>
using active_set_for = std::conditional_t<is_host_backend<Backend>, active_set, basic_active_set<Backend>>;

/// What a head hands its selector for one batch. Views are valid for the duration of `select`.
template <class T>
struct selection_request {
  const char* where = "";  ///< the head's verb, for error messages
  index_t num_classes = 0;
  index_t dim = 0;
  matrix_view<const T> weights;       ///< num_classes x dim, the head's storage type
  const T* bias = nullptr;            ///< num_classes entries, or null
  matrix_view<const float> hidden;    ///< packed rows x dim, fp32
  vector_view<const index_t> targets; ///< packed rows: each row's target class
  vector_view<const index_t> samples; ///< packed rows: each row's index in the caller's batch
  index_t batch_rows = 0;             ///< rows of the caller's batch (ignored rows included)

  [[nodiscard]] index_t rows() const { return targets.size; }
};

}  // namespace xsoftmax
