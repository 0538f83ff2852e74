// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `scratch_buffer`: working memory that its user writes before reading. On a host backend it is
/// left uninitialised: a backend_vector value-initialises (a memset of the whole buffer, and its
/// page faults, on every call), which for the dense softmax's score chunks and score cache (up to
/// tens of MiB per step) and the search's open lists cost more than the work they hold. On a
/// device backend it is a backend_vector (its allocator, stream and caching).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/execution.hpp>

#include <cstddef>
#include <memory>

namespace xsoftmax::detail {

/// `n` elements of T in the backend's memory, never read before written by its user.
template <class B, class T>
class scratch_buffer {
 public:
  explicit scratch_buffer(std::size_t n) {
    if constexpr (is_host_backend<B>) host_.reset(n ? new T[n] : nullptr);
    else device_.resize(n);
  }
  [[nodiscard]] T* data() {
    if constexpr (is_host_backend<B>) return host_.get();
    else return raw(device_);
  }

 private:
  std::unique_ptr<T[]> host_;
  backend_vector<B, T> device_;
};

}  // namespace xsoftmax::detail
