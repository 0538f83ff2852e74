// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `scratch_vector`: working memory of one call (packed rows, per-row losses and statistics, score
/// chunks), sized, movable and never value-initialised; `scratch_buffer` is its name where a buffer
/// is only written, then read.
///
/// Why not a backend_vector: on a host backend a backend_vector value-initialises (a memset of the
/// whole buffer, and its page faults, on every call; a scratch_vector's host memory comes from the
/// per-thread block cache, detail/host/block_cache.hpp, whose pages stay mapped between calls), which for the dense softmax's score chunks and
/// score cache (up to tens of MiB per step) cost more than the work they hold. On cuda a
/// `thrust::device_vector` is worse for a small call: cudaMalloc, a value-initialising fill on the
/// default stream that Thrust waits for, and a cudaFree that synchronises the device, for every
/// vector of every call (the H200 profile of a 1024-row full softmax step: 17 fills, and 0.4 ms of
/// its 1.6 ms outside the kernels; bench/RESULTS.md). On a device backend a scratch_vector is Thrust
/// temporary storage of the execution's policy (on cuda: the resources' caching allocator, on their
/// stream): no cudaMalloc, no cudaFree, and a fill only where one is asked for, queued on the
/// execution's stream.

#include <xsoftmax/backend.hpp>
#include <xsoftmax/detail/call_counters.hpp>
#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/host/block_cache.hpp>
#include <xsoftmax/error.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>
#include <thrust/fill.h>
#include <thrust/memory.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

/// `size()` elements of T in the memory of backend B. Elements are uninitialised unless a fill value
/// is given. On a device backend the memory comes from (and goes back to) the allocator of the
/// execution it was made with, whose stream orders every use: work queued on that stream may still
/// use a block when the vector is destroyed, which is safe for an allocator that keeps stream order
/// (see detail/cuda/workspace.cuh). The execution's resources must outlive the vector.
///
/// A default-constructed vector is empty and bound to no execution: it can be assigned to, or
/// resized with the execution (`resize(n, ex)`), not grown by `resize(n)` alone (which throws
/// `std::logic_error` on every backend, so that a host test finds what would fail on a device).
/// Host backends need no execution otherwise, so that `scratch_vector<serial, T>(n)` serves the
/// host algorithms that are handed a Thrust host policy.
template <class B, class T>
class scratch_vector {
  static_assert(std::is_trivially_copyable_v<T>, "scratch_vector: elements are never constructed");

 public:
  using value_type = T;

  scratch_vector() = default;
  /// `n` uninitialised elements.
  scratch_vector(std::size_t n, const execution<B>& ex) : policy_(std::in_place, ex.policy()) { allocate(n); }
  /// `n` elements equal to `value`, filled on the execution's stream.
  scratch_vector(std::size_t n, const execution<B>& ex, T value) : scratch_vector(n, ex) { fill(value); }
  /// Host backends only: `n` uninitialised elements, without an execution.
  explicit scratch_vector(std::size_t n) : host_only_(true) {
    static_assert(is_host_backend<B>, "scratch_vector: a device vector needs the execution that allocates it");
    allocate(n);
  }
  scratch_vector(std::size_t n, T value) : scratch_vector(n) { fill(value); }

  /// A copy of `other`'s elements, in memory of the same execution (copied on its stream).
  scratch_vector(const scratch_vector& other) : policy_(other.policy_), host_only_(other.host_only_) {
    allocate(other.size_);
    copy_from(other.data(), size_);
  }
  scratch_vector(scratch_vector&& other) noexcept { swap(other); }
  scratch_vector& operator=(scratch_vector other) noexcept {
    swap(other);
    return *this;
  }
  ~scratch_vector() { release(); }

  void swap(scratch_vector& other) noexcept {
    // Thrust's policies hold their allocator by reference: copy-constructible, not assignable.
    std::optional<policy_type> mine;
    if (policy_) mine.emplace(*policy_);
    rebind(policy_, other.policy_);
    rebind(other.policy_, mine);
    std::swap(host_only_, other.host_only_);
    std::swap(host_, other.host_);
    std::swap(device_, other.device_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
  }

  /// Keeps the first min(n, size()) elements; elements beyond them are uninitialised. Shrinking
  /// keeps the memory.
  void resize(std::size_t n) {
    if (n > capacity_) {
      scratch_vector bigger = like(n);
      bigger.copy_from(data(), size_);
      swap(bigger);
    }
    size_ = n;
  }
  /// `resize(n)`, binding a default-constructed vector to `ex` first.
  void resize(std::size_t n, const execution<B>& ex) {
    if (!policy_) policy_.emplace(ex.policy());
    resize(n);
  }

  /// Every element set to `value` (queued on the execution's stream on a device).
  void fill(T value) {
    if (size_ == 0) return;
    if constexpr (is_host_backend<B>) std::fill_n(host_, size_, value);
    else thrust::fill_n(*policy_, device_, size_, value);
  }

  [[nodiscard]] T* data() noexcept { return is_host_backend<B> ? host_ : device_; }
  [[nodiscard]] const T* data() const noexcept { return is_host_backend<B> ? host_ : device_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Iterators that Thrust dispatches to the backend's system also without a policy (device_ptr on a
  /// device, a raw pointer on the host).
  [[nodiscard]] auto begin() noexcept { return iterator(data()); }
  [[nodiscard]] auto end() noexcept { return iterator(data()) + size_; }
  [[nodiscard]] auto begin() const noexcept { return iterator(data()); }
  [[nodiscard]] auto end() const noexcept { return iterator(data()) + size_; }
  /// Element i, on the host (host backends only).
  [[nodiscard]] T& operator[](std::size_t i) noexcept {
    static_assert(is_host_backend<B>, "scratch_vector: element access on the host needs a host backend");
    return host_[i];
  }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept {
    static_assert(is_host_backend<B>, "scratch_vector: element access on the host needs a host backend");
    return host_[i];
  }

 private:
  using policy_type = decltype(std::declval<const execution<B>&>().policy());

  static void rebind(std::optional<policy_type>& to, const std::optional<policy_type>& from) noexcept {
    to.reset();
    if (from) to.emplace(*from);
  }

  template <class U>
  static auto iterator(U* p) noexcept {
    if constexpr (is_host_backend<B>) return p;
    else return thrust::device_pointer_cast(p);
  }

  // An empty vector bound to the same execution, with room for n elements.
  [[nodiscard]] scratch_vector like(std::size_t n) const {
    scratch_vector v;
    rebind(v.policy_, policy_);
    v.host_only_ = host_only_;
    v.allocate(n);
    return v;
  }

  void allocate(std::size_t n) {
    size_ = capacity_ = n;
    if (n == 0) return;
    expects<std::logic_error>(policy_.has_value() || host_only_,
                              "scratch_vector: grown without the execution that allocates its memory");
    ++call_counters::local().allocations;
    if constexpr (is_host_backend<B>) {
      if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
      host_ = static_cast<T*>(host_block_cache::take(n * sizeof(T)));
    } else {
      device_ = thrust::raw_pointer_cast(thrust::get_temporary_buffer<T>(*policy_, static_cast<std::ptrdiff_t>(n)).first);
    }
  }

  void copy_from(const T* src, std::size_t n) {
    if (n == 0) return;
    if constexpr (is_host_backend<B>) std::copy_n(src, n, host_);
    else thrust::copy_n(*policy_, src, n, device_);
  }

  void release() noexcept {
    if constexpr (is_host_backend<B>) {
      host_block_cache::give(host_, capacity_ * sizeof(T));
      host_ = nullptr;
    } else {
      if (device_) thrust::return_temporary_buffer(*policy_, device_, static_cast<std::ptrdiff_t>(capacity_));
      device_ = nullptr;
    }
  }

  std::optional<policy_type> policy_;
  bool host_only_ = false;  // made by a host-only constructor: allocates without an execution
  T* host_ = nullptr;  // from host_block_cache (host backends)
  T* device_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

/// Working memory of one call that its user writes before reading.
template <class B, class T>
using scratch_buffer = scratch_vector<B, T>;

/// Host `v` copied into working memory of the call in the execution's memory: one upload, queued
/// before the work that reads it (on a GPU without a wait for the stream: `backend_ops::upload`);
/// `v` may change on return.
template <class B, class T>
scratch_vector<B, T> to_scratch(const execution<B>& ex, const std::vector<T>& v) {
  scratch_vector<B, T> out(v.size(), ex);
  if (!v.empty()) execution<B>::ops::upload(ex.res, out.data(), v.data(), static_cast<index_t>(v.size()));
  return out;
}

/// Several host lists of T... (contiguous containers: `data()`, `size()`; trivially copyable
/// elements aligned to at most 8 bytes) in one block of the call's working memory, with one upload
/// (on a device one queued copy instead of one each): `list<I>()` is the I-th list's copy, each
/// starting on an 8-byte boundary. The block lives as long as this object.
template <class B, class... T>
class scratch_lists {
  static_assert(sizeof...(T) > 0, "scratch_lists: at least one list");
  static_assert(((std::is_trivially_copyable_v<T> && alignof(T) <= sizeof(std::uint64_t)) && ...),
                "scratch_lists: elements are copied as bytes into 8-byte words");

 public:
  template <class... L>
  explicit scratch_lists(const execution<B>& ex, const L&... lists) {
    static_assert(sizeof...(L) == sizeof...(T), "scratch_lists: one container a list");
    static_assert((std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(lists.data())>>, T> && ...),
                  "scratch_lists: each container holds its list's element type");
    std::size_t words = 0, i = 0;
    ((offset_[i++] = words, words += (lists.size() * sizeof(T) + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t)),
     ...);
    std::vector<std::uint64_t> host(words);
    i = 0;
    ((lists.empty() ? void() : void(std::memcpy(host.data() + offset_[i], lists.data(), lists.size() * sizeof(T))),
      ++i),
     ...);
    block_ = to_scratch(ex, host);
  }

  /// The I-th list's elements in the execution's memory (null when the block is empty).
  template <std::size_t I>
  [[nodiscard]] auto* list() {
    using E = std::tuple_element_t<I, std::tuple<T...>>;
    return block_.empty() ? static_cast<E*>(nullptr) : reinterpret_cast<E*>(block_.data() + offset_[I]);
  }

 private:
  std::size_t offset_[sizeof...(T)] = {};  // in words
  scratch_vector<B, std::uint64_t> block_;
};

}  // namespace xsoftmax::detail
