// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `knn_softmax`: Alibaba's KNN softmax for 100M classes, a `selective_softmax` whose active set is
/// the union of the batch targets' K nearest classes in a graph over the class weight vectors,
/// with the graph built from the head's own weights at construction and rebuilt every
/// `rebuild_every` training steps (`next_step()`).

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
/// \tparam Sharding `no_sharding` or `class_sharding<Communicator>` (see `selective_softmax`). Sharded,
///                  every rank holds the whole graph (N x K ids and similarities: 12 N K bytes per
///                  rank, 1.2 GB for N = 10M, K = 10). At construction, `rebuild_graph()` and each
///                  scheduled rebuild the whole weight matrix is all-gathered (transiently
///                  N x dim x (4 + sizeof(storage)) bytes per rank); with the exact method each rank
///                  finds the neighbours of its own classes (1/S of the O(N^2 d) work) and the rows
///                  are all-gathered; with the IVF method every rank builds the whole graph. A
///                  graph built elsewhere can be given instead: `selective_softmax<knn_selector, P,
///                  B, class_sharding<C>>` with `knn_selector(graph, options)`.
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
  /// `init.seed + rank`, and builds the graph of every class.
  knn_softmax(Sharding sharding, index_t dim, knn_options options = {}, bool with_bias = false,
              init_options init = {}, backend_resources<Backend> resources = {})
      : base(knn_selector(options), std::move(sharding), dim, with_bias, init, resources), resources_(resources) {
    rebuild_graph();
  }

  /// Sharded (collective): attaches to this rank's `local_weights` (local_classes() x dim) and
  /// `local_bias`, and builds the graph of every class.
  knn_softmax(Sharding sharding, matrix_view<storage_type> local_weights, knn_options options = {},
              storage_type* local_bias = nullptr, backend_resources<Backend> resources = {})
      : base(knn_selector(options), std::move(sharding), local_weights, local_bias, resources), resources_(resources) {
    rebuild_graph();
  }

  /// The current graph.
  [[nodiscard]] const knn_graph& graph() const { return this->selector().graph(); }

  /// Rebuilds the graph from the current weights now (into the same buffers). Sharded: collective.
  void rebuild_graph() {
    this->with_all_weights_([&](matrix_view<const storage_type> w, const knn_build_share* share) {
      this->selector().rebuild(detail::execution<Backend>{resources_}, w, share);
    });
  }

 private:
  backend_resources<Backend> resources_;
};

}  // namespace xsoftmax
