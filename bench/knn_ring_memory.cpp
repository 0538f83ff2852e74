// SPDX-License-Identifier: Apache-2.0
// The class-sharded knn_softmax's graph build and selection: bytes each rank receives and the peak
// memory it adds, through the ring (mpi_communicator has `shift`: each rank keeps its own graph
// rows) or the gathered path it replaces (the same communicator with `shift` hidden: the weights and
// the whole graph all-gathered to every rank). Issue 14.
//
//   mpirun -np S ./knn_ring_memory ring|gather [classes=30000] [dim=128] [k=32] [rows_per_rank=256]
//
// Rank 0 prints one line: the mode, S, the bytes received by the busiest rank during the
// construction (the build) and during one forward (the selection), the graph bytes held per rank,
// and the largest rise of VmHWM (peak resident memory, /proc/self/status) over the ranks across
// the construction. Run each mode in its own process (VmHWM only grows). Built with
// -DKNN_RING_MEMORY_BASELINE, it runs the gather mode only (against older headers: the baseline).
#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/knn_softmax.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

long long received = 0;  // bytes this rank received from other ranks

/// mpi_communicator, counting what each verb brings from the other ranks.
template <bool Ring>
struct counting {
  xs::mpi_communicator c;
  [[nodiscard]] int rank() const { return c.rank(); }
  [[nodiscard]] int size() const { return c.size(); }
  template <class T>
  void all_reduce(T* data, index_t n, xs::reduce_op op) {
    received += static_cast<long long>(sizeof(T)) * n * (size() - 1);  // as mpi_communicator's sum: a gather
    c.all_reduce(data, n, op);
  }
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    for (int q = 0; q < size(); ++q) received += q == rank() ? 0 : static_cast<long long>(sizeof(T)) * counts[q];
    c.all_gather(send, count, recv, counts);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) {
    received += static_cast<long long>(sizeof(T)) * counts[rank()] * (size() - 1);
    c.reduce_scatter(send, recv, counts);
  }
  template <class T>
  void all_to_all(const T* send, const index_t* sc, T* recv, const index_t* rc) {
    for (int q = 0; q < size(); ++q) received += q == rank() ? 0 : static_cast<long long>(sizeof(T)) * rc[q];
    c.all_to_all(send, sc, recv, rc);
  }
#ifndef KNN_RING_MEMORY_BASELINE
  template <class T, bool R = Ring, class = std::enable_if_t<R>>
  void shift(const T* send, index_t send_count, T* recv, index_t recv_count) {
    if (size() > 1) received += static_cast<long long>(sizeof(T)) * recv_count;
    c.shift(send, send_count, recv, recv_count);
  }
#endif
};

long long vm_hwm_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  return -1;
}

template <bool Ring>
void run(index_t classes, index_t dim, index_t k, index_t rows) {
  using sharding = xs::class_sharding<counting<Ring>>;
#ifndef KNN_RING_MEMORY_BASELINE  // defined to build the gather mode against headers without the ring
  static_assert(xs::detail::has_shift<counting<Ring>, float> == Ring);
#endif
  sharding sh(counting<Ring>{xs::mpi_communicator(MPI_COMM_WORLD)}, classes);
  xs::knn_options o;
  o.graph.k = k;
  o.neighbors_used = k;
  o.rebuild_every = 0;
  std::mt19937 g(7 + static_cast<unsigned>(sh.rank()));
  std::vector<float> h(static_cast<std::size_t>(rows * dim));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : h) x = nd(g);
  std::vector<index_t> t(static_cast<std::size_t>(rows));
  for (auto& x : t) x = static_cast<index_t>(g() % static_cast<unsigned>(classes));
  {  // warm-up: the BLAS's own buffers are allocated before the measurement
    std::vector<float> w(static_cast<std::size_t>(512 * dim));
    for (auto& x : w) x = nd(g);
    (void)xs::build_knn_graph(xs::matrix_view<const float>(w.data(), 512, dim), o.graph);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const long long hwm0 = vm_hwm_kib();
  received = 0;
  const xs::knn_softmax<xs::fp32, xs::serial, sharding> head(sh, dim, o);  // collective: the build
  const long long build_bytes = received, hwm1 = vm_hwm_kib();
  received = 0;
  (void)head.forward(xs::matrix_view<const float>(h.data(), rows, dim), xs::vector_view<const index_t>(t.data(), rows));
  const long long forward_bytes = received;
  const long long graph_bytes = static_cast<long long>(head.graph().ids().size() * sizeof(index_t) +
                                                       head.graph().similarities().size() * sizeof(float));
  long long mine[4] = {build_bytes, forward_bytes, graph_bytes, hwm1 - hwm0}, most[4];
  MPI_Reduce(mine, most, 4, MPI_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  if (sh.rank() == 0)
    std::printf("mode %-6s S=%d N=%lld d=%lld K=%lld B/rank=%lld: build received %.2f MB, forward received %.3f MB, "
                "graph held %.2f MB, VmHWM rise over the build %.1f MB (max over ranks)\n",
                Ring ? "ring" : "gather", sh.size(), static_cast<long long>(classes), static_cast<long long>(dim),
                static_cast<long long>(k), static_cast<long long>(rows), 1e-6 * static_cast<double>(most[0]),
                1e-6 * static_cast<double>(most[1]), 1e-6 * static_cast<double>(most[2]),
                1.024e-3 * static_cast<double>(most[3]));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool ring = argc > 1 && std::strcmp(argv[1], "ring") == 0;
  const index_t classes = argc > 2 ? std::atoll(argv[2]) : 30000;
  const index_t dim = argc > 3 ? std::atoll(argv[3]) : 128;
  const index_t k = argc > 4 ? std::atoll(argv[4]) : 32;
  const index_t rows = argc > 5 ? std::atoll(argv[5]) : 256;
  int status = 0;
  try {
#ifndef KNN_RING_MEMORY_BASELINE
    if (ring) run<true>(classes, dim, k, rows);
    else
#endif
      run<false>(classes, dim, k, rows);
    (void)ring;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "knn_ring_memory: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
