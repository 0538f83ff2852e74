// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `execution<Backend>`: what a generic algorithm needs from a backend, in one value — the Thrust
/// execution policy its loops run on, the backend's vectors for scratch buffers, and the backend's
/// operations that are not Thrust algorithms (`backend_ops<Backend>`: GEMM, reading one value back
/// to the host, waiting for queued work). Every head's algorithm is written once against it; the
/// host backends' operations are in detail/host/backend_ops.hpp, the cuda backend's in
/// detail/cuda/backend_ops.cuh.
///
/// Loops are `XSOFTMAX_PARALLEL_FOR(ex, n, i, { body })`: the body, which captures raw pointers and
/// sizes by value (never containers), runs for i in [0, n) on the host's threads or in a CUDA kernel
/// (or `parallel_for(ex, n, f)` with a function object `f`).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/detail/call_counters.hpp>

#include <thrust/find.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

/// `XSOFTMAX_PARALLEL_FOR(ex, n, i, { body })` runs `body` for every `index_t i` in [0, n) on the
/// execution `ex` (or a Thrust host policy): a lambda capturing by value, handed to `parallel_for`.
///
/// Under nvcc the body is written into two lambdas, and the execution's backend picks one at
/// compile time: a `__device__` extended lambda for a device backend (the `xsoftmax::xsoftmax`
/// target adds `--extended-lambda` for CUDA sources), a plain lambda for the host backends. Not one
/// `__host__ __device__` lambda: nvcc wraps those in a type whose copies call function pointers
/// kept per translation unit, while the functions that copy the wrapper (`thrust::for_each` and
/// below, instantiated with that type) are merged across translation units by the linker. A program
/// of several CUDA sources that all include xsoftmax then called a null pointer when a merged copy
/// came from a translation unit whose pointers were never set: on the first GPU runs 37, then 19
/// of 135 test cases crashed that way, as the link fell (bench/RESULTS.md, "GPU (cuda backend)").
/// `__device__` lambdas carry their captures only, and plain lambdas no wrapper at all (also no
/// heap copy per loop on the host).
#if defined(__CUDACC__)
#define XSOFTMAX_PARALLEL_FOR(ex, n, i, ...)                                                        \
  do {                                                                                             \
    if constexpr (::xsoftmax::detail::runs_on_device<std::decay_t<decltype(ex)>>)                  \
      ::xsoftmax::detail::parallel_for(ex, n, [=] __device__(::xsoftmax::index_t i) __VA_ARGS__);  \
    else                                                                                           \
      ::xsoftmax::detail::parallel_for(ex, n, [=](::xsoftmax::index_t i) __VA_ARGS__);             \
  } while (false)
#define XSOFTMAX_PARALLEL_FOR_LIGHT(ex, n, i, ...)                                                        \
  do {                                                                                                   \
    if constexpr (::xsoftmax::detail::runs_on_device<std::decay_t<decltype(ex)>>)                        \
      ::xsoftmax::detail::parallel_for_light(ex, n, [=] __device__(::xsoftmax::index_t i) __VA_ARGS__);  \
    else                                                                                                 \
      ::xsoftmax::detail::parallel_for_light(ex, n, [=](::xsoftmax::index_t i) __VA_ARGS__);             \
  } while (false)
#else
#define XSOFTMAX_PARALLEL_FOR(ex, n, i, ...) \
  ::xsoftmax::detail::parallel_for(ex, n, [=](::xsoftmax::index_t i) __VA_ARGS__)
#define XSOFTMAX_PARALLEL_FOR_LIGHT(ex, n, i, ...) \
  ::xsoftmax::detail::parallel_for_light(ex, n, [=](::xsoftmax::index_t i) __VA_ARGS__)
#endif
/// `XSOFTMAX_PARALLEL_FOR_LIGHT(ex, n, i, { body })`: the same for a light loop (a few nanoseconds
/// an element), which the omp backend runs on the calling thread below `light_loop_limit` elements.

/// `XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cols, r, j, { body })` runs `body` for every element (r, j)
/// of a rows x cols grid, for loops whose elements are independent (row copies, conversions,
/// fills). A device runs one thread per element: one thread per row walking its columns reads and
/// writes with a row's stride between neighbouring threads, and on the first GPU runs such loops
/// took 0.3-0.5 ms for a 1024 x 512 batch (bench/RESULTS.md). A host backend runs one task per row
/// with the columns in an inner loop (which vectorises). `return` in the body ends that element only.
#define XSOFTMAX_PARALLEL_FOR_2D(ex, rows, cols, r, j, ...)                          \
  do {                                                                              \
    const ::xsoftmax::index_t xsoftmax_cols_ = (cols);                              \
    if constexpr (::xsoftmax::detail::runs_on_device<std::decay_t<decltype(ex)>>) { \
      if (xsoftmax_cols_ > 0)                                                       \
        XSOFTMAX_PARALLEL_FOR(ex, (rows) * xsoftmax_cols_, xsoftmax_e_, {           \
          const ::xsoftmax::index_t r = xsoftmax_e_ / xsoftmax_cols_;               \
          const ::xsoftmax::index_t j = xsoftmax_e_ % xsoftmax_cols_;               \
          __VA_ARGS__                                                               \
        });                                                                         \
    } else {                                                                        \
      XSOFTMAX_PARALLEL_FOR_2D_HOST_(ex, rows, r, j, __VA_ARGS__);                  \
    }                                                                               \
  } while (false)
/// The host form of XSOFTMAX_PARALLEL_FOR_2D (reads `xsoftmax_cols_`): a task per row, the body an
/// inlined lambda per column, so that `return` means what it means on a device.
#define XSOFTMAX_PARALLEL_FOR_2D_HOST_(ex, rows, r, j, ...)                                  \
  ::xsoftmax::detail::parallel_for(ex, rows, [=](::xsoftmax::index_t r) {                  \
    const auto xsoftmax_element_ = [&](::xsoftmax::index_t j) __VA_ARGS__;                 \
    for (::xsoftmax::index_t xsoftmax_j_ = 0; xsoftmax_j_ < xsoftmax_cols_; ++xsoftmax_j_) \
      xsoftmax_element_(xsoftmax_j_);                                                      \
  })

namespace xsoftmax::detail {

/// The operations of `Backend` that are not Thrust algorithms. Specialised per backend:
///   static void gemm(const resources&, const gemm_args&);    // fp32 row-major GEMM (see host/gemm.hpp)
///   template <class T> static T read(const resources&, const T* p);   // one value, to the host
///   template <class T> static void copy(const resources&, T* dst, const T* src, index_t n);
///                                                           // host <-> backend memory, blocking
///   template <class T> static void upload(const resources&, T* dst, const T* src, index_t n);
///                                                           // host list -> backend memory, queued
///                                                           // (src reusable on return, no wait)
///   static void synchronize(const resources&);              // wait for the work queued so far
template <class Backend>
struct backend_ops {
  static_assert(dependent_false<Backend>,
                "xsoftmax: no backend_ops for this backend (include <xsoftmax/cuda.cuh> for cuda)");
};

/// A backend and its resources, for the generic algorithms. Cheap to copy (holds a reference).
template <class Backend>
struct execution {
  using backend = Backend;
  using resources_type = backend_resources<Backend>;
  template <class T>
  using vector = backend_vector<Backend, T>;
  using ops = backend_ops<Backend>;

  const resources_type& res;

  [[nodiscard]] auto policy() const { return backend_traits<Backend>::policy(res); }
};

/// The execution of the calling thread alone (inside a parallel region of a host backend).
inline const execution<serial>& serial_execution() {
  static const host_resources none{};
  static const execution<serial> ex{none};
  return ex;
}

template <class T>
struct is_execution : std::false_type {};
template <class B>
struct is_execution<execution<B>> : std::true_type {};

/// Whether `Ex` (an execution or a Thrust host policy) runs its loops on a device.
template <class Ex>
struct runs_on_device_trait : std::false_type {};
template <class B>
struct runs_on_device_trait<execution<B>> : std::bool_constant<!is_host_backend<B>> {};
template <class Ex>
inline constexpr bool runs_on_device = runs_on_device_trait<Ex>::value;

/// The Thrust policy of an execution, or the policy itself (host algorithms that are handed a
/// Thrust host policy directly: `thrust::cpp::par`, `thrust::omp::par`).
template <class Ex>
[[nodiscard]] auto policy_of(const Ex& ex) {
  if constexpr (is_execution<Ex>::value) return ex.policy();
  else return ex;
}

/// The execution matching `ex`: itself, or for a Thrust host policy the host backend it names.
template <class Ex>
[[nodiscard]] decltype(auto) as_execution(const Ex& ex) {
  if constexpr (is_execution<Ex>::value) {
    return (ex);
  } else if constexpr (std::is_same_v<Ex, std::decay_t<decltype(thrust::omp::par)>>) {
    static const host_resources none{};
    return execution<omp>{none};
  } else {
    static_assert(std::is_same_v<Ex, std::decay_t<decltype(thrust::cpp::par)>>,
                  "xsoftmax: expected an execution<Backend> or thrust::cpp::par / thrust::omp::par");
    return serial_execution();
  }
}

/// f(i) for i in [0, n) on the execution's threads (or device); `ex` is an execution or a Thrust
/// host policy.
template <class Ex, class F>
void parallel_for(const Ex& ex, index_t n, F f) {
  if (n <= 0) return;
  ++call_counters::local().loops;
  thrust::for_each(policy_of(ex), thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(n), f);
}

/// `parallel_for` over tasks of unequal cost: on the omp backend each thread takes the next task
/// when it finishes one (`schedule(dynamic)`), where `parallel_for`'s even split of the index range
/// left one thread waiting at the region's end for the other's costlier half (a sigmoid HS step's
/// tasks: rows of different path depths, runs of different lengths; ~30 % of a 2-thread step was
/// spent waiting, bench/RESULTS.md, issue 30). Elsewhere, `parallel_for`. `f` must not throw.
/// Tasks are handed out in index order (`monotonic`; OpenMP 5's default for `dynamic` is
/// nonmonotonic, which allows work stealing), and a thread finishes a task before it takes another:
/// so a task may wait for a lower one to publish a result (`sigmoid_pair_pass::crossing_parts`) --
/// every lower task has started by then and waits only on lower ones still.
template <class B, class F>
void parallel_for_uneven(const execution<B>& ex, index_t n, F f) {
#if defined(_OPENMP)
  if constexpr (std::is_same_v<B, omp>) {
    if (n <= 0) return;
    ++call_counters::local().loops;
#pragma omp parallel for schedule(monotonic : dynamic, 1)
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  parallel_for(ex, n, f);
}

/// Elements below which the omp backend runs a *light* loop (a few nanoseconds an element:
/// `parallel_for_light`, `first_index_where_light`, `with_light_policy`) on the calling thread.
/// Opening and closing a parallel region costs about 1 us with two threads waiting actively on a
/// quiet machine and tens of us when the threads' cores are far apart or busy; a 2-thread binary-
/// Huffman step at 1,024 rows opened 32 regions, most of them for loops over its rows or runs
/// that take a few microseconds on one thread (bench/RESULTS.md, issue 30).
inline constexpr index_t light_loop_limit = 16384;

/// Whether a light loop of `n` elements on `ex` runs on the calling thread: on the omp backend
/// below `light_loop_limit` (the serial backend does anyway; a device never).
template <class B>
[[nodiscard]] bool runs_light_loop_inline(const execution<B>&, index_t n) {
  return std::is_same_v<B, omp> && n < light_loop_limit;
}

/// `parallel_for` for a light loop (see `light_loop_limit`); counted as a loop all the same.
template <class B, class F>
void parallel_for_light(const execution<B>& ex, index_t n, F f) {
  if constexpr (is_host_backend<B>) {
    if (runs_light_loop_inline(ex, n)) {
      if (n <= 0) return;
      ++call_counters::local().loops;
      for (index_t i = 0; i < n; ++i) f(i);
      return;
    }
  }
  parallel_for(ex, n, f);
}

/// `body(policy)` with the execution's Thrust policy, or for a light loop on the omp backend the
/// serial backend's policy over the same resources (host memory either way): Thrust's omp
/// algorithms open one or two regions each.
template <class B, class Body>
decltype(auto) with_light_policy(const execution<B>& ex, index_t n, Body body) {
  if constexpr (std::is_same_v<B, omp>) {
    if (runs_light_loop_inline(ex, n)) return body(execution<serial>{ex.res}.policy());
  }
  return body(ex.policy());
}

/// Whether `parallel_for_uneven` on `ex` runs its tasks one at a time in index order: on the serial
/// backend, and on the omp backend when its next parallel region has one thread (OMP_NUM_THREADS=1,
/// or a build without OpenMP). A step can then do in one pass what threads need two for.
template <class B>
bool runs_tasks_in_order(const execution<B>&) {
  if constexpr (std::is_same_v<B, serial>) {
    return true;
  } else if constexpr (std::is_same_v<B, omp>) {
#if defined(_OPENMP)
    return omp_get_max_threads() == 1;
#else
    return true;
#endif
  } else {
    return false;
  }
}

/// The first i in [begin, end) with pred(i), or `end` (a check's first bad element):
/// `thrust::find_if` over the indices; on the omp backend one parallel region with a min reduction,
/// where find_if took two (its per-thread partial results reduced again in parallel: a sigmoid HS
/// step's checks were 8 of its 35 regions). Every index is tested there (checked data is valid).
template <class B, class Pred>
index_t first_index_where(const execution<B>& ex, index_t begin, index_t end, Pred pred) {
  if (end <= begin) return end;
#if defined(_OPENMP)
  if constexpr (std::is_same_v<B, omp>) {
    index_t found = end;
#pragma omp parallel for reduction(min : found)
    for (index_t i = begin; i < end; ++i)
      if (i < found && pred(i)) found = i;
    return found;
  }
#endif
  const thrust::counting_iterator<index_t> first(begin);
  return *thrust::find_if(ex.policy(), first, first + (end - begin), pred);
}

/// `first_index_where` for a light predicate (see `light_loop_limit`).
template <class B, class Pred>
index_t first_index_where_light(const execution<B>& ex, index_t begin, index_t end, Pred pred) {
  if constexpr (is_host_backend<B>) {
    if (runs_light_loop_inline(ex, end - begin)) {
      for (index_t i = begin; i < end; ++i)
        if (pred(i)) return i;
      return end;
    }
  }
  return first_index_where(ex, begin, end, pred);
}

/// The raw pointer of a backend vector.
template <class Vector>
[[nodiscard]] auto raw(Vector& v) {
  return thrust::raw_pointer_cast(v.data());
}

}  // namespace xsoftmax::detail
