// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `backend_array<T>`: an index's data (IVF centroids, lists, list-ordered vectors) kept in the
/// memory of the backend that built it, for a search on that backend to read in place. Other
/// readers get copies made on first use and kept until the next build: `host()` (the public
/// accessors of `ivf_index`) and `data(ex)` for another backend than the builder's. The opposite of
/// `mirrored_vector`, whose data is handed over on the host.

#include <xsoftmax/detail/execution.hpp>

#include <thrust/copy.h>

#include <memory>
#include <mutex>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

template <class T>
class backend_array {
 public:
  [[nodiscard]] index_t size() const { return st_ ? st_->size : 0; }
  [[nodiscard]] bool empty() const { return size() == 0; }

  /// `n` elements in `ex`'s memory to write the new data into (contents unspecified). Copies made
  /// for other readers are dropped; copies of this object (which share the data until then) keep
  /// the old data. Reuses the storage of the previous build on the same backend.
  template <class Ex>
  T* reset(const Ex& ex, index_t n) {
    using vector_type = typename std::decay_t<decltype(as_execution(ex))>::template vector<T>;
    if (!st_ || st_.use_count() > 1 || *st_->type != typeid(vector_type)) {
      auto s = std::make_shared<state>();
      s->own = std::make_shared<vector_type>();
      s->type = &typeid(vector_type);
      s->to_host = &copy_to_host<vector_type>;
      st_ = s;
    } else {
      st_->other.reset();
      st_->other_type = nullptr;
      st_->host_valid = false;
    }
    auto& v = *static_cast<vector_type*>(st_->own.get());
    v.resize(static_cast<std::size_t>(n));
    st_->size = n;
    return thrust::raw_pointer_cast(v.data());
  }

  /// The array holding `v` (a vector of `ex`'s backend: `as_execution(ex)`'s `vector<T>`), taken
  /// without a copy; its data pointer stays valid. A builder makes the next data this way and
  /// swaps it in (a move, which cannot throw) only after everything else of its update succeeded.
  template <class Ex, class Vector>
  [[nodiscard]] static backend_array adopting(const Ex& ex, Vector&& v) {
    using vector_type = typename std::decay_t<decltype(as_execution(ex))>::template vector<T>;
    static_assert(std::is_same_v<std::decay_t<Vector>, vector_type> && !std::is_lvalue_reference_v<Vector>,
                  "backend_array::adopting takes an rvalue of the execution's own vector type");
    auto s = std::make_shared<state>();
    s->size = static_cast<index_t>(v.size());
    s->own = std::make_shared<vector_type>(std::move(v));
    s->type = &typeid(vector_type);
    s->to_host = &copy_to_host<vector_type>;
    backend_array out;
    out.st_ = std::move(s);
    return out;
  }

  /// The data in `ex`'s memory: in place on the builder's backend, otherwise a copy made on the
  /// first call after a build (through the host). Null when empty. Safe from several threads.
  template <class Ex>
  [[nodiscard]] const T* data(const Ex& ex) const {
    using vector_type = typename std::decay_t<decltype(as_execution(ex))>::template vector<T>;
    if (!st_) return nullptr;
    if (*st_->type == typeid(vector_type)) return thrust::raw_pointer_cast(static_cast<const vector_type*>(st_->own.get())->data());
    std::lock_guard<std::mutex> lock(st_->mutex);
    if (!st_->other_type || *st_->other_type != typeid(vector_type)) {
      const std::vector<T>& h = host_locked();
      st_->other = std::make_shared<vector_type>(h.begin(), h.end());
      st_->other_type = &typeid(vector_type);
    }
    return thrust::raw_pointer_cast(static_cast<const vector_type*>(st_->other.get())->data());
  }

  /// The data on the host (a copy made on the first call after a build). Safe from several threads.
  [[nodiscard]] const std::vector<T>& host() const {
    static const std::vector<T> none;
    if (!st_) return none;
    std::lock_guard<std::mutex> lock(st_->mutex);
    return host_locked();
  }

 private:
  struct state {
    std::mutex mutex;
    index_t size = 0;
    std::shared_ptr<void> own;  // the builder's backend_vector
    const std::type_info* type = nullptr;
    void (*to_host)(const void*, std::vector<T>&) = nullptr;
    std::shared_ptr<void> other;  // a copy for another backend
    const std::type_info* other_type = nullptr;
    std::vector<T> host;
    bool host_valid = false;
  };

  template <class Vector>
  static void copy_to_host(const void* v, std::vector<T>& out) {
    const Vector& src = *static_cast<const Vector*>(v);
    out.resize(src.size());
    thrust::copy(src.begin(), src.end(), out.begin());
  }

  const std::vector<T>& host_locked() const {
    if (!st_->host_valid) {
      st_->to_host(st_->own.get(), st_->host);
      st_->host_valid = true;
    }
    return st_->host;
  }

  std::shared_ptr<state> st_;
};

}  // namespace xsoftmax::detail
