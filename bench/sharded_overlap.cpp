// SPDX-License-Identifier: Apache-2.0
// The prefetch of a class-sharded full softmax's rows (issue 14), timed: a sequence of micro-batches
// trained data-parallel over MPI ranks, each step either gathering its rows inside the verb
// (`blocking`) or scoring rows whose gather was started one step earlier (`prefetch`:
// `head.gather_rows_async(h_next)` before `head.forward_backward(current, ...)`), alternated in one
// run (the machine is shared), `repeats` rounds of `steps` steps each:
//
//   mpirun -np 2 ./build/bench/sharded_overlap [classes=64] [dim=2048] [rows_per_rank=256] [steps=12]
//                                              [repeats=5] [progress_us=0] [trace.json]
//
// progress_us > 0 adds a third mode, `prefetch+poll`: a thread per pending gather calls MPI_Test
// every progress_us microseconds (OpenMPI's non-blocking collectives advance only inside MPI
// calls; needs MPI_THREAD_MULTIPLE).
// Rank 0 prints, per mode and round, per step (mean over steps and ranks): the step time; the time
// blocked in collectives, and of it in gathers (every all_gather: the rows', the counts', the
// targets' and the upstream gradients'; and the wait for a prefetched gather); the time a
// prefetched gather was in flight (start to completion seen by the poller, or to the wait's
// return without one); then the medians over rounds (`summary ...` lines for bench/RESULTS.md). With a trace
// path, the last round of each mode is written as a Chrome trace (chrome://tracing, Perfetto):
// per rank, the verb and SGD on one track, the blocking collectives and the gathers on another.
#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/full_softmax.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {

/// Intervals of one rank: (track, name id, start, end) in seconds since a common origin.
struct recorder {
  enum name { verb, sgd, all_reduce, all_gather, reduce_scatter, gather_wait, gather_in_flight, names };
  std::vector<double> events;  // 4 per event
  double origin = 0, blocked = 0, gathering = 0, in_flight = 0;
  bool keep = false;
  [[nodiscard]] double now() const { return MPI_Wtime() - origin; }
  void add(name n, double t0, double t1) {
    if (n >= all_reduce && n <= gather_wait) blocked += t1 - t0;
    if (n == all_gather || n == gather_wait) gathering += t1 - t0;
    if (n == gather_in_flight) in_flight += t1 - t0;
    if (keep) events.insert(events.end(), {n <= sgd ? 0.0 : 1.0, static_cast<double>(n), t0, t1});
  }
};

/// mpi_communicator recording the time each collective blocks, and the life of each started gather.
struct traced_communicator {
  xs::mpi_communicator mpi = xs::mpi_communicator(MPI_COMM_WORLD);
  recorder* rec = nullptr;
  int progress_us = 0;

  [[nodiscard]] int rank() const { return mpi.rank(); }
  [[nodiscard]] int size() const { return mpi.size(); }
  struct scope {
    recorder* rec;
    recorder::name n;
    double t0 = rec->now();
    ~scope() { rec->add(n, t0, rec->now()); }
  };
  template <class T>
  void all_reduce(T* d, index_t n, xs::reduce_op op) {
    const scope s{rec, recorder::all_reduce};
    mpi.all_reduce(d, n, op);
  }
  template <class T>
  void all_gather(const T* s, index_t n, T* r, const index_t* c) {
    const scope t{rec, recorder::all_gather};
    mpi.all_gather(s, n, r, c);
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, const index_t* c) {
    const scope t{rec, recorder::reduce_scatter};
    mpi.reduce_scatter(s, r, c);
  }

  /// A started gather; with progress_us > 0 a thread polls it (MPI_Test) until done or waited for.
  struct gather_request {
    struct state {
      xs::mpi_communicator::gather_request r;
      recorder* rec;
      double started, completed = -1;
      std::atomic<bool> stop{false};
      std::thread poller;
    };
    std::unique_ptr<state> s;
    void wait() {
      if (!s) return;
      const double t0 = s->rec->now();
      if (s->poller.joinable()) s->stop = true, s->poller.join();
      s->r.wait();
      const double t1 = s->rec->now();
      s->rec->add(recorder::gather_wait, t0, t1);
      s->rec->add(recorder::gather_in_flight, s->started, s->completed >= 0 ? s->completed : t1);
      s.reset();
    }
    ~gather_request() { wait(); }
    gather_request(std::unique_ptr<state> st) : s(std::move(st)) {}
    gather_request(gather_request&&) = default;
  };
  template <class T>
  gather_request start_all_gather(const T* send, index_t n, T* recv, const index_t* counts) {
    auto st = std::make_unique<gather_request::state>();
    st->rec = rec;
    st->started = rec->now();
    st->r = mpi.start_all_gather(send, n, recv, counts);
    if (progress_us > 0) {
      gather_request::state* p = st.get();
      const int us = progress_us;
      p->poller = std::thread([p, us] {
        while (!p->stop) {
          if (p->r.test()) {
            p->completed = p->rec->now();
            return;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
      });
    }
    return gather_request(std::move(st));
  }
};

using sharding = xs::class_sharding<traced_communicator>;
using head_t = xs::full_softmax<xs::fp32, xs::serial, sharding>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const index_t classes = argc > 1 ? std::atol(argv[1]) : 64, dim = argc > 2 ? std::atol(argv[2]) : 2048;
  const index_t rows = argc > 3 ? std::atol(argv[3]) : 256;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 12, repeats = argc > 5 ? std::atoi(argv[5]) : 5;
  const int progress_us = argc > 6 ? std::atoi(argv[6]) : 0;
  const std::string trace = argc > 7 ? argv[7] : "";
  recorder rec;
  traced_communicator comm;
  comm.rec = &rec;
  const int rank = comm.rank(), size = comm.size();
  if (progress_us > 0 && provided < MPI_THREAD_MULTIPLE) {
    if (rank == 0) std::fprintf(stderr, "progress_us > 0 needs MPI_THREAD_MULTIPLE (provided: %d)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  head_t head(sharding(comm, classes), dim, false, {});
  // A few distinct micro-batches per rank, cycled.
  constexpr int distinct = 4;
  std::vector<std::vector<float>> h(distinct);
  std::vector<std::vector<index_t>> t(distinct);
  std::mt19937 g(11 + static_cast<unsigned>(rank));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int b = 0; b < distinct; ++b) {
    for (index_t i = 0; i < rows * dim; ++i) h[b].push_back(nd(g));
    for (index_t i = 0; i < rows; ++i) t[b].push_back(static_cast<index_t>(g() % classes));
  }
  auto hv = [&](int s) { return xs::matrix_view<const float>(h[s % distinct].data(), rows, dim); };
  auto tv = [&](int s) { return xs::vector_view<const index_t>(t[s % distinct].data(), rows); };
  std::vector<float> gh(static_cast<std::size_t>(rows * dim));
  head_t::gradient_type gw;
  const xs::matrix_view<float> ghv(gh.data(), rows, dim);
  if (rank == 0)
    std::printf("ranks=%d classes=%ld dim=%ld rows_per_rank=%ld steps=%d repeats=%d progress_us=%d "
                "gather_mb_per_rank=%.2f\n",
                size, static_cast<long>(classes), static_cast<long>(dim), static_cast<long>(rows), steps, repeats,
                progress_us, static_cast<double>(rows * dim * 4 * (size - 1)) / 1e6);

  // Does OpenMPI move a started gather while no MPI call runs? Start one of the bench's size, spin
  // (no MPI call) for 200 ms, then ask once; then poll every 100 us until it completes. For scale,
  // first the same gather blocking (median of 5, max over ranks).
  {
    std::vector<float> send(h[0]), recv(static_cast<std::size_t>(rows * dim * size));
    const std::vector<index_t> counts(static_cast<std::size_t>(size), rows * dim);
    std::vector<double> blocking;
    for (int i = 0; i < 5; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double b0 = MPI_Wtime();
      comm.mpi.all_gather(send.data(), rows * dim, recv.data(), counts.data());
      blocking.push_back(1e3 * (MPI_Wtime() - b0));
    }
    double blocking_ms = median(blocking), blocking_most = 0;
    MPI_Reduce(&blocking_ms, &blocking_most, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) std::printf("probe: the gather blocking takes %.2f ms (median of 5, slowest rank)\n", blocking_most);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    auto r = comm.mpi.start_all_gather(send.data(), rows * dim, recv.data(), counts.data());
    while (MPI_Wtime() - t0 < 0.2) {
    }
    const double spun = MPI_Wtime();
    const int done_after_spin = r.test() ? 1 : 0;
    const double t1 = MPI_Wtime();
    while (!r.test()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    const double t2 = MPI_Wtime();
    int all_done = 0;
    MPI_Reduce(&done_after_spin, &all_done, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    double first_test_ms = 1e3 * (t1 - spun), most = 0;
    MPI_Reduce(&first_test_ms, &most, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("probe: after 200 ms without MPI calls, the first MPI_Test (%.2f ms on rank 0, at most %.2f ms) "
                  "finds the gather complete on %d of %d ranks; %.2f ms more of MPI_Test every 100 us complete it "
                  "(rank 0)\n",
                  first_test_ms, most, all_done, size, 1e3 * (t2 - t1));
  }

  // Modes, alternated within each round: blocking, prefetch, and (progress_us > 0) prefetch with
  // the poller.
  const char* modes[3] = {"blocking", "prefetch", "prefetch+poll"};
  const int n_modes = progress_us > 0 ? 3 : 2;
  std::vector<double> step_ms[3], blocked_ms[3], gather_ms[3], flight_ms[3];
  std::vector<double> kept[3];
  for (int round = -1; round < repeats; ++round) {  // round -1: warm-up, not reported
    for (int m = 0; m < n_modes; ++m) {
      head.sharding().communicator().progress_us = m == 2 ? progress_us : 0;
      MPI_Barrier(MPI_COMM_WORLD);
      rec.origin = MPI_Wtime(), rec.blocked = 0, rec.gathering = 0, rec.in_flight = 0, rec.events.clear();
      rec.keep = round == repeats - 1 && !trace.empty();
      const double t0 = rec.now();
      float loss = 0;
      if (m == 0) {
        for (int s = 0; s < steps; ++s) {
          const double a = rec.now();
          loss = head.forward_backward(hv(s), tv(s), ghv, gw);
          const double b = rec.now();
          head.apply_sgd(gw, 0.01f);
          rec.add(recorder::verb, a, b), rec.add(recorder::sgd, b, rec.now());
        }
      } else {
        head_t::gathered_batch next = head.gather_rows_async(hv(0));
        for (int s = 0; s < steps; ++s) {
          head_t::gathered_batch current = std::move(next);
          if (s + 1 < steps) next = head.gather_rows_async(hv(s + 1));
          const double a = rec.now();
          loss = head.forward_backward(current, tv(s), ghv, gw);
          const double b = rec.now();
          head.apply_sgd(gw, 0.01f);
          rec.add(recorder::verb, a, b), rec.add(recorder::sgd, b, rec.now());
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double total = rec.now() - t0;
      // Every rank's time blocked and in flight: report the mean over ranks.
      double mine[3] = {rec.blocked, rec.gathering, rec.in_flight}, sum[3] = {0, 0, 0};
      MPI_Allreduce(mine, sum, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      if (round >= 0) {
        step_ms[m].push_back(1e3 * total / steps);
        blocked_ms[m].push_back(1e3 * sum[0] / size / steps);
        gather_ms[m].push_back(1e3 * sum[1] / size / steps);
        flight_ms[m].push_back(1e3 * sum[2] / size / steps);
        if (rank == 0)
          std::printf("round %d %-8s step_ms=%.2f blocked_in_collectives_ms=%.2f of_which_gathers_ms=%.2f "
                      "gather_in_flight_ms=%.2f loss=%.4f\n",
                      round, modes[m], step_ms[m].back(), blocked_ms[m].back(), gather_ms[m].back(),
                      flight_ms[m].back(), loss);
      }
      if (rec.keep) kept[m] = rec.events;
    }
  }
  for (int m = 0; m < n_modes; ++m)
    if (rank == 0)
      std::printf("summary mode=%s ranks=%d classes=%ld dim=%ld rows_per_rank=%ld poll_us=%d step_ms=%.2f "
                  "blocked_in_collectives_ms=%.2f of_which_gathers_ms=%.2f gather_in_flight_ms=%.2f "
                  "(medians of %d rounds)\n",
                  modes[m], size, static_cast<long>(classes), static_cast<long>(dim), static_cast<long>(rows),
                  m == 2 ? progress_us : 0, median(step_ms[m]), median(blocked_ms[m]), median(gather_ms[m]),
                  median(flight_ms[m]), repeats);

  if (!trace.empty()) {  // every rank's events to rank 0, one Chrome trace
    static const char* names[recorder::names] = {"forward_backward", "apply_sgd",       "all_reduce",
                                                 "all_gather",       "reduce_scatter",  "wait for gather",
                                                 "gather in flight"};
    std::FILE* f = rank == 0 ? std::fopen(trace.c_str(), "w") : nullptr;
    if (f) std::fprintf(f, "{\"traceEvents\":[\n");
    bool first = true;
    for (int m = 0; m < n_modes; ++m) {
      int n = static_cast<int>(kept[m].size());
      std::vector<int> counts(static_cast<std::size_t>(size)), offsets(counts.size());
      MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
      int all = 0;
      for (int q = 0; q < size; ++q) {
        const auto qs = static_cast<std::size_t>(q);
        offsets[qs] = all, all += counts[qs];
      }
      std::vector<double> every(static_cast<std::size_t>(rank == 0 ? all : 0));
      MPI_Gatherv(kept[m].data(), n, MPI_DOUBLE, every.data(), counts.data(), offsets.data(), MPI_DOUBLE, 0,
                  MPI_COMM_WORLD);
      if (!f) continue;
      for (int q = 0; q < size; ++q) {
        const auto qs = static_cast<std::size_t>(q);
        for (int e = offsets[qs]; e < offsets[qs] + counts[qs]; e += 4) {
          const double* v = &every[static_cast<std::size_t>(e)];
          std::fprintf(f,
                       "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":\"%s rank %d\",\"tid\":\"%s\",\"ts\":%.1f,"
                       "\"dur\":%.1f}",
                       first ? "" : ",\n", names[static_cast<int>(v[1])], modes[m], q,
                       v[0] == 0 ? "compute" : "communication", 1e6 * v[2], 1e6 * (v[3] - v[2]));
          first = false;
        }
      }
    }
    if (f) std::fprintf(f, "\n]}\n"), std::fclose(f);
  }
  MPI_Finalize();
  return 0;
}
