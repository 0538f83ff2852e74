// SPDX-License-Identifier: Apache-2.0
// A host framework's resources in a head: every working buffer of a call comes from the caller's
// `device_memory_resource` (and all of it goes back), a borrowed cuBLAS handle is used and left as
// it was, and the results equal those of the library's own resources; a training step's gradient
// vectors come from the resource set by `set_vector_memory_resource`.

#include "support.cuh"

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace xsoftmax_cuda_test;
namespace xs = xsoftmax;

/// cudaMallocAsync / cudaFreeAsync (stream-ordered, as the contract asks), counting blocks and bytes.
struct counting_resource final : xs::device_memory_resource {
  long allocations = 0, live = 0;
  std::size_t live_bytes = 0, peak_bytes = 0;
  bool bad_size = false;  // deallocate was told another size than allocate was asked for

  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess) throw std::bad_alloc();
    ++allocations;
    ++live;
    live_bytes += bytes;
    peak_bytes = std::max(peak_bytes, live_bytes);
    sizes.push_back({p, bytes});
    return p;
  }
  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept override {
    for (auto it = sizes.begin(); it != sizes.end(); ++it)
      if (it->first == p) {
        bad_size = bad_size || it->second != bytes;
        sizes.erase(it);
        break;
      }
    cudaFreeAsync(p, stream);
    --live;
    live_bytes -= bytes;
  }

 private:
  std::vector<std::pair<void*, std::size_t>> sizes;
};

template <class Make>
void check_same_as_own_resources(Make make, const batch& b, const std::string& what) {
  const device_batch db(b);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  auto memory = std::make_shared<counting_resource>();
  fb_outputs own, external;
  {
    const auto ref = make(xs::cuda_resources(stream));
    own = forward_backward_device(ref, db, {}, {});
  }
  {
    const auto head = make(xs::cuda_resources(stream, memory));
    external = forward_backward_device(head, db, {}, {});
    external = forward_backward_device(head, db, {}, {});  // the second call reuses the workspace
    INFO(what);
    CHECK(memory->allocations > 0);
  }
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  INFO(what);
  CHECK(memory->live == 0);  // every block went back when the head and its resources were destroyed
  CHECK(memory->live_bytes == 0);
  CHECK_FALSE(memory->bad_size);
  check_same_outputs(external, own, 1e-6, what);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("cuda_resources with a device_memory_resource: every working buffer from it, results unchanged") {
  rng g(91);
  weights<__nv_bfloat16> w(g, 5000, 64, true);
  const batch b = make_batch(g, 300, 64, 5000, 0.1);
  check_same_as_own_resources(
      [&](xs::cuda_resources r) { return xs::full_softmax<xs::bf16, xs::cuda>(w.device_view(), w.device_bias(), r); }, b,
      "full softmax");

  using R = xs::runtime_tree<>;
  std::vector<double> counts(3000);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = 1.0 + static_cast<double>((i * 7919) % 13);
  const R tree = R::huffman(counts, 4);
  weights<float> hw(g, tree.num_rows(), 32, false);
  const batch hb = make_batch(g, 200, 32, 3000, 0.1);
  check_same_as_own_resources(
      [&](xs::cuda_resources r) { return xs::hierarchical_softmax<R, xs::fp32, xs::cuda>(tree, hw.device_view(), nullptr, r); },
      hb, "hierarchical softmax (Huffman, 4-ary)");
}

TEST_CASE("cuda_resources::use_cublas: a borrowed handle is used and kept; one bound to another stream is refused") {
  cudaStream_t stream = nullptr, other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  cublasHandle_t handle = nullptr;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);

  REQUIRE(cublasSetStream(handle, other) == CUBLAS_STATUS_SUCCESS);
  const xs::cuda_resources res(stream);
  CHECK_THROWS_AS(res.use_cublas(handle), xs::invalid_argument);
  CHECK(res.cublas() != handle);  // still the resources' own

  REQUIRE(cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS);
  rng g(93);
  weights<float> w(g, 700, 48, true);
  const batch b = make_batch(g, 64, 48, 700, 0.0);
  const device_batch db(b);
  const xs::full_softmax<xs::fp32, xs::cuda> own(w.device_view(), w.device_bias(), xs::cuda_resources(stream));
  const fb_outputs want = forward_backward_device(own, db, {}, {});
  {
    const xs::full_softmax<xs::fp32, xs::cuda> head(w.device_view(), w.device_bias(), res);
    res.use_cublas(handle);
    CHECK(head.resources().cublas() == handle);  // copies share the borrowed handle
    check_same_outputs(forward_backward_device(head, db, {}, {}), want, 1e-6, "borrowed cuBLAS handle");
    res.use_cublas(nullptr);
    CHECK(head.resources().cublas() != handle);
  }
  cudaStream_t bound = nullptr;
  CHECK(cublasGetStream(handle, &bound) == CUBLAS_STATUS_SUCCESS);
  CHECK(bound == stream);  // neither re-bound nor destroyed
  CHECK(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaStreamDestroy(other) == cudaSuccess);
}

TEST_CASE("set_vector_memory_resource: a step's gradient vectors come from the resource and all go back to it") {
  rng g(95);
  weights<float> w(g, 900, 32, true);
  const batch b = make_batch(g, 64, 32, 900, 0.0);
  const device_batch db(b);
  const xs::full_softmax<xs::fp32, xs::cuda> head(w.device_view(), w.device_bias());
  const fb_outputs want = forward_backward_device(head, db, {}, {});  // the gradient from cudaMalloc
  auto memory = std::make_shared<counting_resource>();
  xs::set_vector_memory_resource(memory);
  CHECK(xs::vector_memory_resource() == memory);
  const fb_outputs got = forward_backward_device(head, db, {}, {});  // its gradient is made now
  xs::set_vector_memory_resource(nullptr);
  CHECK(xs::vector_memory_resource() == nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(memory->allocations >= 3);  // the gradient's rows, values and bias values
  CHECK(memory->live == 0);         // all returned when the gradient went
  CHECK_FALSE(memory->bad_size);
  check_same_outputs(got, want, 1e-6, "gradient vectors from a resource");
}

}  // namespace
