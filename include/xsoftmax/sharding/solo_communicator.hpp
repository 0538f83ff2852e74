// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `solo_communicator`: the communicator of a single rank (every collective is a copy). A
/// `class_sharding<solo_communicator>` head runs the sharded code path in one process on any
/// backend, with no transport: the oracle that the sharded algorithm equals the unsharded one
/// before ranks are added, and the GPU tests' sharded head.

#include <xsoftmax/error.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <algorithm>

namespace xsoftmax {

/// One rank, rank 0: see class_sharding.hpp for the collectives' contract.
class solo_communicator {
 public:
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  template <class T>
  void all_reduce(T*, index_t, reduce_op) {}  // the only rank's values are the result
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    detail::expects(count == counts[0], "solo_communicator::all_gather: count = ", count, " but counts[0] = ",
                    counts[0]);
    std::copy(send, send + count, recv);
  }
  /// `start_all_gather`'s request: the copy is done when it is returned.
  struct gather_request {
    void wait() {}
    bool test() { return true; }
  };
  /// `all_gather`, already complete (a copy).
  template <class T>
  [[nodiscard]] gather_request start_all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    all_gather(send, count, recv, counts);
    return {};
  }
  /// `all_to_all`, already complete (a copy).
  template <class T>
  [[nodiscard]] gather_request start_all_to_all(const T* send, const index_t* send_counts, T* recv,
                                                const index_t* recv_counts) {
    all_to_all(send, send_counts, recv, recv_counts);
    return {};
  }
  /// The ring step of one rank: to itself (a copy).
  template <class T>
  void shift(const T* send, index_t send_count, T* recv, index_t recv_count) {
    detail::expects(send_count == recv_count, "solo_communicator::shift: send_count = ", send_count,
                    " but recv_count = ", recv_count);
    std::copy(send, send + send_count, recv);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) {
    std::copy(send, send + counts[0], recv);
  }
  template <class T>
  void all_to_all(const T* send, const index_t* send_counts, T* recv, const index_t* recv_counts) {
    detail::expects(send_counts[0] == recv_counts[0], "solo_communicator::all_to_all: send_counts[0] = ",
                    send_counts[0], " but recv_counts[0] = ", recv_counts[0]);
    std::copy(send, send + send_counts[0], recv);
  }
};

}  // namespace xsoftmax
