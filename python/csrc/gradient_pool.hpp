// SPDX-License-Identifier: Apache-2.0
//
// The host weight gradients of the operators, reused between calls. An operator returns its weight
// gradient as tensors over the gradient object's buffers (`gradient_tensors`, no copy); a fresh
// object per call meant a fresh N x d buffer per training step, which cost 58-76 ms at 1e5 x 256
// (page faults, zeroing and the free: 6-7 % of a full-softmax step on two Zen 4 cores;
// bench/tools/full_softmax_step.cpp's `fresh`, bench/RESULTS.md, "Full softmax on the CPU: the
// backward from the kept exponentials"). Once PyTorch has dropped every tensor over a pooled gradient (after
// `optimizer.zero_grad()`, the default `set_to_none=True`), the next call takes it again: emptied,
// so the head refills it exactly as a fresh one (its value-initialisation then writes pages already
// mapped). At most `kept_gradients` objects are pooled, each as large as the largest gradient it
// held; `xsoftmax.release_cached_gradients()` frees the idle ones. Device gradients are not pooled:
// their buffers come from torch's caching allocator (`torch_vector_memory`, set for the library's
// vectors when the extension loads: ops_cuda.cu), which already keeps freed blocks.

#pragma once

#include "tensor_args.hpp"

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace xsoftmax_torch {

/// Host gradient objects the pool keeps at most (two: a model with two heads, or one head whose
/// previous gradient is still held, e.g. accumulated in `.grad`, reuses without allocating).
inline constexpr std::size_t kept_gradients = 2;

/// The pool of `Backend`'s gradient objects (host backends only).
template <class Backend>
struct gradient_pool {
  std::mutex mu;
  std::vector<std::shared_ptr<gradient<Backend>>> kept;

  static gradient_pool& instance() {
    static auto* p = new gradient_pool();  // never destroyed: tensors may outlive static destruction
    return *p;
  }
};

/// A gradient object for one call: on a host backend an idle pooled one (no tensor over it any
/// more: the pool holds its only reference), emptied, else a new one, pooled while there is room.
/// Only the pool copies these pointers, so an idle object cannot be taken by a racing call.
template <class Backend>
std::shared_ptr<gradient<Backend>> call_gradient() {
  if constexpr (!xs::is_host_backend<Backend>) {
    return std::make_shared<gradient<Backend>>();
  } else {
    gradient_pool<Backend>& pool = gradient_pool<Backend>::instance();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (const auto& g : pool.kept) {
      if (g.use_count() == 1) {
        g->rows.clear();  // sizes to 0, capacity kept
        g->values.clear();
        g->bias_values.clear();
        g->dim = 0;
        return g;
      }
    }
    auto g = std::make_shared<gradient<Backend>>();
    if (pool.kept.size() < kept_gradients) pool.kept.push_back(g);
    return g;
  }
}

/// Frees the pooled gradient objects no tensor uses any more (the others stay pooled); returns how
/// many bytes of their buffers were freed.
template <class Backend>
std::size_t release_idle_gradients() {
  if constexpr (!xs::is_host_backend<Backend>) {
    return 0;
  } else {
    gradient_pool<Backend>& pool = gradient_pool<Backend>::instance();
    std::vector<std::shared_ptr<gradient<Backend>>> idle;  // destroyed outside the lock
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(pool.mu);
      std::vector<std::shared_ptr<gradient<Backend>>> busy;
      for (auto& g : pool.kept) {
        if (g.use_count() == 1) {
          bytes += g->rows.capacity() * sizeof(xs::index_t) +
                   (g->values.capacity() + g->bias_values.capacity()) * sizeof(float);
          idle.push_back(std::move(g));
        } else {
          busy.push_back(std::move(g));
        }
      }
      pool.kept = std::move(busy);
    }
    return bytes;
  }
}

}  // namespace xsoftmax_torch
