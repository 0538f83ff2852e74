// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `call_counters`: what a verb costs besides its arithmetic, counted on the calling thread, so
/// that a test can hold a verb to its budget on any backend and a regression shows in CI
/// (tests/heads/call_cost_test.cpp). On a GPU each of these is host-side time: a device
/// allocation (cudaMalloc, or a cache lookup), a read-back (a copy to the host and a wait for the
/// stream), a wait, a kernel launch.
///
/// What is counted:
///  * `allocations`: working-memory buffers taken for a call (`scratch_vector`, non-empty);
///  * `vectors`: backend vectors allocated (host backends: `counted_allocator`): outside a head's
///    constructor and the first sizing of a gradient, each is a temporary that should be scratch;
///  * `host_reads`: values brought back to the host before the verb returns: `backend_ops::read`
///    and `copy`, and every value-returning Thrust algorithm a verb runs (on a device each waits for
///    the stream): `find_if` (a non-finite value, a bad target, an active set's checks), the counts
///    of `copy_if`, `remove_if`, `unique` and `reduce_by_key`, `transform_reduce`, `max_element`, a
///    scalar `lower_bound`;
///  * `uploads`: host lists sent to the backend's memory (`backend_ops::upload`): on a GPU a copy
///    queued through page-locked memory, no wait (detail/cuda/pinned_staging.cuh);
///  * `synchronizations`: `backend_ops::synchronize` (waits for the queued work);
///  * `loops`: parallel loops launched (`parallel_for`, `XSOFTMAX_PARALLEL_FOR`): kernels on a device.
/// Thread-local: the counts of the thread that calls the verb (a host backend's worker threads'
/// inner loops are not the verb's launches), without an atomic on any hot path.

#include <cstdint>

namespace xsoftmax::detail {

struct call_counters {
  std::int64_t allocations = 0;
  std::int64_t host_reads = 0;
  std::int64_t synchronizations = 0;
  std::int64_t loops = 0;
  std::int64_t vectors = 0;
  std::int64_t uploads = 0;

  /// The calling thread's counters.
  [[nodiscard]] static call_counters& local() noexcept {
    thread_local call_counters counters;
    return counters;
  }
  /// The calling thread's counts since `before`.
  [[nodiscard]] static call_counters since(const call_counters& before) noexcept {
    const call_counters& now = local();
    return {now.allocations - before.allocations, now.host_reads - before.host_reads,
            now.synchronizations - before.synchronizations, now.loops - before.loops,
            now.vectors - before.vectors, now.uploads - before.uploads};
  }
};

/// One value brought back to the host (see `call_counters::host_reads`).
inline void count_host_read() noexcept { ++call_counters::local().host_reads; }

/// One host list sent to the backend (see `call_counters::uploads`).
inline void count_upload() noexcept { ++call_counters::local().uploads; }

}  // namespace xsoftmax::detail
