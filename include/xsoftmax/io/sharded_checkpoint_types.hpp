// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The names and the layout record of a sharded checkpoint (see io/sharded_checkpoint.hpp): plain
/// types usable without the checkpoint code.

#include <xsoftmax/precision.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace xsoftmax {

/// The manifest file of a sharded checkpoint directory.
inline constexpr const char* sharded_checkpoint_manifest_file = "manifest.safetensors";

/// "shard-00002-of-00004.safetensors": the head file of shard `shard` (0-based) of `shards`.
[[nodiscard]] inline std::string sharded_checkpoint_shard_file(index_t shard, index_t shards) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05lld-of-%05lld.safetensors", static_cast<long long>(shard),
                static_cast<long long>(shards));
  return name;
}

/// "optimizer-shard-00002-of-00004.safetensors": the optimizer file of shard `shard` of `shards`.
[[nodiscard]] inline std::string sharded_checkpoint_optimizer_file(index_t shard, index_t shards) {
  return "optimizer-" + sharded_checkpoint_shard_file(shard, shards);
}

/// What a sharded checkpoint's manifest records: the head's shape, each shard's class range, and
/// the rule of the optimizer saved with it (if any).
struct sharded_checkpoint_layout {
  index_t num_classes = 0;           ///< N
  index_t dim = 0;                   ///< d
  std::string precision;             ///< storage type's `element_name` ("fp32", "bf16", "fp16")
  bool has_bias = false;
  std::vector<index_t> class_bounds; ///< S + 1 bounds: shard s holds [class_bounds[s], class_bounds[s + 1])
  std::string optimizer;             ///< the optimizer rule's name (`Rule::name`); empty: no optimizer files

  /// S, the number of shards.
  [[nodiscard]] index_t shards() const { return static_cast<index_t>(class_bounds.size()) - 1; }

  /// The layout of `sharding` (its ranks' ranges) for a head of `dim` and storage `T`.
  template <class T, class Comm>
  [[nodiscard]] static sharded_checkpoint_layout of(const class_sharding<Comm>& sharding, index_t dim, bool has_bias) {
    sharded_checkpoint_layout l{sharding.num_classes(), dim, element_name<T>(), has_bias, {}, {}};
    for (int r = 0; r <= sharding.size(); ++r) l.class_bounds.push_back(sharding.shard_begin(r));
    return l;
  }
};

}  // namespace xsoftmax
