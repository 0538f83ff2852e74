// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Label trees from class vectors, for the hierarchical softmax:
///  * `kmeans_label_tree`: a `runtime_tree` built by *balanced hierarchical k-means* over one vector
///    per class (class embeddings, or the weight rows of a full softmax trained for a while), the
///    way extreme multi-label trees are built (Parabel's balanced 2-means, Bonsai's wider k-means,
///    napkinXC's probabilistic label trees). Classes that are close end up under the same nodes,
///    so a node's softmax separates groups of similar classes, which is what makes a hierarchical
///    softmax over it learn nearly as well as the full softmax.
///  * `init_tree_weights_from_class_vectors`: the weight rows of a hierarchical softmax over such a
///    (new) tree from the class vectors: each row the mean of the class vectors beneath its child,
///    so re-building the tree from trained weights does not start the new head from scratch.
///
/// The clustering runs on a backend (`serial`, `omp`, `cuda`) with the library's generic
/// primitives (the backend's GEMM for the scores of large nodes, parallel loops for the rest and
/// for the centroid updates); the balanced assignment and the tree bookkeeping are host code.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/types.hpp>

namespace xsoftmax {

/// Options of `kmeans_label_tree`.
struct kmeans_tree_options {
  /// b >= 2: the clusters each node is split into (the children of every internal node that is
  /// not at the depth limit, except that a node of at most b classes has its classes as children).
  index_t branching = 2;
  /// Limit on depth(c), the internal nodes on any class's path; 0: none (nodes are split until
  /// every node has at most b classes beneath it, depth ceil(log_b N)). With a limit L, the nodes
  /// at level L - 1 take all their classes as children (L = 2, b = ceil(sqrt(N)): the two-level
  /// sqrt(N) tree; L = 1: one flat softmax).
  int max_depth = 0;
  /// Balanced k-means rounds per node (each: scores, balanced assignment, centroid update), after
  /// which the classes are assigned once more to the final centroids. 0: the classes are assigned
  /// (balanced) to the seeded initial centroids only.
  index_t iterations = 8;
  /// true: spherical k-means (cosine): class vectors and centroids scaled to unit length, scores
  /// are inner products; the usual choice for class embeddings and softmax weights, whose norms
  /// mostly carry class frequency. false: Euclidean k-means (score x . c - |c|^2 / 2).
  bool spherical = true;
  /// Seeds each node's initial centroids (distinct classes of the node, drawn by a counter-based
  /// generator of (seed, node)).
  unsigned long long seed = 0;
};

/// Height (the largest depth(c)) of the tree `kmeans_label_tree` builds over `num_classes` classes
/// with `options`; it depends on N and the options only, not on the vectors: a node of n classes
/// is split iff n > b and it is above the depth limit, its clusters have ceil(n / b) or
/// floor(n / b) classes, so the height is ceil(log_b N) without a limit (1 for N <= b) and
/// min(that, max_depth) with one. For choosing the tree's MaxDepth. O(height). Throws
/// `invalid_argument` (naming the value) for num_classes < 1 and for the option errors listed at
/// `kmeans_label_tree`.
[[nodiscard]] inline int kmeans_tree_height(index_t num_classes, const kmeans_tree_options& options);

/// A label tree over the N classes whose vectors are the rows of `class_vectors` (N x d, element
/// type fp32, bf16 or fp16, in `Backend`'s memory), by balanced hierarchical k-means:
///
///  * every node of n > b classes (above the depth limit) is split into b clusters of sizes
///    ceil(n / b) or floor(n / b) (the first n mod b clusters have the larger size): b distinct
///    classes of the node, drawn from (seed, node), are the initial centroids; then `iterations`
///    rounds of scores (each class against its node's b centroids), a *balanced assignment* and a
///    centroid update (mean of the members, unit length when spherical), then a last scoring and
///    balanced assignment to the final centroids (a node whose assignment comes out as in the
///    round before has reached a fixed point and stops there, with the same result);
///  * the balanced assignment fills the clusters to exactly those sizes: for b = 2, Parabel's rule
///    (the ceil(n / 2) classes with the largest score difference s0 - s1 go to cluster 0, the rest
///    to 1, which maximises the total score among balanced splits); for b > 2, greedily by
///    confidence (classes in decreasing order of the margin between their best and second-best
///    centroid, each to its best cluster that still has room);
///  * cluster j becomes child j of the node: a leaf when it holds one class, else an internal node
///    that is split in turn, or that takes its classes as leaf children when it has at most b of
///    them or sits at the depth limit (leaves there in the order of the last level's clustering);
///  * a root of N <= b classes (or max_depth = 1) takes all classes as children; N = 1 gives a root
///    with one leaf.
///
/// So sibling subtrees differ by at most one class, every class's depth is the height or one less
/// (height from `kmeans_tree_height`), and similar classes share deep ancestors. Children are in
/// cluster order, which fixes the tree's leaf order. Leaves, blocks and rows are laid out as for
/// any `runtime_tree`.
///
/// Deterministic: the same tree for the same vectors and options on every run and every thread
/// count of a backend, and `serial` and `omp` give the same tree (the same GEMM and loops; scores
/// are summed in an order that does not depend on the threads). On `cuda` the tree is equally
/// reproducible, but cuBLAS rounds the large nodes' scores differently from the host GEMM, so
/// classes whose scores tie to within rounding may be placed differently than on the host.
///
/// Cost: each level of the tree scores every class of a node being split against b centroids at
/// most (iterations + 1) times and updates the centroids at most `iterations` times: O(N d b
/// (iterations + 1)) multiply-adds per level, O(N d b (iterations + 1) log_b N) in all, plus the
/// host's balanced assignment (O(n) per node and round for b = 2, O(n (b + log n)) for b > 2).
/// Large nodes are scored by the backend's GEMM, small ones by a loop; the passes are memory-bound
/// (each reads the level's N x d rows). Measured on a 2-core host shared with other builds (load
/// average about 4.5; omp, 2 threads, OpenBLAS, d = 64, 8 iterations, random Gaussian vectors):
/// N = 1e5 in 2.6 s (b = 2) and 1.0 s (b = 32), N = 1e6 in 30 s and 12 s. Memory on the backend:
/// two fp32 copies of the vectors (N x d each: the current level's rows and the next level's),
/// N x b scores, the level's centroids (fewer than N x d floats) and their sums (fewer than N x d
/// doubles); on the host O(N b) scores (a copy, on a device backend) and O(N) indices.
///
/// Throws (before any work, naming the argument and value): `invalid_argument` for N < 1, d < 1,
/// null data, branching < 2, max_depth < 0, iterations < 0; `shape_error` for a stride < d;
/// `non_finite_error` naming the row, column and value of a NaN or infinite element; `tree_error`
/// when the height exceeds MaxDepth.
template <class Backend = serial, int MaxDepth = 64, class T>
[[nodiscard]] runtime_tree<MaxDepth> kmeans_label_tree(matrix_view<const T> class_vectors,
                                                       const kmeans_tree_options& options = {},
                                                       const backend_resources<Backend>& resources = {});

/// `kmeans_label_tree` on an execution (`detail::execution<Backend>`) or a Thrust host policy
/// (`thrust::cpp::par`, `thrust::omp::par`); `class_vectors` in its memory.
template <int MaxDepth = 64, class Ex, class T>
[[nodiscard]] runtime_tree<MaxDepth> kmeans_label_tree_on(const Ex& ex, matrix_view<const T> class_vectors,
                                                          const kmeans_tree_options& options = {});

/// Initialises the weights of a `hierarchical_softmax<Tree, ..., NodeForm>` over `tree` (a new
/// tree, say one built by `kmeans_label_tree` from a full softmax's weights or from the weights of
/// a head over an older tree) from one vector per class (`class_vectors`, N x d: class
/// embeddings, or trained per-class weights), so that a node's scores start where the classes
/// beneath its children are:
///
///  * `softmax_nodes` (`weights`: tree.num_rows() x d): row r (the row of the edge into child v
///    of some node) = the mean of the vectors of the classes in v's subtree (for a leaf child, the
///    class's own vector). Then h . row = the mean of the logits h . x_c of the subtree's classes.
///  * `sigmoid_nodes` (`weights`: tree.num_rows() / 2 x d, binary trees only): row k (internal node
///    k, the one whose block starts at row 2k) = mean(first child's subtree) - mean(second child's
///    subtree), so that sigmoid(h . row) is the softmax over the two children with the softmax
///    form's rows.
///
/// Rows no class's path passes through (masked padding of a `uniform_tree`) are set to zero. Means
/// are summed in double in leaf order and rounded once to the storage type `S` (fp32, bf16, fp16).
/// For a bias, call it again with the class biases as an N x 1 matrix and the head's bias as an
/// R x 1 matrix (R = the weight rows): each node's bias becomes the mean (softmax nodes) or the
/// difference of means (sigmoid nodes) of the biases beneath it.
///
/// `Tree` is any tree shape whose view the host can read (`runtime_tree`, forests included, and
/// `uniform_tree`); `class_vectors` and `weights` are in `Backend`'s memory. Deterministic, the
/// same on every thread count. Cost: O(d * sum of depth(c)) additions (every class vector is added
/// once per row on its path; O(N d log_b N) for a balanced tree) over an fp32 copy of the class
/// vectors in leaf order (N x d on the backend, so that each subtree is one contiguous run), and
/// O(N + R) host work and memory.
/// Throws, with nothing written: `shape_error` when class_vectors.rows != N, weights.cols !=
/// class_vectors.cols, weights.rows is not the count above, or a stride is smaller than its row;
/// `invalid_argument` for null data or d < 1; `tree_error` for `sigmoid_nodes` over a node without
/// exactly two children; `non_finite_error` naming the row, column and value of a NaN or infinite
/// class-vector element.
template <class Backend = serial, class Tree, class T, class S, class NodeForm = softmax_nodes>
void init_tree_weights_from_class_vectors(const Tree& tree, matrix_view<const T> class_vectors,
                                          matrix_view<S> weights, NodeForm node_form = {},
                                          const backend_resources<Backend>& resources = {});

/// `init_tree_weights_from_class_vectors` on an execution or a Thrust host policy; the matrices in
/// its memory.
template <class Ex, class Tree, class T, class S, class NodeForm = softmax_nodes>
void init_tree_weights_from_class_vectors_on(const Ex& ex, const Tree& tree, matrix_view<const T> class_vectors,
                                             matrix_view<S> weights, NodeForm node_form = {});

}  // namespace xsoftmax

#include <xsoftmax/tree/detail/kmeans_tree.inl>
