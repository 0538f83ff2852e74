// SPDX-License-Identifier: Apache-2.0
//
// The library's communicator concept (see include/xsoftmax/sharding/class_sharding.hpp) over a
// torch.distributed process group, so that a class-sharded head runs over the group a PyTorch job
// already has: `process_group_communicator` for the host backends' buffers (gloo or MPI),
// `process_group_device_communicator` for the cuda backend's device buffers (NCCL, or any group
// through host copies). No transport of our own: every verb is one c10d collective on tensors that
// view (or, where c10d needs equal sizes, pad) the library's buffers, waited for before it returns.

#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/extension.h>

#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/types.hpp>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace xsoftmax_torch {

/// A communicator over a c10d process group (`torch.distributed`'s group object, passed from
/// Python). `DeviceMemory` false: the library's buffers are host memory (the `omp` backend); true:
/// device memory of the current CUDA device (the `cuda` backend, `device_memory` of the concept).
/// Copies share the group.
///
/// Device buffers go to the group's CUDA backend as they are when it is NCCL: the collectives are
/// ordered after, and `wait()` orders torch's current stream after them, the stream the head runs
/// on (no host wait). Any other group (gloo, whose CUDA support lacks all-gather and all-to-all)
/// gets host copies of the buffers: correct, and slower by a device round trip per verb. With
/// several ranks on one GPU (NCCL refuses two ranks on one device) gloo is what tests them.
///
/// Costs: `all_reduce` is one c10d all-reduce. `all_gather` pads every rank's block to the
/// largest count (c10d's all-gather takes equal sizes), so it moves size() x max(counts) elements.
/// `reduce_scatter` is an all-reduce of the whole buffer followed by a copy of this rank's block:
/// gloo offers no reduce-scatter on CPU tensors, so it moves size() times the bytes a true
/// reduce-scatter would (the hidden gradients of a data-parallel step; the weight gradients never
/// travel). `all_to_all` is one c10d all-to-all with split sizes.
template <bool DeviceMemory>
class basic_process_group_communicator {
 public:
  /// Whether the library's buffers are device memory (see class_sharding.hpp).
  static constexpr bool device_memory = DeviceMemory;

  /// The library's buffers live on `data_device` (the CPU, or with DeviceMemory the CUDA device the
  /// head runs on). Throws `std::invalid_argument` for a null group or a device of the wrong kind.
  explicit basic_process_group_communicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                            c10::Device data_device = c10::Device(c10::kCPU))
      : group_(std::move(group)), data_device_(data_device) {
    if (!group_) throw std::invalid_argument("process_group_communicator: group is null");
    if (data_device_.is_cuda() != DeviceMemory)
      throw std::invalid_argument("process_group_communicator: buffers on " + data_device_.str() + " need the " +
                                  (DeviceMemory ? "host" : "device") + " communicator");
    if constexpr (DeviceMemory) staged_ = !nccl_for_cuda(*group_);
  }

  [[nodiscard]] int rank() const { return group_->getRank(); }
  [[nodiscard]] int size() const { return group_->getSize(); }
  /// Whether device buffers travel through host copies (a group without NCCL for CUDA tensors).
  [[nodiscard]] bool staged() const { return staged_; }

  /// In place: every rank gets the element-wise sum (or max) of every rank's `data[0, n)`.
  template <class T>
  void all_reduce(T* data, xsoftmax::index_t n, xsoftmax::reduce_op op) {
    if (n == 0) return;  // n is the same on every rank: every rank skips
    const at::Tensor mine = view(data, n);
    std::vector<at::Tensor> t{staged_ ? mine.to(c10::kCPU) : mine};
    c10d::AllreduceOptions o;
    o.reduceOp = op == xsoftmax::reduce_op::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    group_->allreduce(t, o)->wait();
    if (staged_) mine.copy_(t[0]);
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
    at::Tensor mine = torch::zeros({widest}, collective_options<T>());
    if (count > 0) mine.narrow(0, 0, count).copy_(view(send, count));
    std::vector<std::vector<at::Tensor>> out(1);
    for (int q = 0; q < s; ++q) out[0].push_back(torch::empty({widest}, collective_options<T>()));
    std::vector<at::Tensor> in{mine};
    group_->allgather(out, in)->wait();
    for (int q = 0; q < s; ++q) {
      if (counts[q] > 0) view(recv, counts[q]).copy_(out[0][q].narrow(0, 0, counts[q]));
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
    std::vector<at::Tensor> t{torch::empty({total}, collective_options<T>())};
    t[0].copy_(view(send, total));
    group_->allreduce(t)->wait();
    if (counts[me] > 0) view(recv, counts[me]).copy_(t[0].narrow(0, offset, counts[me]));
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
    const at::Tensor mine_in = view(send, n_in), mine_out = view(recv, n_out);
    at::Tensor in = staged_ ? mine_in.to(c10::kCPU) : mine_in;
    at::Tensor out = staged_ ? torch::empty({n_out}, collective_options<T>()) : mine_out;
    // alltoall_base is in every torch this package supports (>= 2.4); its successor
    // all_to_all_single only in recent ones, which mark alltoall_base deprecated.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    group_->alltoall_base(out, in, out_split, in_split)->wait();
#pragma GCC diagnostic pop
    if (staged_ && n_out > 0) mine_out.copy_(out);
  }

 private:
  template <class T>
  static at::ScalarType scalar_type() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, xsoftmax::index_t>,
                  "process_group_communicator: the library exchanges float and index_t buffers only");
    return std::is_same_v<T, float> ? at::kFloat : at::kLong;
  }

  /// The library's buffer `data[0, n)` as a tensor on its device (no copy; an empty tensor for n = 0).
  /// A view of a const buffer is only read (the source of a copy or of a collective's input).
  template <class T>
  at::Tensor view(const T* data, xsoftmax::index_t n) const {
    const auto o = at::TensorOptions().dtype(scalar_type<T>()).device(data_device_);
    return n > 0 ? torch::from_blob(const_cast<T*>(data), {n}, o) : torch::empty({0}, o);
  }

  /// Where the collectives' own buffers live: the data's device, or the host when staged.
  template <class T>
  at::TensorOptions collective_options() const {
    return at::TensorOptions().dtype(scalar_type<T>()).device(staged_ ? c10::Device(c10::kCPU) : data_device_);
  }

  /// Whether `group` runs collectives on CUDA tensors with NCCL (else device buffers are staged).
  static bool nccl_for_cuda(c10d::ProcessGroup& group) {
    try {
      return group.getBackend(c10::DeviceType::CUDA)->getBackendName() == "nccl";
    } catch (const c10::Error&) {  // no backend for CUDA tensors in this group
      return false;
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device data_device_{c10::kCPU};
  bool staged_ = false;
};

/// Host buffers (the `omp` backend's heads).
using process_group_communicator = basic_process_group_communicator<false>;
/// Device buffers of the current CUDA device (the `cuda` backend's heads).
using process_group_device_communicator = basic_process_group_communicator<true>;

}  // namespace xsoftmax_torch
