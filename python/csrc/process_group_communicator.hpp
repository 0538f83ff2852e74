// SPDX-License-Identifier: Apache-2.0
//
// `process_group_communicator`: the library's communicator concept (see
// include/xsoftmax/sharding/class_sharding.hpp) over a torch.distributed process group, so that a
// class-sharded head runs over the group a PyTorch job already has (gloo or MPI for CPU tensors).
// No transport of our own: every verb is one c10d collective on CPU tensors that view (or, where
// c10d needs equal sizes, pad) the library's host buffers, waited for before it returns.

#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/extension.h>

#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace xsoftmax_torch {

/// A communicator over a c10d process group (`torch.distributed`'s group object, passed from
/// Python). Host memory only (the library's `omp` backend); copies share the group.
///
/// Costs: `all_reduce` is one c10d all-reduce. `all_gather` pads every rank's block to the
/// largest count (c10d's all-gather takes equal sizes), so it moves size() x max(counts) elements.
/// `reduce_scatter` is an all-reduce of the whole buffer followed by a copy of this rank's block:
/// gloo offers no reduce-scatter on CPU tensors, so it moves size() times the bytes a true
/// reduce-scatter would (the hidden gradients of a data-parallel step; the weight gradients never
/// travel). `all_to_all` is one c10d all-to-all with split sizes.
class process_group_communicator {
 public:
  /// Throws `std::invalid_argument` for a null group.
  explicit process_group_communicator(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {
    if (!group_) throw std::invalid_argument("process_group_communicator: group is null");
  }

  [[nodiscard]] int rank() const { return group_->getRank(); }
  [[nodiscard]] int size() const { return group_->getSize(); }

  /// In place: every rank gets the element-wise sum (or max) of every rank's `data[0, n)`.
  template <class T>
  void all_reduce(T* data, xsoftmax::index_t n, xsoftmax::reduce_op op) {
    if (n == 0) return;  // n is the same on every rank: every rank skips
    std::vector<at::Tensor> t{torch::from_blob(data, {n}, options_of<T>())};
    c10d::AllreduceOptions o;
    o.reduceOp = op == xsoftmax::reduce_op::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    group_->allreduce(t, o)->wait();
  }

  /// Rank q's `counts[q]` elements, in rank order, into `recv` (sum(counts) elements).
  template <class T>
  void all_gather(const T* send, xsoftmax::index_t count, T* recv, const xsoftmax::index_t* counts) {
    const int s = size();
    if (count != counts[rank()])
      throw std::invalid_argument("process_group_communicator::all_gather: count = " + std::to_string(count) +
                                  " but counts[rank] = " + std::to_string(counts[rank()]));
    const xsoftmax::index_t widest = *std::max_element(counts, counts + s);
    if (widest == 0) return;
    at::Tensor mine = torch::zeros({widest}, options_of<T>());
    if (count > 0) std::memcpy(mine.data_ptr(), send, static_cast<std::size_t>(count) * sizeof(T));
    std::vector<std::vector<at::Tensor>> out(1);
    for (int q = 0; q < s; ++q) out[0].push_back(torch::empty({widest}, options_of<T>()));
    std::vector<at::Tensor> in{mine};
    group_->allgather(out, in)->wait();
    for (int q = 0; q < s; ++q) {
      if (counts[q] > 0) std::memcpy(recv, out[0][q].data_ptr(), static_cast<std::size_t>(counts[q]) * sizeof(T));
      recv += counts[q];
    }
  }

  /// Rank q receives in `recv` the element-wise sum over ranks of block q of `send` (`counts[q]`
  /// elements; `send` holds sum(counts) on every rank).
  template <class T>
  void reduce_scatter(const T* send, T* recv, const xsoftmax::index_t* counts) {
    const int s = size(), me = rank();
    xsoftmax::index_t total = 0, offset = 0;
    for (int q = 0; q < s; ++q) {
      if (q == me) offset = total;
      total += counts[q];
    }
    if (total == 0) return;
    at::Tensor all = torch::empty({total}, options_of<T>());
    std::memcpy(all.data_ptr(), send, static_cast<std::size_t>(total) * sizeof(T));
    std::vector<at::Tensor> t{all};
    group_->allreduce(t)->wait();
    if (counts[me] > 0)
      std::memcpy(recv, static_cast<const T*>(all.data_ptr()) + offset, static_cast<std::size_t>(counts[me]) * sizeof(T));
  }

  /// Rank p sends `send_counts[q]` elements (the blocks of `send`, in rank order) to rank q and
  /// receives `recv_counts[q]` from rank q into `recv`, in rank order.
  template <class T>
  void all_to_all(const T* send, const xsoftmax::index_t* send_counts, T* recv, const xsoftmax::index_t* recv_counts) {
    const int s = size();
    std::vector<int64_t> in_split(send_counts, send_counts + s), out_split(recv_counts, recv_counts + s);
    int64_t n_in = 0, n_out = 0;
    for (int q = 0; q < s; ++q) n_in += in_split[q], n_out += out_split[q];
    // c10d reads the input and writes the output in place; the input is never written.
    at::Tensor in = n_in > 0 ? torch::from_blob(const_cast<T*>(send), {n_in}, options_of<T>())
                             : torch::empty({0}, options_of<T>());
    at::Tensor out = n_out > 0 ? torch::from_blob(recv, {n_out}, options_of<T>()) : torch::empty({0}, options_of<T>());
    // alltoall_base is in every torch this package supports (>= 2.4); its successor
    // all_to_all_single only in recent ones, which mark alltoall_base deprecated.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    group_->alltoall_base(out, in, out_split, in_split)->wait();
#pragma GCC diagnostic pop
  }

 private:
  template <class T>
  static at::TensorOptions options_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, xsoftmax::index_t>,
                  "process_group_communicator: the library exchanges float and index_t buffers only");
    return at::TensorOptions().dtype(std::is_same_v<T, float> ? at::kFloat : at::kLong);
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

}  // namespace xsoftmax_torch
