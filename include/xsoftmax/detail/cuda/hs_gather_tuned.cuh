// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tuned CUDA specialisation of the hierarchical softmax's gather path
/// (detail/hierarchical/gather_runs.hpp): one warp per sample instead of one thread per run, so a
/// level's many short runs fill the GPU; when the level's blocks are wide, one block per node and
/// up to 16 of its samples (`gather_run_wide_kernel`: the node's rows read once for all of them), or
/// one block per sample (`gather_level_wide_kernel`) for rows too long for its shared memory. The
/// warp reads the node's rows in place, writes the
/// sample's dLoss/dscore values to the level's scratch and adds into its own grad_hidden row; then
/// one block per (run, child row) sums G_ij * h_i over the run's samples in order. Same results as
/// the generic version up to summation order inside a dot product (the lanes' partial sums); no
/// atomics, deterministic. The generic version is its oracle in the GPU tests.

#include <xsoftmax/detail/cuda/backend_ops.cuh>
#include <xsoftmax/detail/cuda/launch.cuh>
#include <xsoftmax/detail/cuda/warp.cuh>
#include <xsoftmax/detail/hierarchical/gather_runs.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace xsoftmax::detail {
namespace gpu {

/// One warp per sorted row r in [row0, row0 + rows) that lies in one of the level's gather runs:
/// scores against the node's rows, loss[r] += -log p(child), and with gradients the row's
/// dLoss/dscore into the scratch and grad_h[r] += G W.
template <bool Sigmoid, class T>
__global__ void gather_level_kernel(const node_run* runs, index_t n_runs, index_t row0, index_t rows,
                                    node_run_data<T> a) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const index_t warps = grid_threads() / warp_size, d = a.dim;
  for (index_t r = row0 + global_thread() / warp_size; r < row0 + rows; r += warps) {
    // The run holding r: the last one with begin <= r (runs are in row order). Warp-uniform.
    const index_t lo = runs_started_by(runs, n_runs, r, &node_run::begin);
    if (lo == 0) continue;
    const node_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const float* h = a.h + r * d;
    const index_t i = r - run.begin, c = a.child[r];
    if constexpr (Sigmoid) {
      const index_t node = run.block_begin / 2;
      const T* wr = a.w.row(node);
      const float s = warp_dot(h, wr, d, lane) + (a.bias ? to_float(a.bias[node]) : 0.f);
      const bool first = c == 0;
      if (lane == 0) a.loss[r] += softplus(first ? -s : s);
      if (a.backward()) {
        const float gs = (sigmoid(s) - (first ? 1.f : 0.f)) * a.upstream[r];
        if (lane == 0) a.scratch[run.scratch_offset + i] = gs;
        for (index_t p = lane; p < d; p += warp_size) a.grad_h[r * d + p] += gs * to_float(wr[p]);
      }
    } else {
      const index_t bs = run.block_size;
      float* sr = a.scratch + run.scratch_offset + i * bs;
      float m = -INFINITY;
      for (index_t j = 0; j < bs; ++j) {
        const index_t row = run.block_begin + j;
        const float s = warp_dot(h, a.w.row(row), d, lane) + (a.bias ? to_float(a.bias[row]) : 0.f);
        if (lane == 0) sr[j] = s;
        m = s > m ? s : m;  // identical on every lane
      }
      __syncwarp();  // lane 0's score writes are visible to the warp
      float part = 0.f;
      for (index_t j = lane; j < bs; j += warp_size) part += expf(sr[j] - m);
      const float lse = m + logf(warp_sum(part));
      if (lane == 0) a.loss[r] += lse - sr[c];
      if (a.backward()) {
        const float u = a.upstream[r];
        __syncwarp();  // every lane has read the scores it needs before they are overwritten
        for (index_t j = lane; j < bs; j += warp_size) {
          float gj = expf(sr[j] - lse) * u;
          if (j == c) gj -= u;
          sr[j] = gj;
        }
        __syncwarp();  // G visible to the warp
        for (index_t j = 0; j < bs; ++j) {
          const float gj = sr[j];
          const T* wr = a.w.row(run.block_begin + j);
          for (index_t p = lane; p < d; p += warp_size) a.grad_h[r * d + p] += gj * to_float(wr[p]);
        }
      }
    }
  }
}

/// Blocks of at least this many children take `gather_level_wide_kernel`: with one warp scoring a
/// 1024-child node alone (1024 dependent dot products), the level took 9.4 ms a call on an H100
/// (bench/RESULTS.md, "second GPU session").
inline constexpr index_t gather_wide_block = 64;

/// `gather_level_kernel` for softmax nodes with wide blocks: one block of Threads threads per
/// sorted row, its warps splitting the node's children (a warp per child's dot product, as there),
/// the row's max and sum of exp by block reductions (`block_max_sum`), and grad_h's columns split
/// over the threads, each adding G_j w_j[p] over the children j in order (the warp kernel's order).
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    gather_level_wide_kernel(const node_run* runs, index_t n_runs, index_t row0, index_t rows, node_run_data<T> a) {
  __shared__ typename cub::BlockReduce<float, Threads>::TempStorage temp;
  constexpr int warps = Threads / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size, warp = static_cast<int>(threadIdx.x) / warp_size;
  const index_t d = a.dim;
  for (index_t r = row0 + blockIdx.x; r < row0 + rows; r += gridDim.x) {
    // The run holding r (block-uniform, so the barriers below are reached by every thread).
    const index_t lo = runs_started_by(runs, n_runs, r, &node_run::begin);
    if (lo == 0) continue;
    const node_run run = runs[lo - 1];
    if (r >= run.end) continue;
    const float* h = a.h + r * d;
    const index_t i = r - run.begin, c = a.child[r], bs = run.block_size;
    float* sr = a.scratch + run.scratch_offset + i * bs;
    for (index_t j = warp; j < bs; j += warps) {
      const index_t row = run.block_begin + j;
      const float s = warp_dot(h, a.w.row(row), d, lane) + (a.bias ? to_float(a.bias[row]) : 0.f);
      if (lane == 0) sr[j] = s;
    }
    __syncthreads();  // every score written before any thread reads them
    const float2 ms = block_max_sum<Threads>(sr, bs, temp);
    const float lse = ms.x != -INFINITY ? ms.x + logf(ms.y) : -INFINITY;
    // The thread that owns entry c (it overwrites it below, after this read).
    if (threadIdx.x == c % Threads) a.loss[r] += lse - sr[c];
    if (!a.backward()) continue;
    const float u = a.upstream[r];
    for (index_t j = threadIdx.x; j < bs; j += Threads) {
      float gj = expf(sr[j] - lse) * u;
      if (j == c) gj -= u;
      sr[j] = gj;
    }
    __syncthreads();  // G visible to the block
    for (index_t p = threadIdx.x; p < d; p += Threads) {
      float acc = a.grad_h[r * d + p];
      for (index_t j = 0; j < bs; ++j) acc += sr[j] * to_float(a.w.row(run.block_begin + j)[p]);
      a.grad_h[r * d + p] = acc;
    }
  }
}

/// A piece of a wide gather run for `gather_run_wide_kernel`: `samples` rows from the run's row
/// `first` (relative to its begin), at most the kernel's sample group.
struct run_piece {
  index_t run = 0, first = 0, samples = 0;
};

/// Columns of dLoss/dscore staged in shared memory at a time by `gather_run_wide_kernel`.
inline constexpr index_t run_wide_tile = 128;

/// Shared memory of `gather_run_wide_kernel` for groups of S samples of dimension d: the group's
/// hidden rows and one tile of its dLoss/dscore values.
template <int S>
[[nodiscard]] constexpr std::size_t run_wide_shared_bytes(index_t d) {
  return static_cast<std::size_t>(S) * static_cast<std::size_t>(d + run_wide_tile) * sizeof(float);
}

/// The wide softmax-node gather runs scored a node at a time: block k takes piece k (up to S
/// samples of one run) and reads the node's child rows once for all of them, where
/// `gather_level_wide_kernel` reads them once per sample (a 1024-child node of bf16 rows of 512 is
/// 1 MB: a level of 8192 samples moved 8.6 GB through L2 for 1 GB of rows, 48 % of the 2-level HS
/// step on an H200, bench/RESULTS.md). The samples' hidden rows wait in shared memory; a warp scores
/// one child row against all of them (each lane's partial sums in the order of `warp_dot`, so the
/// scores are bitwise those of the per-sample kernels); a warp per sample then takes its
/// log-sum-exp, loss and dLoss/dscore; and the threads, split over the columns of grad_h, add
/// G_ij w_j[p] over the children j in order for every sample at once, G staged in shared memory by
/// tiles. With `weight_grad` (every run one piece) the same loop writes the node's weight-gradient
/// rows, grad_w_j[p] = sum_i G_ij h_i[p] (and the bias's), in `gather_weight_grad_kernel`'s order:
/// bitwise its values, without reading the rows' G and hidden values back from memory.
template <int Threads, int S, class T>
__global__ void __launch_bounds__(Threads, 2)  // two blocks an SM: registers for S sums without spilling
    gather_run_wide_kernel(const node_run* runs, const run_piece* pieces, index_t n_pieces, node_run_data<T> a,
                           bool weight_grad) {
  extern __shared__ float4 shared_words[];  // float4: the G tile is read 16 bytes at a time
  static_assert(S % 4 == 0 && Threads % warp_size == 0);
  constexpr int warps = Threads / warp_size;
  constexpr index_t tile = run_wide_tile;
  constexpr int unroll = 8;
  float* const g_tile = reinterpret_cast<float*>(shared_words);  // tile x S, sample fastest
  float* const hs = g_tile + tile * S;                             // S x d, hidden rows
  const int lane = static_cast<int>(threadIdx.x) % warp_size, warp = static_cast<int>(threadIdx.x) / warp_size;
  const index_t d = a.dim;
  for (index_t k = blockIdx.x; k < n_pieces; k += gridDim.x) {
    const run_piece piece = pieces[k];
    const node_run run = runs[piece.run];
    const index_t bs = run.block_size, n = piece.samples, r0 = run.begin + piece.first;
    float* const g = a.scratch + run.scratch_offset + piece.first * bs;  // n x bs: scores, then G
    __syncthreads();  // the previous piece is done with the shared memory
    for (index_t e = threadIdx.x; e < S * d; e += Threads) {
      const index_t i = e / d;
      hs[e] = i < n ? a.h[(r0 + i) * d + e % d] : 0.f;
    }
    __syncthreads();
    // Scores: a warp per child row, its S dot products side by side.
    for (index_t j = warp; j < bs; j += warps) {
      const index_t row = run.block_begin + j;
      const T* wr = a.w.row(row);
      float acc[S];
#pragma unroll
      for (int i = 0; i < S; ++i) acc[i] = 0.f;
      // Eight of the row's loads in flight before their products (a sample's sum still runs over
      // p = lane, lane + 32, ... in order).
      index_t p = lane;
      for (; p + (unroll - 1) * warp_size < d; p += unroll * warp_size) {
        float wv[unroll];
#pragma unroll
        for (int u = 0; u < unroll; ++u) wv[u] = to_float(wr[p + u * warp_size]);
#pragma unroll
        for (int u = 0; u < unroll; ++u)
#pragma unroll
          for (int i = 0; i < S; ++i)
            if (i < n) acc[i] += hs[i * d + p + u * warp_size] * wv[u];  // a group's unused sums read nothing
      }
      for (; p < d; p += warp_size) {
        const float wv = to_float(wr[p]);
#pragma unroll
        for (int i = 0; i < S; ++i)
          if (i < n) acc[i] += hs[i * d + p] * wv;
      }
      const float b = a.bias ? to_float(a.bias[row]) : 0.f;
#pragma unroll
      for (int i = 0; i < S; ++i) {
        const float s = warp_sum(acc[i]) + b;
        if (lane == 0 && i < n) g[i * bs + j] = s;
      }
    }
    __syncthreads();  // every score written before any warp reads a sample's row
    // A warp per sample: log-sum-exp, loss, and with gradients G = (softmax - onehot) u in place.
    for (index_t i = warp; i < n; i += warps) {
      float* gi = g + i * bs;
      const index_t r = r0 + i, c = a.child[r];
      float m = -INFINITY;
      for (index_t j = lane; j < bs; j += warp_size) m = gi[j] > m ? gi[j] : m;
      m = warp_max(m);
      float part = 0.f;
      if (m != -INFINITY)
        for (index_t j = lane; j < bs; j += warp_size) part += expf(gi[j] - m);
      const float sum = warp_sum(part), lse = m != -INFINITY ? m + logf(sum) : -INFINITY;
      // The lane that owns entry c reads it before overwriting it below.
      if (lane == c % warp_size) a.loss[r] += lse - gi[c];
      if (!a.backward()) continue;
      const float u = a.upstream[r];
      for (index_t j = lane; j < bs; j += warp_size) {
        float gj = expf(gi[j] - lse) * u;
        if (j == c) gj -= u;
        gi[j] = gj;
      }
    }
    if (!a.backward()) continue;  // block-uniform
    // grad_h[r_i][p] += sum_j G_ij w_j[p], j in order (the per-sample kernels' order), every sample
    // of the piece at once: a thread per column, G by tiles of children in shared memory.
    for (index_t p0 = 0; p0 < d; p0 += Threads) {
      const index_t p = p0 + threadIdx.x;
      const bool column = p < d;
      float acc[S], hp[S];  // grad_h[r_i][p] so far; h_i[p] for the weight gradient
#pragma unroll
      for (int i = 0; i < S; ++i) {
        acc[i] = column && i < n ? a.grad_h[(r0 + i) * d + p] : 0.f;
        hp[i] = column ? hs[i * d + p] : 0.f;
      }
      float* const gw = a.grad_w + run.grad_offset * d + p;  // with weight_grad: row j at gw[j * d]
      for (index_t j0 = 0; j0 < bs; j0 += tile) {
        const index_t jn = bs - j0 < tile ? bs - j0 : tile;
        __syncthreads();  // G written (first tile) or the previous tile consumed
        for (index_t e = threadIdx.x; e < jn * S; e += Threads) {
          const index_t i = e % S, jj = e / S;
          g_tile[e] = i < n ? g[i * bs + j0 + jj] : 0.f;
        }
        __syncthreads();
        if (weight_grad && a.grad_b && p0 == 0)  // the bias gradient: sum_i G_ij, i in order
          for (index_t jj = threadIdx.x; jj < jn; jj += Threads) {
            float sum = 0.f;
            for (index_t i = 0; i < n; ++i) sum += g_tile[jj * S + i];
            a.grad_b[run.grad_offset + j0 + jj] = sum;
          }
        if (!column) continue;
        const auto add = [&](index_t jj, float wv) {
          const float4* gj = shared_words + jj * (S / 4);
          float gsum = 0.f;  // sum_i G_ij h_i[p], i in order
#pragma unroll
          for (int q = 0; q < S / 4; ++q) {
            if (4 * q >= n) break;  // the group's unused samples
            const float4 v = gj[q];
            acc[4 * q] += v.x * wv;
            acc[4 * q + 1] += v.y * wv;
            acc[4 * q + 2] += v.z * wv;
            acc[4 * q + 3] += v.w * wv;
            if (weight_grad) {
              if (4 * q < n) gsum += v.x * hp[4 * q];
              if (4 * q + 1 < n) gsum += v.y * hp[4 * q + 1];
              if (4 * q + 2 < n) gsum += v.z * hp[4 * q + 2];
              if (4 * q + 3 < n) gsum += v.w * hp[4 * q + 3];
            }
          }
          if (weight_grad) gw[(j0 + jj) * d] = gsum;
        };
        const T* w0 = a.w.row(run.block_begin + j0) + p;
        const index_t stride = a.w.stride;
        index_t jj = 0;
        for (; jj + unroll <= jn; jj += unroll) {  // eight rows' loads in flight, then their products in order
          float wv[unroll];
#pragma unroll
          for (int u = 0; u < unroll; ++u) wv[u] = to_float(w0[(jj + u) * stride]);
#pragma unroll
          for (int u = 0; u < unroll; ++u) add(jj + u, wv[u]);
        }
        for (; jj < jn; ++jj) add(jj, to_float(w0[jj * stride]));
      }
      if (column)
#pragma unroll
        for (int i = 0; i < S; ++i)
          if (i < n) a.grad_h[(r0 + i) * d + p] = acc[i];
    }
  }
}

/// Cuts the runs into pieces of at most S samples, in run order (the wide kernel's grid).
template <int S>
[[nodiscard]] inline std::vector<run_piece> run_pieces(const std::vector<node_run>& runs) {
  std::vector<run_piece> out;
  for (std::size_t k = 0; k < runs.size(); ++k)
    for (index_t i = 0; i < runs[k].end - runs[k].begin; i += S)
      out.push_back({static_cast<index_t>(k), i, std::min<index_t>(S, runs[k].end - runs[k].begin - i)});
  return out;
}

/// Weight (and bias) gradient of the gather runs: block (run, y) handles the run's child rows
/// j = y, y + gridDim.y, ...; thread p sums G_ij * h_i[p] over the run's rows i in order.
template <bool Sigmoid, class T>
__global__ void gather_weight_grad_kernel(const node_run* runs, node_run_data<T> a) {
  const node_run run = runs[blockIdx.x];
  const index_t d = a.dim, len = run.end - run.begin, width = Sigmoid ? 1 : run.block_size;
  const float* g = a.scratch + run.scratch_offset;
  for (index_t j = blockIdx.y; j < width; j += gridDim.y) {
    float* out = a.grad_w + (run.grad_offset + j) * d;
    for (index_t p = threadIdx.x; p < d; p += blockDim.x) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += g[i * width + j] * a.h[(run.begin + i) * d + p];
      out[p] = acc;
    }
    if (a.grad_b && threadIdx.x == 0) {
      float acc = 0.f;
      for (index_t i = 0; i < len; ++i) acc += g[i * width + j];
      a.grad_b[run.grad_offset + j] = acc;
    }
  }
}

}  // namespace gpu

template <class T, bool Sigmoid>
struct gather_runs_tuning<::xsoftmax::cuda, T, Sigmoid> {
  static constexpr bool available = true;

  static void run(const execution<::xsoftmax::cuda>& ex, const node_run_data<T>& a,
                  const std::vector<node_run>& runs) {
    const cudaStream_t stream = ex.res.stream();
    const index_t n_runs = static_cast<index_t>(runs.size());
    const index_t row0 = runs.front().begin, rows = runs.back().end - row0;
    index_t max_width = 1, samples = 0;
    for (const node_run& run : runs) {
      max_width = std::max(max_width, Sigmoid ? index_t(1) : run.block_size);
      samples += run.end - run.begin;
    }
    constexpr int warps_per_block = gpu::block_threads / gpu::warp_size;
    const bool wide = !Sigmoid && max_width >= gpu::gather_wide_block;
    // Wide blocks a node at a time: 16 samples a block where runs average 4 or more (on a GPU the
    // gather runs are those under `gemm_min_run`, 16 by default: one piece each), 4 where they
    // average 2 or more (a group's unused sums cost arithmetic, not reads), within the default 48 KB
    // of shared memory (rows of up to 640 / 2944 values). Otherwise, or with
    // XSOFTMAX_CUDA_HS_GATHER=per_sample, a block per sample.
    const index_t per_run = samples / n_runs;
    const bool by_node = wide && !per_sample_forced();
    int piece_samples = 0;  // the node-at-a-time kernel's samples a block (0: not used)
    if (by_node && per_run >= 4 && gpu::run_wide_shared_bytes<16>(a.dim) <= 48 * 1024)
      piece_samples = 16;
    else if (by_node && per_run >= 2 && gpu::run_wide_shared_bytes<4>(a.dim) <= 48 * 1024)
      piece_samples = 4;
    const std::vector<gpu::run_piece> pieces = piece_samples == 16  ? gpu::run_pieces<16>(runs)
                                               : piece_samples == 4 ? gpu::run_pieces<4>(runs)
                                                                    : std::vector<gpu::run_piece>();
    // The runs and their pieces in one upload (working memory of the call; was one each).
    scratch_lists<::xsoftmax::cuda, node_run, gpu::run_piece> device(ex, runs, pieces);
    const node_run* device_runs = device.template list<0>();
    bool weight_grad_done = false;
    if (piece_samples == 16)
      weight_grad_done = run_wide<16>(ex, a, runs.size(), device_runs, pieces.size(), device.template list<1>());
    else if (piece_samples == 4)
      weight_grad_done = run_wide<4>(ex, a, runs.size(), device_runs, pieces.size(), device.template list<1>());
    else if (wide)
      gpu::gather_level_wide_kernel<gpu::block_threads, T><<<gpu::grid_rows(rows), gpu::block_threads, 0, stream>>>(
          device_runs, n_runs, row0, rows, a);
    else
      gpu::gather_level_kernel<Sigmoid, T><<<gpu::grid_for(rows, warps_per_block), gpu::block_threads, 0, stream>>>(
          device_runs, n_runs, row0, rows, a);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
    if (!a.backward() || weight_grad_done) return;
    expects(n_runs <= static_cast<index_t>(INT_MAX), "hierarchical_softmax: ", n_runs,
            " gather runs in one level exceed the CUDA grid limit");
    const dim3 grid(static_cast<unsigned>(n_runs), static_cast<unsigned>(std::min<index_t>(max_width, 64)));
    gpu::gather_weight_grad_kernel<Sigmoid, T><<<grid, 128, 0, stream>>>(device_runs, a);
    XSOFTMAX_CUDA_CHECK_LAUNCH();
  }

  /// Whether the environment variable XSOFTMAX_CUDA_HS_GATHER=per_sample asks for the block-per-sample
  /// kernel on wide blocks (the node-at-a-time kernel's predecessor, kept for A/B benchmarks). Read once.
  [[nodiscard]] static bool per_sample_forced() {
    static const bool on = [] {
      const char* v = std::getenv("XSOFTMAX_CUDA_HS_GATHER");
      return v != nullptr && std::string_view(v) == "per_sample";
    }();
    return on;
  }

  /// The level's wide runs by `gpu::gather_run_wide_kernel`, in pieces of S samples (`run_pieces<S>`,
  /// uploaded with the runs); returns whether it wrote their weight gradient too (with gradients,
  /// when every run is one piece).
  template <int S>
  static bool run_wide(const execution<::xsoftmax::cuda>& ex, const node_run_data<T>& a, std::size_t n_runs,
                       const node_run* device_runs, std::size_t n_pieces, const gpu::run_piece* device_pieces) {
    const index_t n = static_cast<index_t>(n_pieces);
    const bool weight_grad = a.backward() && n_pieces == n_runs;
    gpu::gather_run_wide_kernel<gpu::block_threads, S, T>
        <<<gpu::grid_rows(n), gpu::block_threads, gpu::run_wide_shared_bytes<S>(a.dim), ex.res.stream()>>>(
            device_runs, device_pieces, n, a, weight_grad);
    return weight_grad;
  }
};

}  // namespace xsoftmax::detail
