// SPDX-License-Identifier: Apache-2.0
// Training a hierarchical-softmax output layer on the GPU: the loop a framework op runs.
//
//   * one `cuda_resources` on the trainer's stream (cuBLAS handle, workspace, Thrust allocator);
//   * bf16 weights on tensor cores, a two-level tree of ~sqrt(N) nodes over N = 200,000 classes;
//   * each step queued with `forward_backward_async` (the loss stays on the device), the sparse
//     gradient applied with `apply_sgd` (which waits for the step and throws a data error the step
//     recorded), the loss read back only every 20 steps;
//   * top-5 predictions for a few rows at the end.
//
// Build: cmake -S . -B build-cuda -DXSOFTMAX_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
//        cmake --build build-cuda --target cuda_training_step && ./build-cuda/examples/cuda_training_step
// Without a GPU it says so and exits with 0.

#include <xsoftmax/cuda.cuh>
#include <xsoftmax/tree/uniform_tree.hpp>

#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace xs = xsoftmax;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_training_step: no CUDA device here; nothing to run\n");
    return 0;
  }

  const xs::index_t num_classes = 200000, dim = 256, batch = 4096;
  using tree_t = xs::uniform_tree<2, 448>;  // 448^2 >= 200,000: two softmaxes of <= 448 classes per sample
  using head_t = xs::hierarchical_softmax<tree_t, xs::bf16, xs::cuda>;

  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  {
    const xs::cuda_resources resources(stream);
    head_t head(tree_t(num_classes), dim, /*with_bias=*/true, xs::init_options{}, resources);

    // A synthetic task: class c's "true" embedding is a fixed random vector; a sample is its
    // class's embedding plus noise, and classes are drawn from a Zipf-like law.
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    const xs::index_t prototypes = 4096;  // embeddings kept for the classes that get sampled
    std::vector<float> proto(static_cast<std::size_t>(prototypes * dim));
    for (auto& x : proto) x = normal(rng) / std::sqrt(static_cast<float>(dim));

    thrust::device_vector<__nv_bfloat16> hidden(static_cast<std::size_t>(batch * dim));
    thrust::device_vector<xs::index_t> targets(static_cast<std::size_t>(batch));
    thrust::device_vector<float> grad_hidden(static_cast<std::size_t>(batch * dim));
    thrust::device_vector<float> loss(1);
    head_t::gradient_type grad;  // reused every step: no allocation after the first

    std::vector<__nv_bfloat16> h_host(hidden.size());
    std::vector<xs::index_t> t_host(targets.size());
    const auto make_batch = [&] {
      for (xs::index_t i = 0; i < batch; ++i) {
        const auto c = static_cast<xs::index_t>(std::pow(static_cast<double>(prototypes), u01(rng))) - 1;
        t_host[static_cast<std::size_t>(i)] = c * (num_classes / prototypes);  // spread over all classes
        for (xs::index_t j = 0; j < dim; ++j)
          h_host[static_cast<std::size_t>(i * dim + j)] =
              __float2bfloat16(proto[static_cast<std::size_t>(c * dim + j)] * 4.f + 0.3f * normal(rng));
      }
      // Copies on the head's stream: ordered with the verbs that read them.
      cudaMemcpyAsync(thrust::raw_pointer_cast(hidden.data()), h_host.data(), h_host.size() * sizeof(__nv_bfloat16),
                      cudaMemcpyHostToDevice, stream);
      cudaMemcpyAsync(thrust::raw_pointer_cast(targets.data()), t_host.data(), t_host.size() * sizeof(xs::index_t),
                      cudaMemcpyHostToDevice, stream);
    };
    const xs::matrix_view<const __nv_bfloat16> h_view(thrust::raw_pointer_cast(hidden.data()), batch, dim);
    const xs::vector_view<const xs::index_t> t_view(thrust::raw_pointer_cast(targets.data()), batch);
    const xs::matrix_view<float> gh_view(thrust::raw_pointer_cast(grad_hidden.data()), batch, dim);
    const xs::vector_view<float> loss_view(thrust::raw_pointer_cast(loss.data()), 1);

    for (int step = 0; step <= 100; ++step) {
      make_batch();
      head.forward_backward_async(h_view, t_view, gh_view, grad, loss_view);
      head.apply_sgd(grad, 0.5f);  // waits for the step; throws a recorded data error instead
      if (step % 20 == 0) {
        const float l = loss[0];  // a device-to-host copy: only now and then
        std::printf("step %3d  loss %.3f  (gradient rows touched: %lld)\n", step, l,
                    static_cast<long long>(grad.num_rows()));
      }
    }

    // Top-5 classes of the first three rows of the last batch.
    const xs::index_t rows = 3, k = 5;
    thrust::device_vector<xs::index_t> cls(static_cast<std::size_t>(rows * k));
    thrust::device_vector<float> lps(static_cast<std::size_t>(rows * k));
    head.topk(xs::matrix_view<const __nv_bfloat16>(h_view.data, rows, dim), k,
              xs::matrix_view<xs::index_t>(thrust::raw_pointer_cast(cls.data()), rows, k),
              xs::matrix_view<float>(thrust::raw_pointer_cast(lps.data()), rows, k));
    const thrust::host_vector<xs::index_t> c = cls;
    const thrust::host_vector<float> p = lps;
    for (xs::index_t r = 0; r < rows; ++r) {
      std::printf("row %lld (class %lld): top-5", static_cast<long long>(r),
                  static_cast<long long>(t_host[static_cast<std::size_t>(r)]));
      for (xs::index_t j = 0; j < k; ++j)
        std::printf("  %lld (p=%.2f)", static_cast<long long>(c[static_cast<std::size_t>(r * k + j)]),
                    std::exp(p[static_cast<std::size_t>(r * k + j)]));
      std::printf("\n");
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}
