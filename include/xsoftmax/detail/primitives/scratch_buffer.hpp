// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `scratch_buffer`: working memory that its user writes before reading, for the duration of one
/// call. On a host backend it is left uninitialised: a backend_vector value-initialises (a memset
/// of the whole buffer, and its page faults, on every call), which for the dense softmax's score
/// chunks and score cache (up to tens of MiB per step) and the search's open lists cost more than
/// the work they hold. On a device backend it is Thrust temporary storage of the execution's policy
/// (on cuda: the resources' caching allocator, on their stream), so that a call takes no cudaMalloc
/// and no cudaFree, which synchronises the device, for its scratch.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>

#include <thrust/memory.h>

#include <cstddef>
#include <memory>
#include <optional>

namespace xsoftmax::detail {

/// `n` elements of T in the memory of execution `ex`'s backend B, never read before written by its
/// user, valid while the object lives. On a device backend the block goes back to the policy's
/// allocator at destruction; work queued on the execution's stream may still use it then, which is
/// safe for an allocator that keeps stream order (see detail/cuda/workspace.cuh).
template <class B, class T>
class scratch_buffer {
 public:
  scratch_buffer(std::size_t n, const execution<B>& ex) : n_(n) {
    if constexpr (is_host_backend<B>) {
      host_.reset(n ? new T[n] : nullptr);
    } else if (n > 0) {
      policy_.emplace(ex.policy());
      device_ = thrust::raw_pointer_cast(
          thrust::get_temporary_buffer<T>(*policy_, static_cast<std::ptrdiff_t>(n)).first);
    }
  }
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
  ~scratch_buffer() {
    if constexpr (!is_host_backend<B>) {
      if (device_) thrust::return_temporary_buffer(*policy_, device_, static_cast<std::ptrdiff_t>(n_));
    }
  }
  [[nodiscard]] T* data() {
    if constexpr (is_host_backend<B>) return host_.get();
    else return device_;
  }

 private:
  using policy_type = decltype(std::declval<const execution<B>&>().policy());
  std::size_t n_ = 0;
  std::unique_ptr<T[]> host_;
  std::optional<policy_type> policy_;
  T* device_ = nullptr;
};

}  // namespace xsoftmax::detail
