// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirrored_vector<T>`: data a caller hands over on the host (candidate lists, a KNN graph, a
/// sampler's cumulative weights) with a copy in a device backend's memory made on first use and
/// kept until the data changes. Host backends read the host vector itself. Generic code asks for
/// `data(ex)` and gets a pointer in the execution's memory.

#include <xsoftmax/detail/execution.hpp>

#include <memory>
#include <mutex>
#include <typeinfo>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

template <class T>
class mirrored_vector {
 public:
  mirrored_vector() = default;
  explicit mirrored_vector(std::vector<T> v) : host_(std::move(v)) {}

  [[nodiscard]] const std::vector<T>& host() const { return host_; }
  [[nodiscard]] index_t size() const { return static_cast<index_t>(host_.size()); }
  [[nodiscard]] bool empty() const { return host_.empty(); }

  /// The host vector, for changing it: the device copy is dropped and made again on next use.
  [[nodiscard]] std::vector<T>& edit() {
    mirror_ = std::make_shared<mirror>();
    return host_;
  }
  void assign(std::vector<T> v) { edit() = std::move(v); }

  /// The data in `ex`'s memory: the host vector on a host backend; on a device backend a copy made
  /// on the first call after a change (the copy is synchronous and shared by copies of this
  /// object, which is safe to call from several threads).
  template <class Ex>
  [[nodiscard]] const T* data(const Ex& ex) const {
    using B = typename std::decay_t<decltype(as_execution(ex))>::backend;
    if constexpr (is_host_backend<B>) {
      return host_.data();
    } else {
      using device_vector = backend_vector<B, T>;
      std::lock_guard<std::mutex> lock(mirror_->mutex);
      if (!mirror_->copy || *mirror_->type != typeid(device_vector)) {
        mirror_->copy = std::make_shared<device_vector>(host_.begin(), host_.end());
        mirror_->type = &typeid(device_vector);
      }
      return thrust::raw_pointer_cast(static_cast<const device_vector*>(mirror_->copy.get())->data());
    }
  }

 private:
  struct mirror {
    std::mutex mutex;
    std::shared_ptr<const void> copy;
    const std::type_info* type = nullptr;
  };
  std::vector<T> host_;
  std::shared_ptr<mirror> mirror_ = std::make_shared<mirror>();
};

}  // namespace xsoftmax::detail
