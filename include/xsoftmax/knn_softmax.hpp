// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `knn_softmax`: Alibaba's KNN softmax for 100M classes, a `selective_softmax` whose active set is
/// the union of the batch targets' K nearest classes in a graph over the class weight vectors,
/// with the graph built from the head's own weights at construction and updated every
/// `rebuild_every` training steps (`next_step()`): rebuilt, or refreshed from its last lists
/// between rebuilds (`knn_options::refreshes_between_rebuilds`).

#include <xsoftmax/selection/knn_selector.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include <utility>

namespace xsoftmax {

/// KNN softmax over `num_classes` classes of width `dim`. Training step:
/// `forward_backward`, `apply_sgd` (or the caller's optimiser on `weights()`), `next_step()`.
/// With graph K = N the active set is every class and the head equals `full_softmax`.
/// Prediction (`topk`, `log_distribution`) scores every class.
///
/// Throws as `selective_softmax` and `knn_selector`; the constructors throw `invalid_argument`
/// naming the value when graph k is outside [1, num_classes].
///
/// \tparam Sharding `no_sharding` or `class_sharding<Communicator>` (see `selective_softmax`).
///                  Sharded over a communicator with the ring step `shift` (MPI, NCCL, solo; see
///                  class_sharding.hpp), the exact graph is built round a ring: each rank scores its
///                  own classes against every rank's weight block as the blocks pass (S - 1 steps of
///                  one block to the next rank; each rank receives (N - N/S) x dim floats in all) and
///                  keeps only its own classes' graph rows (`graph().held_rows()` = local_classes():
///                  12 K bytes per local class; never the N x dim matrix nor the N x K graph). Each
///                  selection then gathers its targets' neighbour rows from their owners (one
///                  all-gather of rows x neighbors_used ids). The result is bitwise the unsharded
///                  graph (same neighbours, same order and similarities). The IVF method gathers the
///                  whole weight matrix round the ring (transiently N x dim x (4 + sizeof(storage))
///                  bytes per rank) and every rank builds and holds the whole graph, as before.
///                  Without `shift` (the PyTorch package's communicator) the weights are all-gathered
///                  (N x dim per rank, transiently), each rank finds its own classes' rows, and the
///                  whole graph is all-gathered to every rank (12 N K bytes per rank). A graph built
///                  elsewhere can be given instead: `selective_softmax<knn_selector, P, B,
///                  class_sharding<C>>` with `knn_selector(graph, options)` (the whole graph).
template <class Precision = fp32, class Backend = serial, class Sharding = no_sharding>
class knn_softmax : public selective_softmax<knn_selector, Precision, Backend, Sharding> {
  using base = selective_softmax<knn_selector, Precision, Backend, Sharding>;

 public:
  using typename base::storage_type;

  /// Owns weights initialised per `init` (a zero bias when `with_bias`) and builds their graph.
  knn_softmax(index_t num_classes, index_t dim, knn_options options = {}, bool with_bias = false,
              init_options init = {}, backend_resources<Backend> resources = {})
      : base(knn_selector(options), num_classes, dim, with_bias, init, resources), resources_(resources) {
    rebuild_graph();
  }

  /// Attaches to a caller's `weights` (num_classes x dim) and optional `bias`, and builds their
  /// graph (from the weights only; the bias plays no part in the neighbourhoods).
  explicit knn_softmax(matrix_view<storage_type> weights, knn_options options = {}, storage_type* bias = nullptr,
                       backend_resources<Backend> resources = {})
      : base(knn_selector(options), weights, bias, resources), resources_(resources) {
    rebuild_graph();
  }

  /// Sharded (collective): owns this rank's local weights, initialised per `init` with seed
  /// `init.seed + rank`, and builds the graph (its own classes' rows, or every row; see above).
  knn_softmax(Sharding sharding, index_t dim, knn_options options = {}, bool with_bias = false,
              init_options init = {}, backend_resources<Backend> resources = {})
      : base(knn_selector(options), std::move(sharding), dim, with_bias, init, resources), resources_(resources) {
    rebuild_graph();
  }

  /// Sharded (collective): attaches to this rank's `local_weights` (local_classes() x dim) and
  /// `local_bias`, and builds the graph (its own classes' rows, or every row; see above).
  knn_softmax(Sharding sharding, matrix_view<storage_type> local_weights, knn_options options = {},
              storage_type* local_bias = nullptr, backend_resources<Backend> resources = {})
      : base(knn_selector(options), std::move(sharding), local_weights, local_bias, resources), resources_(resources) {
    rebuild_graph();
  }

  /// The current graph (sharded through the ring: this rank's classes' rows only).
  [[nodiscard]] const knn_graph& graph() const { return this->selector().graph(); }

  /// Rebuilds the graph from the current weights now (into the same buffers). Sharded: collective.
  void rebuild_graph() {
    this->with_all_weights_([&](matrix_view<const storage_type> w, const knn_build_share* share) {
      this->selector().rebuild(detail::execution<Backend>{resources_}, w, share);
    });
  }

  /// Refreshes the graph from its last lists for the current weights now (`knn_graph_builder::refresh`:
  /// neighbours-of-neighbours passes, cheaper than a rebuild). Sharded: collective; throws
  /// `invalid_argument` when the graph holds only this rank's rows (exact method on a ring).
  void refresh_graph() {
    this->with_all_weights_([&](matrix_view<const storage_type> w, const knn_build_share* share) {
      this->selector().refresh(detail::execution<Backend>{resources_}, w, share);
    });
  }

 private:
  backend_resources<Backend> resources_;
};

}  // namespace xsoftmax
