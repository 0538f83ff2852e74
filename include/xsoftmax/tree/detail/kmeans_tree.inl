// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `kmeans_label_tree` and `init_tree_weights_from_class_vectors` (tree/kmeans_tree.hpp).
///
/// The tree is built level by level, not node by node: every node being split at one level is
/// clustered in the same passes (one GEMM per large node, batched; one parallel loop over the
/// classes of all small nodes; one parallel loop over all (node, column block) centroid sums), so
/// a binary tree over 1e6 classes costs about 20 levels x (iterations + 1) passes, not 5e5
/// separate k-means calls, each with its own parallel regions. The classes of the level's nodes
/// are kept in one array in which every node is a contiguous segment (the level order), with their
/// rows in that order on the backend; both are regrouped by cluster after each level. A node whose
/// balanced assignment repeats leaves the rounds (a fixed point: the rest would change nothing).
/// The scores travel to the host for the balanced assignment and the assignment travels back (no
/// copies on a host backend), O(n b) values per round.
///
/// Determinism: the initial centroids come from a counter-based generator of (seed, node id); a
/// score is one GEMM element or one `dot_row`, neither of which depends on how rows are split among
/// threads (host GEMM: CBLAS, or the blocked loop summing k in order); a centroid sums its members
/// in double in level order; the balanced assignment is a deterministic host computation under a
/// total order (score key, then position). Whether a node is scored by a GEMM depends on its size
/// only.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/dense_scores.hpp>
#include <xsoftmax/detail/primitives/finite_scan.hpp>
#include <xsoftmax/detail/primitives/gather_dot.hpp>
#include <xsoftmax/detail/primitives/gemm_batch.hpp>
#include <xsoftmax/detail/primitives/mix_seed.hpp>
#include <xsoftmax/detail/selection/kmeans.hpp>
#include <xsoftmax/detail/selection/vector_rows.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/precision.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

namespace xsoftmax {
namespace detail {

/// A node of n classes split b ways is scored by the backend's GEMM (one per node, batched) when
/// n * b reaches this many scores and n >= 16; smaller ones by a parallel loop over their classes
/// (a GEMM call per tiny node would cost more than its work: a binary tree's deep levels hold
/// N / 3 nodes of 3 or 4 classes).
inline constexpr index_t kmeans_tree_gemm_scores = 2048;

inline bool kmeans_tree_uses_gemm(index_t n, index_t b) { return n >= 16 && n * b >= kmeans_tree_gemm_scores; }

/// Columns one centroid-sum or subtree-mean task sums (double accumulators in registers/local
/// memory, and (rows x column blocks) tasks so that even a level of 2 centroids has parallelism).
inline constexpr index_t kmeans_tree_columns = 16;

inline void check_kmeans_tree_options(const char* where, const kmeans_tree_options& o) {
  expects(o.branching >= 2, where, ": options.branching = ", o.branching, " must be >= 2");
  expects(o.max_depth >= 0, where, ": options.max_depth = ", o.max_depth, " must be >= 0 (0: no limit)");
  expects(o.iterations >= 0, where, ": options.iterations = ", o.iterations, " must be >= 0");
}

/// Whether a node at `level` (root 0) holding n classes is split by k-means (else its classes are
/// its children).
inline bool kmeans_tree_splits(index_t n, int level, const kmeans_tree_options& o) {
  return n > o.branching && (o.max_depth == 0 || level + 1 < o.max_depth);
}

/// A node being split at the current level: its classes are positions [begin, end) of the level
/// order; `id` is its node number in the parent array.
struct kmeans_tree_segment {
  index_t begin, end, id;
};

/// S[i * b + j] = x_i . c_{node(i) * b + j} for the classes i of small nodes (node(i) >= 0; the
/// classes of GEMM-scored nodes carry -1 and are skipped) that are still active.
struct kmeans_tree_small_scores {
  const float* x;
  const float* c;
  const index_t* node;
  const unsigned char* active;
  index_t d, b;
  float* s;
  XSOFTMAX_HD void operator()(index_t i) const {
    const index_t t = node[i];
    if (t < 0 || !active[t]) return;
    const float* xi = x + i * d;
    for (index_t j = 0; j < b; ++j) s[i * b + j] = dot_row(xi, c + (t * b + j) * d, d);
  }
};

/// Centroid t * b + j = row from[t * b + j] of the level's vectors (already unit length when
/// spherical), with its half norm when `half_norm` is given.
struct kmeans_tree_seed {
  const float* x;
  const index_t* from;
  index_t d;
  float* c;
  float* half_norm;
  XSOFTMAX_HD void operator()(index_t cj) const {
    const float* r = x + from[cj] * d;
    float* o = c + cj * d;
    for (index_t p = 0; p < d; ++p) o[p] = r[p];
    if (half_norm) half_norm[cj] = minus_half_norm(o, d);
  }
};

/// Cluster sizes of a node of n classes split b ways: the first n mod b get ceil(n / b).
XSOFTMAX_HD inline index_t kmeans_tree_cluster_size(index_t n, index_t b, index_t j) {
  return n / b + (j < n % b ? 1 : 0);
}

/// First position of cluster j's members in its node's segment (the clusters' sizes summed).
XSOFTMAX_HD inline index_t kmeans_tree_cluster_begin(index_t n, index_t b, index_t j) {
  return j * (n / b) + (j < n % b ? j : n % b);
}

/// Task (node t, column block): columns [16 blk, +16) of the means of node t's b clusters. The
/// task streams the node's classes in level order, adding each row's block to its cluster's sums
/// (`sum`: k x d doubles of scratch), so each centroid sums its members in ascending position
/// whatever the threads; then it writes the means (a cluster's size is known: the balanced
/// assignment fills it exactly). Inactive nodes are skipped.
struct kmeans_tree_centroid_sums {
  const float* x;
  const index_t* assign;
  const index_t* segment;  ///< node t's classes are [segment[t], segment[t + 1])
  const unsigned char* active;
  index_t d, b;
  double* sum;
  float* c;
  XSOFTMAX_HD void operator()(index_t task) const {
    constexpr index_t width = kmeans_tree_columns;
    const index_t blocks = (d + width - 1) / width;
    const index_t t = task / blocks, p0 = (task % blocks) * width, pn = d - p0 < width ? d - p0 : width;
    if (!active[t]) return;
    const index_t begin = segment[t], n = segment[t + 1] - begin;
    for (index_t j = 0; j < b; ++j)
      for (index_t p = 0; p < pn; ++p) sum[(t * b + j) * d + p0 + p] = 0.0;
    if (pn == width) {  // constant trip count: vectorised adds
      for (index_t i = begin; i < begin + n; ++i) {
        const float* r = x + i * d + p0;
        double* acc = sum + (t * b + assign[i]) * d + p0;
        for (index_t p = 0; p < width; ++p) acc[p] += r[p];
      }
    } else {
      for (index_t i = begin; i < begin + n; ++i) {
        const float* r = x + i * d + p0;
        double* acc = sum + (t * b + assign[i]) * d + p0;
        for (index_t p = 0; p < pn; ++p) acc[p] += r[p];
      }
    }
    for (index_t j = 0; j < b; ++j) {
      const index_t count = kmeans_tree_cluster_size(n, b, j), cj = t * b + j;
      if (count == 0) continue;
      const double inv = 1.0 / static_cast<double>(count);
      for (index_t p = 0; p < pn; ++p) c[cj * d + p0 + p] = static_cast<float>(sum[cj * d + p0 + p] * inv);
    }
  }
};

/// After the sums: unit length when spherical, the half norm otherwise.
struct kmeans_tree_centroid_finish {
  const unsigned char* active;
  float* c;
  index_t d, b;
  bool spherical;
  float* half_norm;
  XSOFTMAX_HD void operator()(index_t cj) const {
    if (!active[cj / b]) return;
    float* o = c + cj * d;
    if (spherical) unit_length(o, d);
    if (half_norm) half_norm[cj] = minus_half_norm(o, d);
  }
};

/// `count` distinct positions of [begin, begin + n), drawn by Floyd's algorithm from a
/// counter-based generator of (seed, id), into `out`. `mark` (the level's positions) is zero on
/// entry and on return.
inline void kmeans_tree_pick(unsigned long long seed, index_t id, index_t begin, index_t n, index_t count,
                             unsigned char* mark, index_t* out) {
  std::uint64_t state = mix_seed(seed ^ mix_seed(static_cast<std::uint64_t>(id) + 0x6B6D65616E73ull));
  for (index_t j = n - count, m = 0; j < n; ++j, ++m) {
    state = mix_seed(state);
    const auto r = static_cast<index_t>(state % static_cast<std::uint64_t>(j + 1));
    const index_t pick = mark[begin + r] ? j : r;
    mark[begin + pick] = 1;
    out[m] = begin + pick;
  }
  for (index_t m = 0; m < count; ++m) mark[out[m]] = 0;
}

/// The balanced assignment itself (see `kmeans_tree_balanced_assign`).
inline void kmeans_tree_assign_only(const float* s, const float* hn, index_t b, index_t t, index_t begin, index_t end,
                                    index_t* assign, float* key, index_t* idx, index_t* room) {
  const index_t n = end - begin;
  const auto score = [&](index_t i, index_t j) { return hn ? s[i * b + j] + hn[t * b + j] : s[i * b + j]; };
  const auto clean = [](float v) { return v == v ? v : -std::numeric_limits<float>::infinity(); };
  // Highest key first, then the smaller position: a strict total order, so the result is unique.
  const auto before = [key](index_t a, index_t c) { return key[a] > key[c] || (key[a] == key[c] && a < c); };
  for (index_t i = begin; i < end; ++i) idx[i] = i;
  if (b == 2) {
    for (index_t i = begin; i < end; ++i) key[i] = clean(score(i, 0) - score(i, 1));
    const index_t first = kmeans_tree_cluster_size(n, 2, 0);
    std::nth_element(idx + begin, idx + begin + first, idx + end, before);
    for (index_t k = begin; k < end; ++k) assign[idx[k]] = k < begin + first ? 0 : 1;
    return;
  }
  for (index_t i = begin; i < end; ++i) {
    index_t best = 0;
    float v1 = score(i, 0), v2 = -std::numeric_limits<float>::infinity();
    for (index_t j = 1; j < b; ++j) {
      const float v = score(i, j);
      if (v > v1) {
        v2 = v1;
        v1 = v;
        best = j;
      } else if (v > v2) {
        v2 = v;
      }
    }
    assign[i] = best;
    key[i] = clean(v1 - v2);
  }
  std::sort(idx + begin, idx + end, before);
  for (index_t j = 0; j < b; ++j) room[j] = kmeans_tree_cluster_size(n, b, j);
  for (index_t k = begin; k < end; ++k) {
    const index_t i = idx[k];
    index_t j = assign[i];
    if (room[j] == 0) {  // its best cluster is full: the best one with room
      j = -1;
      float v = 0;
      for (index_t q = 0; q < b; ++q)
        if (room[q] > 0 && (j < 0 || score(i, q) > v)) j = q, v = score(i, q);
    }
    --room[j];
    assign[i] = j;
  }
}

/// The balanced assignment of one node's classes [begin, end) (level positions) to its b clusters
/// from their scores s (row i: s[i * b .. + b), plus hn[t * b + j] when Euclidean), into assign[i]
/// (cluster in [0, b)), and the node's positions grouped by cluster, ascending within a cluster,
/// into member[begin, end). `key` and `idx` are the level's scratch; `room` holds b counters.
inline void kmeans_tree_balanced_assign(const float* s, const float* hn, index_t b, index_t t, index_t begin,
                                        index_t end, index_t* assign, index_t* member, float* key, index_t* idx,
                                        index_t* room) {
  kmeans_tree_assign_only(s, hn, b, t, begin, end, assign, key, idx, room);
  const index_t n = end - begin;
  for (index_t j = 0; j < b; ++j) room[j] = begin + kmeans_tree_cluster_begin(n, b, j);
  for (index_t i = begin; i < end; ++i) member[room[assign[i]]++] = i;
}

/// The host execution on which the host steps run: the backend's own for a host backend (omp
/// spreads the nodes over its threads), the calling thread for a device backend.
template <class Ex>
decltype(auto) kmeans_tree_host_side(const Ex& ex) {
  if constexpr (runs_on_device<Ex>) return serial_execution();
  else return (ex);
}

/// A pointer to `v`'s contents that the host can read: `v` itself on a host backend, a copy in
/// `buffer` on a device.
template <class Ex, class V, class T>
const T* kmeans_tree_on_host(const Ex& ex, V& v, std::vector<T>& buffer) {
  if constexpr (runs_on_device<Ex>) {
    buffer.resize(v.size());
    Ex::ops::copy(ex.res, buffer.data(), raw(v), static_cast<index_t>(v.size()));
    return buffer.data();
  } else {
    return raw(v);
  }
}

/// A pointer to the host vector `h`'s contents that the backend can read: `h` itself on a host
/// backend, a copy in `buffer` on a device.
template <class Ex, class V, class T>
const T* kmeans_tree_on_backend(const Ex& ex, const std::vector<T>& h, V& buffer) {
  if constexpr (runs_on_device<Ex>) {
    buffer.resize(h.size());
    Ex::ops::copy(ex.res, raw(buffer), h.data(), static_cast<index_t>(h.size()));
    return raw(buffer);
  } else {
    return h.data();
  }
}

/// Throws `non_finite_error` naming the first NaN or infinite element of `m` (execution memory).
template <class Backend, class T>
void check_finite_class_vectors(const char* where, const execution<Backend>& ex, matrix_view<const T> m) {
  const index_t bad = first_non_finite_row(ex, m);
  if (bad >= m.rows) return;
  for (index_t p = 0; p < m.cols; ++p) {
    const float v = to_float(backend_ops<Backend>::read(ex.res, m.row(bad) + p));
    expects<non_finite_error>(non_finite_bit(v) == 0, where, ": class_vectors(", bad, ", ", p, ") = ", v,
                              " is not finite");
  }
}

template <class T>
void check_class_vectors(const char* where, matrix_view<const T> v) {
  expects(v.rows >= 1, where, ": class_vectors has ", v.rows, " rows; need at least one class");
  expects(v.cols >= 1, where, ": class_vectors has ", v.cols, " columns; need d >= 1");
  expects(v.data != nullptr, where, ": class_vectors.data is null");
  expects<shape_error>(v.stride >= v.cols, where, ": class_vectors.stride = ", v.stride,
                       " is smaller than its cols = ", v.cols);
}

/// Row k of `out` (dense fp32, d columns) = class_vectors row order[k], widened: the class vectors
/// in leaf order, so that every subtree's vectors are one contiguous run of rows.
template <class T>
struct rows_in_leaf_order {
  matrix_view<const T> x;
  const index_t* order;
  float* out;
  XSOFTMAX_HD void operator()(index_t k) const {
    const T* r = x.row(order[k]);
    float* o = out + k * x.cols;
    for (index_t p = 0; p < x.cols; ++p) o[p] = to_float(r[p]);
  }
};

/// Task (output row r, column block): columns [16 blk, +16) of the mean of the rows [first[q],
/// last[q]) of `x` (the class vectors in leaf order) for q = r (softmax nodes), or of q = 2r minus
/// that of q = 2r + 1 (sigmoid nodes); zero for an empty range. Sums in double in leaf order.
template <class S>
struct subtree_mean_rows {
  const float* x;  ///< N x d, leaf order
  const index_t* first;
  const index_t* last;
  bool sigmoid;
  matrix_view<S> out;

  XSOFTMAX_HD void add_mean(double* acc, index_t q, index_t p0, index_t pn, double sign) const {
    const index_t a = first[q], e = last[q], d = out.cols;
    if (e <= a) return;
    constexpr index_t width = kmeans_tree_columns;
    double sum[width] = {};
    if (pn == width) {  // constant trip count: the sums stay in registers
      for (index_t k = a; k < e; ++k)
        for (index_t p = 0; p < width; ++p) sum[p] += static_cast<double>(x[k * d + p0 + p]);
    } else {
      for (index_t k = a; k < e; ++k)
        for (index_t p = 0; p < pn; ++p) sum[p] += static_cast<double>(x[k * d + p0 + p]);
    }
    const double inv = sign / static_cast<double>(e - a);
    for (index_t p = 0; p < pn; ++p) acc[p] += sum[p] * inv;
  }

  XSOFTMAX_HD void operator()(index_t task) const {
    constexpr index_t width = kmeans_tree_columns;
    const index_t d = out.cols, blocks = (d + width - 1) / width;
    const index_t r = task / blocks, p0 = (task % blocks) * width, pn = d - p0 < width ? d - p0 : width;
    double acc[width] = {};
    if (sigmoid) {
      add_mean(acc, 2 * r, p0, pn, 1.0);
      add_mean(acc, 2 * r + 1, p0, pn, -1.0);
    } else {
      add_mean(acc, r, p0, pn, 1.0);
    }
    S* o = out.row(r) + p0;
    for (index_t p = 0; p < pn; ++p) o[p] = from_float<S>(static_cast<float>(acc[p]));
  }
};

}  // namespace detail

inline int kmeans_tree_height(index_t num_classes, const kmeans_tree_options& options) {
  constexpr const char* where = "kmeans_tree_height";
  detail::expects(num_classes >= 1, where, ": num_classes = ", num_classes, " must be >= 1");
  detail::check_kmeans_tree_options(where, options);
  int height = 1;
  for (index_t n = num_classes; detail::kmeans_tree_splits(n, height - 1, options); ++height)
    n = (n + options.branching - 1) / options.branching;  // the largest cluster: ceil(n / b) >= 2
  return height;
}

template <class Backend, int MaxDepth, class T>
runtime_tree<MaxDepth> kmeans_label_tree(matrix_view<const T> class_vectors, const kmeans_tree_options& options,
                                         const backend_resources<Backend>& resources) {
  return kmeans_label_tree_on<MaxDepth>(detail::execution<Backend>{resources}, class_vectors, options);
}

template <int MaxDepth, class Ex, class T>
runtime_tree<MaxDepth> kmeans_label_tree_on(const Ex& ex_in, matrix_view<const T> class_vectors,
                                            const kmeans_tree_options& o) {
  constexpr const char* where = "kmeans_label_tree";
  detail::check_class_vectors(where, class_vectors);
  detail::check_kmeans_tree_options(where, o);
  const index_t n = class_vectors.rows, d = class_vectors.cols, b = o.branching;
  const int height = kmeans_tree_height(n, o);
  detail::expects<tree_error>(height <= MaxDepth, where, ": the tree over N = ", n, " classes with branching ", b,
                              " and max_depth ", o.max_depth, " has height ", height, " > MaxDepth = ", MaxDepth,
                              " (set options.max_depth, a larger branching or runtime_tree<MaxDepth>)");
  (void)detail::checked_product<index_t>(where, "N x d", n, d, sizeof(float));
  (void)detail::checked_product<index_t>(where, "N x branching", n, b, sizeof(float));
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  using float_vector = typename execution_type::template vector<float>;
  using index_vector = typename execution_type::template vector<index_t>;
  detail::check_finite_class_vectors(where, ex, class_vectors);
  const auto& hx = detail::kmeans_tree_host_side(ex);

  // Node 0 is the root; nodes are numbered as they are created, the children of a node together
  // and in cluster order (which fixes their order in the tree).
  std::vector<index_t> parent{-1}, leaf_class{-1};
  parent.reserve(static_cast<std::size_t>(2 * n + 1));
  leaf_class.reserve(parent.capacity());
  const auto new_node = [&](index_t up, index_t cls) {
    parent.push_back(up);
    leaf_class.push_back(cls);
    return static_cast<index_t>(parent.size() - 1);
  };
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), index_t(0));
  std::vector<detail::kmeans_tree_segment> pending;
  if (detail::kmeans_tree_splits(n, 0, o)) {
    pending.push_back({0, n, 0});
  } else {
    for (index_t c = 0; c < n; ++c) new_node(0, c);
  }
  if (pending.empty()) return runtime_tree<MaxDepth>::from_parents(std::move(parent), std::move(leaf_class), n);

  // fp32 copy (unit rows when spherical) in class order: the root level's order. Each next level's
  // rows are gathered from the level before (`xa`, `xb` in turn), moving rows only within their
  // node's segment, which stays in cache once segments are small.
  float_vector xa(static_cast<std::size_t>(n * d)), xb;
  detail::widen_rows(ex, class_vectors, 0, n, nullptr, detail::raw(xa));
  if (o.spherical) detail::unit_rows(ex, detail::raw(xa), n, d);
  const float* xp = detail::raw(xa);
  bool in_xa = true;

  float_vector c, hn, s;
  index_vector source_x, from_x, segment_x, node_x, assign_x;
  typename execution_type::template vector<double> sum;
  typename execution_type::template vector<unsigned char> active_x;
  std::vector<unsigned char> active;
  std::vector<float> s_host, hn_host;
  std::vector<index_t> from, segment, node_of, assign, member, last_member, idx, room, grouped, next_order, source;
  std::vector<float> key;
  std::vector<unsigned char> mark;
  std::vector<detail::host::gemm_args> gemm_of, gemms;
  std::vector<index_t> gemm_node;
  std::vector<detail::kmeans_tree_segment> next;
  for (int level = 0; !pending.empty(); ++level) {
    const index_t nodes = static_cast<index_t>(pending.size()), k = nodes * b, nl = pending.back().end;

    // Segments, the scoring plan, the initial centroids (host decisions on sizes only).
    segment.resize(static_cast<std::size_t>(nodes + 1));
    node_of.assign(static_cast<std::size_t>(nl), -1);
    from.resize(static_cast<std::size_t>(k));
    mark.assign(static_cast<std::size_t>(nl), 0);
    c.resize(static_cast<std::size_t>(k * d));
    hn.resize(static_cast<std::size_t>(o.spherical ? 0 : k));
    s.resize(static_cast<std::size_t>(nl * b));
    float* cp = detail::raw(c);
    float* hp = o.spherical ? nullptr : detail::raw(hn);
    float* sp = detail::raw(s);
    gemm_of.clear();
    gemm_node.clear();
    bool any_small = false;
    for (index_t t = 0; t < nodes; ++t) {
      const auto& g = pending[static_cast<std::size_t>(t)];
      segment[static_cast<std::size_t>(t)] = g.begin;
      const index_t len = g.end - g.begin;
      if (detail::kmeans_tree_uses_gemm(len, b)) {
        detail::host::gemm_args a;
        a.op_b = detail::host::op::transpose;
        a.m = len;
        a.n = b;
        a.k = d;
        a.a = xp + g.begin * d;
        a.lda = d;
        a.b = cp + t * b * d;
        a.ldb = d;
        a.c = sp + g.begin * b;
        a.ldc = b;
        gemm_of.push_back(a);
        gemm_node.push_back(t);
      } else {
        any_small = true;
        std::fill(node_of.begin() + g.begin, node_of.begin() + g.end, t);
      }
    }
    segment[static_cast<std::size_t>(nodes)] = nl;
    const detail::kmeans_tree_segment* pend = pending.data();
    unsigned char* mk = mark.data();
    index_t* fr = from.data();
    const unsigned long long seed = o.seed;
    detail::parallel_for(hx, nodes, [=](index_t t) {
      const detail::kmeans_tree_segment g = pend[t];
      detail::kmeans_tree_pick(seed, g.id, g.begin, g.end - g.begin, b, mk, fr + t * b);
    });
    detail::parallel_for(ex, k,
                         detail::kmeans_tree_seed{xp, detail::kmeans_tree_on_backend(ex, from, from_x), d, cp, hp});
    const index_t* segment_b = detail::kmeans_tree_on_backend(ex, segment, segment_x);
    const index_t* node_b = any_small ? detail::kmeans_tree_on_backend(ex, node_of, node_x) : nullptr;

    // Rounds: scores, balanced assignment; then (but after the last scoring) the centroid update.
    // A node whose assignment equals its previous round's has reached a fixed point (same members,
    // same centroids, same scores): it leaves the rounds (inactive) with the assignment the
    // remaining rounds would give it.
    active.assign(static_cast<std::size_t>(nodes), 1);
    assign.resize(static_cast<std::size_t>(nl));
    member.resize(static_cast<std::size_t>(nl));
    last_member.resize(static_cast<std::size_t>(nl));
    key.resize(static_cast<std::size_t>(nl));
    idx.resize(static_cast<std::size_t>(nl));
    room.resize(static_cast<std::size_t>(k));
    const index_t blocks = (d + detail::kmeans_tree_columns - 1) / detail::kmeans_tree_columns;
    sum.resize(static_cast<std::size_t>(o.iterations > 0 ? k * d : 0));
    double* sums = detail::raw(sum);
    for (index_t it = 0;; ++it) {
      const unsigned char* active_b = detail::kmeans_tree_on_backend(ex, active, active_x);
      gemms.clear();
      for (std::size_t q = 0; q < gemm_of.size(); ++q)
        if (active[static_cast<std::size_t>(gemm_node[q])]) gemms.push_back(gemm_of[q]);
      if (gemms.size() == 1) {
        detail::gemm(ex, gemms[0]);
      } else if (!gemms.empty()) {
        detail::gemm_batch(ex, gemms.data(), static_cast<index_t>(gemms.size()));
      }
      if (any_small) detail::parallel_for(ex, nl, detail::kmeans_tree_small_scores{xp, cp, node_b, active_b, d, b, sp});
      const float* sh = detail::kmeans_tree_on_host(ex, s, s_host);
      const float* hh = hp ? detail::kmeans_tree_on_host(ex, hn, hn_host) : nullptr;
      index_t* as = assign.data();
      index_t* mb = member.data();
      float* ky = key.data();
      index_t* ix = idx.data();
      index_t* rm = room.data();
      index_t* lm = last_member.data();
      unsigned char* ac = active.data();
      const index_t* sg = segment.data();
      const bool first_round = it == 0;
      detail::parallel_for(hx, nodes, [=](index_t t) {
        if (!ac[t]) return;
        detail::kmeans_tree_balanced_assign(sh, hh, b, t, sg[t], sg[t + 1], as, mb, ky, ix, rm + t * b);
        if (!first_round && std::equal(mb + sg[t], mb + sg[t + 1], lm + sg[t])) ac[t] = 0;
        else std::copy(mb + sg[t], mb + sg[t + 1], lm + sg[t]);
      });
      if (it == o.iterations || std::find(active.begin(), active.end(), 1) == active.end()) break;
      const index_t* assign_b = detail::kmeans_tree_on_backend(ex, assign, assign_x);
      const unsigned char* still_b = detail::kmeans_tree_on_backend(ex, active, active_x);
      detail::parallel_for(ex, nodes * blocks,
                           detail::kmeans_tree_centroid_sums{xp, assign_b, segment_b, still_b, d, b, sums, cp});
      detail::parallel_for(ex, k, detail::kmeans_tree_centroid_finish{still_b, cp, d, b, o.spherical, hp});
    }

    // Children in cluster order (the classes of cluster j: `member`'s j-th range of the node).
    grouped.resize(static_cast<std::size_t>(nl));
    for (index_t i = 0; i < nl; ++i)
      grouped[static_cast<std::size_t>(i)] = order[static_cast<std::size_t>(member[static_cast<std::size_t>(i)])];
    next_order.clear();
    source.clear();
    next.clear();
    for (index_t t = 0; t < nodes; ++t) {
      const auto g = pending[static_cast<std::size_t>(t)];
      const index_t len = g.end - g.begin;
      index_t first_child = -1;
      for (index_t j = 0, pos = g.begin; j < b; ++j) {
        const index_t size = detail::kmeans_tree_cluster_size(len, b, j);
        const index_t child = new_node(g.id, size == 1 ? grouped[static_cast<std::size_t>(pos)] : -1);
        if (j == 0) first_child = child;
        pos += size;
      }
      for (index_t j = 0, pos = g.begin; j < b; ++j) {
        const index_t size = detail::kmeans_tree_cluster_size(len, b, j), child = first_child + j;
        if (size >= 2) {
          if (detail::kmeans_tree_splits(size, level + 1, o)) {
            const auto start = static_cast<index_t>(next_order.size());
            next.push_back({start, start + size, child});
            next_order.insert(next_order.end(), grouped.begin() + pos, grouped.begin() + pos + size);
            source.insert(source.end(), member.begin() + pos, member.begin() + pos + size);
          } else {
            for (index_t q = pos; q < pos + size; ++q) new_node(child, grouped[static_cast<std::size_t>(q)]);
          }
        }
        pos += size;
      }
    }
    pending.swap(next);
    order.swap(next_order);
    if (!pending.empty()) {  // the next level's rows: row i = this level's row source[i]
      float_vector& to = in_xa ? xb : xa;
      const auto next_n = static_cast<index_t>(source.size());
      if (static_cast<index_t>(to.size()) < next_n * d) to.resize(static_cast<std::size_t>(next_n * d));
      detail::copy_listed_rows(ex, xp, d, detail::kmeans_tree_on_backend(ex, source, source_x), next_n,
                               detail::raw(to));
      xp = detail::raw(to);
      in_xa = !in_xa;
    }
  }
  return runtime_tree<MaxDepth>::from_parents(std::move(parent), std::move(leaf_class), n);
}

template <class Backend, class Tree, class T, class S, class NodeForm>
void init_tree_weights_from_class_vectors(const Tree& tree, matrix_view<const T> class_vectors,
                                          matrix_view<S> weights, NodeForm node_form,
                                          const backend_resources<Backend>& resources) {
  init_tree_weights_from_class_vectors_on(detail::execution<Backend>{resources}, tree, class_vectors, weights,
                                          node_form);
}

template <class Ex, class Tree, class T, class S, class NodeForm>
void init_tree_weights_from_class_vectors_on(const Ex& ex_in, const Tree& tree, matrix_view<const T> class_vectors,
                                             matrix_view<S> weights, NodeForm) {
  static_assert(std::is_same_v<NodeForm, softmax_nodes> || std::is_same_v<NodeForm, sigmoid_nodes>,
                "xsoftmax: init_tree_weights_from_class_vectors: NodeForm must be softmax_nodes or sigmoid_nodes");
  constexpr bool sigmoid = std::is_same_v<NodeForm, sigmoid_nodes>;
  constexpr const char* where = "init_tree_weights_from_class_vectors";
  const auto tv = tree.view();
  const index_t n = tv.num_classes(), rows = tv.num_rows(), d = class_vectors.cols;
  const index_t out_rows = sigmoid ? rows / 2 : rows;
  detail::check_class_vectors(where, class_vectors);
  detail::expects<shape_error>(class_vectors.rows == n, where, ": class_vectors has ", class_vectors.rows,
                               " rows but the tree has ", n, " classes");
  detail::expects<shape_error>(weights.rows == out_rows && weights.cols == d, where, ": weights is ", weights.rows,
                               " x ", weights.cols, ", expected ", out_rows, " x ", d, " (",
                               sigmoid ? "num_rows / 2 = one row per internal node" : "num_rows = one row per edge",
                               ", class_vectors' width)");
  detail::expects(weights.data != nullptr, where, ": weights.data is null");
  detail::expects<shape_error>(weights.stride >= weights.cols, where, ": weights.stride = ", weights.stride,
                               " is smaller than its cols = ", weights.cols);
  // Leaf ranks below each row: [first, last), from the paths (O(sum of depths)).
  std::vector<index_t> order(static_cast<std::size_t>(n)), first(static_cast<std::size_t>(rows), n),
      last(static_cast<std::size_t>(rows), 0), count(static_cast<std::size_t>(rows), 0);
  for (index_t cls = 0; cls < n; ++cls) {
    const index_t rank = tv.leaf_rank(cls);
    order[static_cast<std::size_t>(rank)] = cls;
    for (int l = 0; l < tv.depth(cls); ++l) {
      const path_step st = tv.step(cls, l);
      if constexpr (sigmoid)
        detail::expects<tree_error>(st.block_size == 2, where, ": the node at level ", l, " on class ", cls,
                                    "'s path has ", st.block_size,
                                    " children; sigmoid_nodes need a binary tree (every node exactly 2)");
      const auto r = static_cast<std::size_t>(st.block_begin + st.child);
      first[r] = std::min(first[r], rank);
      last[r] = std::max(last[r], rank + 1);
      ++count[r];
    }
  }
  for (index_t r = 0; r < rows; ++r) {
    const auto q = static_cast<std::size_t>(r);
    if (count[q] == 0) first[q] = last[q] = 0;
    detail::expects<tree_error>(last[q] - first[q] == count[q], where, ": the classes below row ", r,
                                " are not a contiguous range of leaf ranks (not a valid tree)");
  }
  (void)detail::checked_product<index_t>(where, "N x d", n, d, sizeof(float));
  const auto& ex = detail::as_execution(ex_in);
  using execution_type = std::decay_t<decltype(ex)>;
  detail::check_finite_class_vectors(where, ex, class_vectors);
  typename execution_type::template vector<index_t> order_x, first_x, last_x;
  typename execution_type::template vector<float> leaf_rows(static_cast<std::size_t>(n * d));
  detail::parallel_for(ex, n,
                       detail::rows_in_leaf_order<T>{class_vectors, detail::kmeans_tree_on_backend(ex, order, order_x),
                                                     detail::raw(leaf_rows)});
  const index_t* fb = detail::kmeans_tree_on_backend(ex, first, first_x);
  const index_t* lb = detail::kmeans_tree_on_backend(ex, last, last_x);
  const index_t blocks = (d + detail::kmeans_tree_columns - 1) / detail::kmeans_tree_columns;
  detail::parallel_for(ex, out_rows * blocks,
                       detail::subtree_mean_rows<S>{detail::raw(leaf_rows), fb, lb, sigmoid, weights});
  execution_type::ops::synchronize(ex.res);
}

}  // namespace xsoftmax
