// SPDX-License-Identifier: Apache-2.0
// The prefetch of the class-sharded hierarchical softmax's routing (issue 14), timed: a sequence of
// micro-batches trained data-parallel over MPI ranks, each step either routing its rows to their
// subtrees' owners inside the verb (`blocking`) or scoring rows whose routing was started one step
// earlier (`prefetch`: `head.route_rows_async(h_next, t_next)` before
// `head.forward_backward(current, ...)`), alternated in one run (the machine is shared), `repeats`
// rounds of `steps` steps each:
//
//   mpirun -np 2 ./sharded_hs_overlap [classes=200000] [dim=512] [rows_per_rank=1024] [cut_depth=6]
//                                     [steps=8] [repeats=7]
//
// Rank 0 prints, per mode and round, per step (mean over steps and ranks): the step time (the
// verb, no SGD: both modes run the same work; the prefetch mode's includes starting the next
// routing); the time blocked in collectives;
// of it, in all-to-alls (row counts, the hidden rows when blocking, classes, upstream gradients,
// the replies) and in the wait for a started routing; then the medians over rounds (`summary`).
#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

/// Seconds blocked in collectives, in all-to-alls, and waiting for a started routing.
struct recorder {
  double blocked = 0, exchanging = 0, waiting = 0;
};

/// mpi_communicator recording the time each collective blocks.
struct timed_communicator {
  xs::mpi_communicator mpi = xs::mpi_communicator(MPI_COMM_WORLD);
  recorder* rec = nullptr;
  [[nodiscard]] int rank() const { return mpi.rank(); }
  [[nodiscard]] int size() const { return mpi.size(); }
  template <class F>
  void timed(bool exchange, F f) {
    const double t0 = MPI_Wtime();
    f();
    const double dt = MPI_Wtime() - t0;
    rec->blocked += dt;
    if (exchange) rec->exchanging += dt;
  }
  template <class T>
  void all_reduce(T* d, index_t n, xs::reduce_op op) {
    timed(false, [&] { mpi.all_reduce(d, n, op); });
  }
  template <class T>
  void all_gather(const T* s, index_t n, T* r, const index_t* c) {
    timed(false, [&] { mpi.all_gather(s, n, r, c); });
  }
  template <class T>
  void all_to_all(const T* s, const index_t* sc, T* r, const index_t* rc) {
    timed(true, [&] { mpi.all_to_all(s, sc, r, rc); });
  }
  /// A started all-to-all; its wait is timed.
  struct request {
    xs::mpi_communicator::gather_request r;
    recorder* rec = nullptr;
    void wait() {
      const double t0 = MPI_Wtime();
      r.wait();
      const double dt = MPI_Wtime() - t0;
      rec->blocked += dt, rec->exchanging += dt, rec->waiting += dt;
    }
  };
  template <class T>
  request start_all_to_all(const T* s, const index_t* sc, T* r, const index_t* rc) {
    return request{mpi.start_all_to_all(s, sc, r, rc), rec};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const index_t classes = argc > 1 ? std::atol(argv[1]) : 200000, dim = argc > 2 ? std::atol(argv[2]) : 512;
  const index_t rows = argc > 3 ? std::atol(argv[3]) : 1024;
  const int cut = argc > 4 ? std::atoi(argv[4]) : 6, steps = argc > 5 ? std::atoi(argv[5]) : 8,
            repeats = argc > 6 ? std::atoi(argv[6]) : 7;
  recorder rec;
  timed_communicator comm;
  comm.rec = &rec;
  const int rank = comm.rank(), size = comm.size();
  using head_t = xs::sharded_hierarchical_softmax<timed_communicator>;

  std::vector<double> freq(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) freq[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
  xs::hs_shard_options o;
  o.cut_depth = cut;
  const head_t::plan_type plan(xs::runtime_tree<>::huffman(freq), size, o);
  const index_t n_top = static_cast<index_t>(plan.top_rows().size()),
                n_local = static_cast<index_t>(plan.local_rows(rank).size());
  std::mt19937 g(7 + static_cast<unsigned>(rank));
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> top_w(static_cast<std::size_t>(n_top * dim)), local_w(static_cast<std::size_t>(n_local * dim));
  for (auto& x : top_w) x = 0.01f;  // replicas equal
  for (auto& x : local_w) x = nd(g);
  const head_t head(plan, comm, {top_w.data(), n_top, dim}, {local_w.data(), n_local, dim});
  std::discrete_distribution<index_t> pick(freq.begin(), freq.end());
  std::vector<std::vector<float>> h(static_cast<std::size_t>(steps));
  std::vector<std::vector<index_t>> t(static_cast<std::size_t>(steps));
  index_t routed = 0;
  for (int s = 0; s < steps; ++s) {
    for (index_t i = 0; i < rows * dim; ++i) h[static_cast<std::size_t>(s)].push_back(nd(g) * 20.f);
    for (index_t i = 0; i < rows; ++i) {
      t[static_cast<std::size_t>(s)].push_back(pick(g));
      routed += plan.subtree_of(t[static_cast<std::size_t>(s)].back()) >= 0 ? 1 : 0;
    }
  }
  std::vector<float> grad_h(static_cast<std::size_t>(rows * dim));
  head_t::gradient_type grad_top, grad_local;
  const auto view = [&](int s) { return xs::matrix_view<const float>(h[static_cast<std::size_t>(s)].data(), rows, dim); };
  const auto targets = [&](int s) { return xs::vector_view<const index_t>(t[static_cast<std::size_t>(s)].data(), rows); };
  const char* modes[2] = {"blocking", "prefetch"};
  std::vector<double> step_ms[2], blocked_ms[2], exchange_ms[2], wait_ms[2];
  for (int round = 0; round < repeats; ++round)
    for (int m = 0; m < 2; ++m) {
      MPI_Barrier(MPI_COMM_WORLD);
      rec = recorder{};
      const double t0 = MPI_Wtime();
      if (m == 0) {
        for (int s = 0; s < steps; ++s)
          head.forward_backward(view(s), targets(s), {grad_h.data(), rows, dim}, grad_top, grad_local);
      } else {
        auto next = head.route_rows_async(view(0), targets(0));
        for (int s = 0; s < steps; ++s) {
          auto current = std::move(next);
          if (s + 1 < steps) next = head.route_rows_async(view(s + 1), targets(s + 1));
          head.forward_backward(current, {grad_h.data(), rows, dim}, grad_top, grad_local);
        }
      }
      const double mine[4] = {MPI_Wtime() - t0, rec.blocked, rec.exchanging, rec.waiting};
      double sum[4];
      MPI_Allreduce(mine, sum, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      const double per = 1e3 / (static_cast<double>(size) * steps);
      step_ms[m].push_back(sum[0] * per), blocked_ms[m].push_back(sum[1] * per);
      exchange_ms[m].push_back(sum[2] * per), wait_ms[m].push_back(sum[3] * per);
      if (rank == 0)
        std::printf("round %d mode=%s step_ms=%.2f blocked_ms=%.2f all_to_all_ms=%.2f routing_wait_ms=%.3f\n", round,
                    modes[m], step_ms[m].back(), blocked_ms[m].back(), exchange_ms[m].back(), wait_ms[m].back());
    }
  if (rank == 0) {
    std::printf("# %d ranks, %ld classes, dim %ld, %ld rows/rank, cut %d: %d subtrees, %.1f%% of rows routed "
                "(%.2f MB of hidden rows per rank and step)\n",
                size, static_cast<long>(classes), static_cast<long>(dim), static_cast<long>(rows), cut,
                static_cast<int>(plan.num_subtrees()), 100.0 * static_cast<double>(routed) / (rows * steps),
                static_cast<double>(routed) / steps * static_cast<double>(dim) * 4e-6);
    for (int m = 0; m < 2; ++m)
      std::printf("summary mode=%s step_ms=%.2f blocked_ms=%.2f all_to_all_ms=%.2f routing_wait_ms=%.3f\n", modes[m],
                  median(step_ms[m]), median(blocked_ms[m]), median(exchange_ms[m]), median(wait_ms[m]));
  }
  MPI_Finalize();
  return 0;
}
