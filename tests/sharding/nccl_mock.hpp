// SPDX-License-Identifier: Apache-2.0
#pragma once
// nccl_communicator over the host mock of nccl_mock.cpp (no GPU, no libnccl): what the tests see
// of the mock, and the permission for a host head to hand its buffers to the communicator.

#include <xsoftmax/detail/sharding/sharded_rows.hpp>
#include <xsoftmax/sharding/nccl_communicator.cuh>

#include <string>
#include <vector>

namespace nccl_mock {
/// One stream or event call of the mock: what was called, on which stream, with which event.
struct call {
  std::string what;
  cudaStream_t stream;
  cudaEvent_t event;
};
extern std::vector<call> log;          ///< every stream and event call, in order
extern int live_events, live_streams;  ///< created and not yet destroyed
extern int comm_object;                ///< its address is the mock's ncclComm_t
}  // namespace nccl_mock

// The mock's "device" memory is host memory: let a host head hand its buffers to the communicator.
namespace xsoftmax::detail {
template <>
inline constexpr bool device_communicator_on_host<nccl_communicator> = true;
}  // namespace xsoftmax::detail
