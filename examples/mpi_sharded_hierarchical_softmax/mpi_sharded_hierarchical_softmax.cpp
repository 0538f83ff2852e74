// SPDX-License-Identifier: Apache-2.0
// A hierarchical softmax sharded over MPI ranks: the top of a Huffman tree replicated, its subtrees
// spread over the ranks by expected work, rows routed to their subtree's owner and back:
//
//   mpirun -np 4 ./build/examples/mpi_sharded_hierarchical_softmax [classes=100000] [dim=64] [rows_per_rank=512] [steps=30]
//
// Every rank builds the same plan (Huffman tree from Zipf class counts, cut at depth 8, hot subtrees
// split), holds the top tree's weights and its own subtrees' weights (initialised from the full-tree
// row ids, so any rank count starts from the same layer), and trains on its own synthetic batch
// (each row its class's centre plus noise, classes drawn Zipf). Rank 0 prints the plan (subtrees,
// replicated rows, expected imbalance), the mean loss over the ranks, the routed-work imbalance of
// each step's global batch, and the top-1 accuracy of the last batch. Built when CMake finds MPI.
//
// Half-way through, the popularity drifts (the Zipf head moves to classes a third of the way along,
// which sit in other subtrees): an `hs_replanner` sees it in the targets, proposes a new plan, the
// rows move to it (`reshard_hs_rows`) and training goes on over the new plan; rank 0 prints the
// re-plan and the imbalance before and after.
#include <xsoftmax/sharding/hs_replanner.hpp>
#include <xsoftmax/sharding/hs_reshard.hpp>
#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

/// A deterministic value in [-1, 1) from an integer (splitmix64): weights and class centres that do
/// not depend on the rank that holds them.
float hashed(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0);
}

/// `rows` (full-tree weight rows) x dim, small values derived from each row's id.
std::vector<float> init_rows(const std::vector<index_t>& rows, index_t dim) {
  std::vector<float> w(rows.size() * static_cast<std::size_t>(dim));
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (index_t j = 0; j < dim; ++j)
      w[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(j)] =
          0.05f * hashed(static_cast<std::uint64_t>(rows[r] * dim + j));
  return w;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const index_t classes = argc > 1 ? std::atoll(argv[1]) : 100000;
  const index_t dim = argc > 2 ? std::atoll(argv[2]) : 64;
  const index_t rows = argc > 3 ? std::atoll(argv[3]) : 512;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 30;
  int status = 0;
  try {
    xs::mpi_communicator comm(MPI_COMM_WORLD);
    const int rank = comm.rank(), ranks = comm.size();
    std::vector<double> zipf(static_cast<std::size_t>(classes));
    for (index_t c = 0; c < classes; ++c) zipf[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
    xs::hs_shard_options options;
    options.cut_depth = 8;
    options.class_frequency = zipf;
    options.split_above = 1.0;
    const xs::runtime_tree<> tree = xs::runtime_tree<>::huffman(zipf);
    xs::hs_shard_plan<> plan(tree, ranks, options);
    std::vector<float> top = init_rows(plan.top_rows(), dim), local = init_rows(plan.local_rows(rank), dim);
    using head_type = xs::sharded_hierarchical_softmax<xs::mpi_communicator, xs::softmax_nodes, xs::fp32, xs::omp>;
    // The head views `top` and `local`; it is rebuilt when a re-plan moves the rows.
    const auto make_head = [&] {
      return std::make_unique<head_type>(
          plan, comm, xs::matrix_view<float>(top.data(), static_cast<index_t>(plan.top_rows().size()), dim),
          xs::matrix_view<float>(local.data(), static_cast<index_t>(plan.local_rows(rank).size()), dim));
    };
    std::unique_ptr<head_type> head = make_head();
    xs::hs_replanner<> replanner(tree, options);
    if (rank == 0)
      std::printf("%lld classes x %lld dims over %d ranks: %lld subtrees, %zu replicated top rows, expected "
                  "imbalance %.3f\n",
                  static_cast<long long>(classes), static_cast<long long>(dim), ranks,
                  static_cast<long long>(plan.num_subtrees()), plan.top_rows().size(), plan.expected_imbalance());

    std::mt19937_64 g(17 + static_cast<unsigned>(rank));
    std::discrete_distribution<index_t> pick(zipf.begin(), zipf.end());
    // After the drift, class c is as popular as class (c - classes / 3) mod classes was.
    std::vector<double> drifted(zipf.size());
    for (index_t c = 0; c < classes; ++c)
      drifted[static_cast<std::size_t>((c + classes / 3) % classes)] = zipf[static_cast<std::size_t>(c)];
    std::discrete_distribution<index_t> pick_drifted(drifted.begin(), drifted.end());
    std::normal_distribution<float> noise(0.f, 0.3f);
    std::vector<float> hidden(static_cast<std::size_t>(rows * dim)), grad_hidden(hidden.size());
    std::vector<index_t> targets(static_cast<std::size_t>(rows)), everyone(static_cast<std::size_t>(rows * ranks));
    head_type::gradient_type grad_top, grad_local;
    for (int s = 0; s < steps; ++s) {
      const bool drift = s >= steps / 2;
      if (rank == 0 && s == steps / 2) std::printf("step %3d  the popularity drifts\n", s);
      for (index_t i = 0; i < rows; ++i) {
        const index_t c = drift ? pick_drifted(g) : pick(g);
        targets[static_cast<std::size_t>(i)] = c;
        for (index_t j = 0; j < dim; ++j)
          hidden[static_cast<std::size_t>(i * dim + j)] = hashed(static_cast<std::uint64_t>(~(c * dim + j))) + noise(g);
      }
      const xs::matrix_view<const float> hv(hidden.data(), rows, dim);
      const xs::vector_view<const index_t> tv(targets.data(), rows);
      float loss = head->forward_backward(hv, tv, xs::matrix_view<float>(grad_hidden.data(), rows, dim), grad_top,
                                          grad_local);
      head->apply_sgd(grad_top, grad_local, 1.f);
      MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      MPI_Allgather(targets.data(), static_cast<int>(rows), MPI_INT64_T, everyone.data(), static_cast<int>(rows),
                    MPI_INT64_T, MPI_COMM_WORLD);
      if (rank == 0 && (s % 5 == 0 || s == steps - 1))
        std::printf("step %3d  mean loss %.4f  routed-work imbalance of the global batch %.3f\n", s, loss / ranks,
                    plan.imbalance(everyone));
      // Re-plan when the recent targets make the plan unbalanced (every rank takes the same decision).
      replanner.observe(tv);
      if (std::optional<xs::hs_shard_plan<>> next = replanner.propose(plan, comm)) {
        std::vector<float> new_top(next->top_rows().size() * static_cast<std::size_t>(dim));
        std::vector<float> new_local(next->local_rows(rank).size() * static_cast<std::size_t>(dim));
        const std::vector<index_t> sent = xs::reshard_rows_sent(plan, *next);
        xs::reshard_hs_rows(plan, *next, comm,
                            xs::matrix_view<const float>(top.data(), static_cast<index_t>(plan.top_rows().size()), dim),
                            xs::matrix_view<const float>(local.data(), static_cast<index_t>(plan.local_rows(rank).size()), dim),
                            xs::matrix_view<float>(new_top.data(), static_cast<index_t>(new_top.size()) / dim, dim),
                            xs::matrix_view<float>(new_local.data(), static_cast<index_t>(new_local.size()) / dim, dim));
        const double after = xs::plan_imbalance(*next, replanner.tracker().global_frequency(comm));  // collective
        if (rank == 0)
          std::printf("step %3d  re-plan: imbalance under the recent targets %.3f -> %.3f, %lld subtrees, rank 0 "
                      "sent %lld rows\n",
                      s, replanner.last_imbalance(), after,
                      static_cast<long long>(next->num_subtrees()), static_cast<long long>(sent[0]));
        plan = std::move(*next);
        top.swap(new_top);
        local.swap(new_local);
        head = make_head();
      }
    }
    // Top-1 accuracy on the last batch (the search is exact and sharded like the training step).
    std::vector<index_t> best(static_cast<std::size_t>(rows));
    std::vector<float> best_lp(best.size());
    head->topk(xs::matrix_view<const float>(hidden.data(), rows, dim), 1, xs::matrix_view<index_t>(best.data(), rows, 1),
              xs::matrix_view<float>(best_lp.data(), rows, 1));
    long long hits = 0;
    for (index_t i = 0; i < rows; ++i) hits += best[static_cast<std::size_t>(i)] == targets[static_cast<std::size_t>(i)];
    MPI_Allreduce(MPI_IN_PLACE, &hits, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("top-1 on the last batch: %.1f %%\n", 100.0 * static_cast<double>(hits) / static_cast<double>(rows * ranks));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
