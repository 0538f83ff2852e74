// SPDX-License-Identifier: Apache-2.0
// The host mock of the CUDA runtime and NCCL calls that nccl_communicator makes, for
// xsoftmax_nccl_mock_tests (see nccl_mock.hpp and nccl_mock_mpi.cpp): "device" memory is host
// memory, cudaMemcpyAsync is memmove, ncclAllGather / ncclReduceScatter / ncclAllReduce are the MPI
// collectives of MPI_COMM_WORLD, ncclSend / ncclRecv are posted at ncclGroupEnd as MPI_Isend /
// MPI_Irecv, and the stream and event calls are logged (nccl_mock::log) for the tests of
// start_all_gather's ordering.

#include "nccl_mock.hpp"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// ---- the mock ------------------------------------------------------------------------------------
namespace {
MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclInt64: return MPI_INT64_T;
    default: std::abort();
  }
}
/// The point-to-point calls of an open ncclGroupStart .. ncclGroupEnd, posted at ncclGroupEnd.
struct mock_p2p {
  bool send;
  void* buffer;
  int count;
  MPI_Datatype type;
  int peer;
};
std::vector<mock_p2p> mock_group;
int mock_group_depth = 0;
}  // namespace

namespace nccl_mock {
int comm_object;
std::vector<call> log;
int live_events = 0, live_streams = 0;
}  // namespace nccl_mock

extern "C" {
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  nccl_mock::log.push_back({"cudaMemcpyAsync", s, nullptr});
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  nccl_mock::log.push_back({"cudaStreamSynchronize", s, nullptr});
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  ++nccl_mock::live_streams;
  nccl_mock::log.push_back({"cudaStreamCreateWithFlags", *s, nullptr});
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  --nccl_mock::live_streams;
  nccl_mock::log.push_back({"cudaStreamDestroy", s, nullptr});
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new char);
  ++nccl_mock::live_events;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  --nccl_mock::live_events;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  nccl_mock::log.push_back({"cudaEventRecord", s, e});
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  nccl_mock::log.push_back({"cudaStreamWaitEvent", s, e});
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  nccl_mock::log.push_back({"cudaEventSynchronize", nullptr, e});
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }  // the mock runs every call at once
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "mock"; }
const char* cudaGetErrorString(cudaError_t) { return "mock"; }
ncclResult_t ncclCommUserRank(const ncclComm_t, int* rank) { return MPI_Comm_rank(MPI_COMM_WORLD, rank) ? ncclSystemError : ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t, int* size) { return MPI_Comm_size(MPI_COMM_WORLD, size) ? ncclSystemError : ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t) { return "mock NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t,
                           cudaStream_t) {
  return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(n), mpi_type(t),
                       op == ncclMax ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD) ? ncclSystemError : ncclSuccess;
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t n, ncclDataType_t t, ncclComm_t, cudaStream_t s) {
  nccl_mock::log.push_back({"ncclAllGather", s, nullptr});
  return MPI_Allgather(send, static_cast<int>(n), mpi_type(t), recv, static_cast<int>(n), mpi_type(t), MPI_COMM_WORLD)
             ? ncclSystemError : ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++mock_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* send, size_t n, ncclDataType_t t, int peer, ncclComm_t, cudaStream_t) {
  if (mock_group_depth == 0) return ncclInvalidUsage;  // the communicator always groups its calls
  mock_group.push_back({true, const_cast<void*>(send), static_cast<int>(n), mpi_type(t), peer});
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* recv, size_t n, ncclDataType_t t, int peer, ncclComm_t, cudaStream_t) {
  if (mock_group_depth == 0) return ncclInvalidUsage;
  mock_group.push_back({false, recv, static_cast<int>(n), mpi_type(t), peer});
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (--mock_group_depth > 0) return ncclSuccess;
  std::vector<MPI_Request> requests(mock_group.size());
  for (std::size_t i = 0; i < mock_group.size(); ++i) {
    const mock_p2p& p = mock_group[i];
    const int rc = p.send ? MPI_Isend(p.buffer, p.count, p.type, p.peer, 77, MPI_COMM_WORLD, &requests[i])
                          : MPI_Irecv(p.buffer, p.count, p.type, p.peer, 77, MPI_COMM_WORLD, &requests[i]);
    if (rc != MPI_SUCCESS) return ncclSystemError;
  }
  mock_group.clear();
  return MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE) ? ncclSystemError
                                                                                                : ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), mpi_type(t), MPI_SUM, MPI_COMM_WORLD)
             ? ncclSystemError : ncclSuccess;
}
}
