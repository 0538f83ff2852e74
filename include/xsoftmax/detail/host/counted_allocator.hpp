// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `counted_allocator`: the host backends' vector allocator. It allocates as `std::allocator` does
/// and counts each allocation in `call_counters::vectors`, so that a backend vector made inside a
/// verb -- on a GPU a cudaMalloc, a value-initialising fill and a device-synchronising cudaFree --
/// shows in the host backends' call costs (tests/heads/call_cost_test.cpp) beside the verb's
/// scratch. The generic algorithm is the same on every backend, so the host's count is the device's.

#include <xsoftmax/detail/call_counters.hpp>

#include <cstddef>
#include <memory>

namespace xsoftmax::detail {

template <class T>
struct counted_allocator {
  using value_type = T;

  counted_allocator() noexcept = default;
  template <class U>
  counted_allocator(const counted_allocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding

  [[nodiscard]] T* allocate(std::size_t n) {
    ++call_counters::local().vectors;
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }

  template <class U>
  friend bool operator==(const counted_allocator&, const counted_allocator<U>&) noexcept {
    return true;  // stateless: memory from one is freed by any other
  }
  template <class U>
  friend bool operator!=(const counted_allocator&, const counted_allocator<U>&) noexcept {
    return false;
  }
};

}  // namespace xsoftmax::detail
