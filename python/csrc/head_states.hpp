// SPDX-License-Identifier: Apache-2.0
#pragma once
// The head states of the PyTorch bindings: what a handle made by a `create_*` function of the
// Python module holds (a tree, a sampler, a KNN configuration, a full softmax's score-cache budget),
// the cache of the head built over the caller's weight tensor (rebuilt when the tensor, its device
// or the stream changes), and the registry of live handles, shared by the CPU and CUDA operators.

#include "tensor_args.hpp"

#include <ATen/ATen.h>

#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selection/knn_selector.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace xsoftmax_torch {

using tree_type = xs::runtime_tree<64>;


/// What a cached head was built over; the head is rebuilt when any of it changes. The device type
/// also fixes the head's C++ type (its backend); a CUDA head's resources hold the stream it was
/// built on (torch's current stream then).
struct head_key {
  const void* weight = nullptr;
  const void* bias = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
  int dtype = -1;
  int device_type = -1, device_index = -1;
  const void* stream = nullptr;
  bool operator==(const head_key& o) const {
    return weight == o.weight && bias == o.bias && rows == o.rows && cols == o.cols && stride == o.stride &&
           dtype == o.dtype && device_type == o.device_type && device_index == o.device_index && stream == o.stream;
  }
};

inline head_key key_of(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, const void* stream) {
  head_key k;
  k.device_type = static_cast<int>(weight.device().type());
  k.device_index = weight.device().index();
  k.stream = stream;
  k.weight = weight.data_ptr();
  k.bias = bias.has_value() && bias->defined() ? bias->data_ptr() : nullptr;
  k.rows = weight.size(0);
  k.cols = weight.size(1);
  k.stride = weight.stride(0);
  k.dtype = static_cast<int>(weight.scalar_type());
  return k;
}

struct head_cache {
  head_key key;
  std::shared_ptr<void> head;
  bool fresh = false;  ///< true right after (re)construction
  /// A KNN head's graph rebuild (knn_rebuild), whatever the head's type; empty for other heads.
  std::function<void()> rebuild;

  template <class Head, class Make>
  Head& get(const head_key& k, Make&& make) {
    fresh = false;
    if (!head || !(key == k)) {
      rebuild = nullptr;
      head.reset();  // a KNN head may hold a large graph: free it before building the next
      head = std::shared_ptr<void>(make());
      key = k;
      fresh = true;
    }
    return *static_cast<Head*>(head.get());
  }
};

struct state {
  virtual ~state() = default;
  std::mutex mu;
  head_cache cache;
  /// The module's loss terms (label smoothing, z-loss, margin; `set_loss_terms`), applied by the
  /// loss operators on top of the call's reduction and ignore_index. Set once, before any call.
  xs::loss_options terms;
};

/// A full softmax with a score-cache budget other than the library's default, or solved in row
/// blocks (the head itself is a view made per call, like handle 0's).
/// A full softmax's training-step layout; both unset: the head's automatic plan
/// (`full_softmax::training_plan`).
struct full_state final : state {
  full_state(std::optional<int64_t> b, std::optional<int64_t> r) : score_cache_bytes(b), row_block(r) {}
  std::optional<int64_t> score_cache_bytes;
  std::optional<int64_t> row_block;
};

struct tree_state final : state {
  explicit tree_state(tree_type t, bool s) : tree(std::move(t)), sigmoid(s) {}
  tree_type tree;
  bool sigmoid;
};

struct sampled_state final : state {
  explicit sampled_state(xs::sampled_negatives s) : sampler(std::move(s)) {}
  xs::sampled_negatives sampler;
};

struct knn_state final : state {
  explicit knn_state(xs::knn_options o) : options(o) {}
  xs::knn_options options;
  int64_t built_step = 0;  ///< the step whose weights the graph was last built from
};

inline std::mutex registry_mutex;
inline std::unordered_map<int64_t, std::shared_ptr<state>>& registry() {
  static auto* r = new std::unordered_map<int64_t, std::shared_ptr<state>>();  // never destroyed
  return *r;
}
inline int64_t next_handle = 1;

inline int64_t register_state(std::shared_ptr<state> s) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const int64_t h = next_handle++;
  registry().emplace(h, std::move(s));
  return h;
}

inline std::shared_ptr<state> find_state(int64_t handle, const char* op) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(handle);
  TORCH_CHECK_VALUE(it != registry().end(), "xsoftmax::", op, ": head = ", handle,
                    " is not a live xsoftmax head handle (released, or made in another process)");
  return it->second;
}

inline void release_state(int64_t handle) {
  std::shared_ptr<state> s;  // destroyed outside the registry lock
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(handle);
  if (it != registry().end()) {
    s = std::move(it->second);
    registry().erase(it);
  }
}

}  // namespace xsoftmax_torch
