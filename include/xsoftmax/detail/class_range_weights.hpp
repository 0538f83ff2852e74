// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `class_range_weights`: what `full_softmax` and `selective_softmax` (and so `knn_softmax`) hold in
/// common — a contiguous range of classes' weight rows (all classes unsharded, this rank's range
/// under `class_sharding`), the sharding and the backend's resources — with their accessors and
/// constructors, written once for both heads.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/weight_store.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <utility>

namespace xsoftmax::detail {

/// The weights of a head over a contiguous class range, with the head's sharding and resources.
/// A base of the heads, which inherit its public accessors; the storage is protected for them.
///
/// \tparam Storage  the weights' element type (`float`, bf16, fp16).
/// \tparam Backend  `serial`, `omp` or `cuda`.
/// \tparam Sharding `no_sharding` or `class_sharding<Communicator>`.
template <class Storage, class Backend, class Sharding>
class class_range_weights {
 public:
  /// Every class of the head (all ranks' when sharded): targets and top-k classes are in [0, this).
  [[nodiscard]] index_t num_classes() const {
    if constexpr (is_class_sharding<Sharding>) return sharding_.num_classes();
    else return store_.rows();
  }
  /// The classes held here, [class_begin(), class_begin() + local_classes()): all of them unsharded.
  [[nodiscard]] index_t class_begin() const {
    if constexpr (is_class_sharding<Sharding>) return sharding_.class_begin();
    else return 0;
  }
  /// How many classes' rows are held here (num_classes() unsharded).
  [[nodiscard]] index_t local_classes() const { return store_.rows(); }
  /// The sharding policy (an empty `no_sharding` unsharded).
  [[nodiscard]] const Sharding& sharding() const { return sharding_; }
  /// Width of a hidden row and of a weight row.
  [[nodiscard]] index_t dim() const { return store_.cols(); }
  /// Whether the head has a bias per class.
  [[nodiscard]] bool has_bias() const { return store_.has_bias(); }
  /// The local weights (all of them unsharded): row i is class class_begin() + i.
  [[nodiscard]] matrix_view<Storage> weights() const { return store_.weights(); }
  /// The local bias (local_classes() entries), or null without one.
  [[nodiscard]] Storage* bias() const { return store_.bias(); }
  /// The backend's resources the head runs on (stream, handles, workspace on cuda).
  [[nodiscard]] const backend_resources<Backend>& resources() const { return resources_; }

 protected:
  /// Unsharded, owning: `num_classes x dim` weights initialised per `init`. Throws
  /// `invalid_argument` (naming `head`) when a size is not positive.
  class_range_weights(const char* head, index_t num_classes, index_t dim, bool with_bias, const init_options& init,
                      backend_resources<Backend> resources)
      : store_(head, num_classes, dim, with_bias, init), resources_(resources) {}
  /// Unsharded, attached to the caller's `weights` and `bias` (no copy).
  class_range_weights(const char* head, matrix_view<Storage> weights, Storage* bias,
                      backend_resources<Backend> resources)
      : store_(head, weights, bias), resources_(resources) {}
  /// Sharded, owning: this rank's `local_classes() x dim` weights initialised per `init` with seed
  /// `init.seed + rank` (not a slice of the unsharded initialisation).
  class_range_weights(const char* head, Sharding sharding, index_t dim, bool with_bias, init_options init,
                      backend_resources<Backend> resources)
      : sharding_(std::move(sharding)), resources_(resources) {
    init.seed += static_cast<unsigned long long>(sharding_.rank());
    store_ = weight_store<Storage, Backend>(head, sharding_.local_classes(), dim, with_bias, init);
  }
  /// Sharded, attached to this rank's `local_weights` and `local_bias`. Throws `shape_error` when
  /// local_weights.rows is not the rank's number of classes.
  class_range_weights(const char* head, Sharding sharding, matrix_view<Storage> local_weights, Storage* local_bias,
                      backend_resources<Backend> resources)
      : sharding_(std::move(sharding)), store_(head, local_weights, local_bias), resources_(resources) {
    expects<shape_error>(local_weights.rows == sharding_.local_classes(), head, ": local_weights has ",
                         local_weights.rows, " rows, but rank ", sharding_.rank(), " holds ", sharding_.local_classes(),
                         " classes [", sharding_.class_begin(), ", ", sharding_.class_end(), ")");
  }

  Sharding sharding_;
  weight_store<Storage, Backend> store_;
  backend_resources<Backend> resources_;
};

}  // namespace xsoftmax::detail
