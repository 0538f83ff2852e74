// SPDX-License-Identifier: Apache-2.0
// The sharded hierarchical softmax's subtree step (issue 14, stop 21), timed: a binary Huffman tree
// over `classes` Zipf(1.0) classes cut at `cut_depth` (many subtrees per rank), trained
// data-parallel over MPI ranks. Per round, alternated (the machine is shared):
//
//  * `step`: `steps` blocking `forward_backward` calls of the sharded head (no SGD);
//  * `per_subtree`: on every rank, the rows the routing brings it (every rank's batch is generated
//    on every rank from the same seeds) through one `hierarchical_softmax` call per subtree that
//    received rows, each with its rows copied in and out: the first version's step 4, rebuilt here
//    from the plan's public parts (`plan.subtree(s)`, `local_row_offset`), so that it runs the
//    same on every build;
//  * `full_minus_top`: the same rows through one call of a head over the full (unsharded) tree,
//    less one call of the top tree's head on them: the subtrees' compute without a fixed cost per
//    subtree (an estimate: two calls' fixed costs and the full tree's cache footprint);
//  * `one_row_per_subtree`: `per_subtree` with only the first row of each subtree: the fixed cost
//    per call (plus one row's compute each), times the calls;
//  * `forest` (builds with `hs_shard_plan::local_forest`): the same rows through one call of a
//    head over the rank's subtrees as one forest;
//  * `forest_chunked` (same builds): the rows sorted by subtree, then one forest call per group
//    of whole subtrees of at least `chunk` rows: the sharded head's step 4 since stop 21 (its
//    default `rows_per_call()`, max(1, 8192 / dim), is the default `chunk`);
//  * `step_one_subtree_per_call` (same builds): `step` with `set_rows_per_call(1)`: one forest
//    call per subtree, as many calls as the first version made (each still sorting its rows), so
//    that the two steps are compared in one process, round by round (`paired_step_ratio`: step /
//    step_one_subtree_per_call, median and range over rounds).
//
//   mpirun -np 2 ./sharded_hs_forest [classes=1000000] [dim=128] [rows_per_rank=2048] [cut_depth=10]
//                                    [steps=4] [repeats=5] [chunk=8192/dim]
//
// Rank 0 prints per round and mode the time per step (mean over steps and ranks), then the
// medians over rounds (`summary`). The full head's weights (every row, d floats) are allocated on
// every rank: about 2 N d 4 bytes each.
#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <memory>
#include <random>
#include <utility>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;

namespace {
/// The plan's forest of rank q's subtrees where the build has it (`local_forest`), else nothing.
template <class Plan>
auto local_forest_of(const Plan& p, int q, int) -> std::optional<decltype(p.local_forest(q))> {
  return p.local_forest(q);
}
template <class Plan>
std::optional<typename Plan::tree_type> local_forest_of(const Plan&, int, long) {
  return std::nullopt;
}

/// A sharded head made from `a` scoring one subtree per call (`set_rows_per_call(1)`: as many
/// calls as the first version made) where the build has that setting, else null.
template <class Head, class... A>
auto one_subtree_per_call(int, const A&... a) -> decltype(std::declval<Head&>().set_rows_per_call(1), std::unique_ptr<Head>()) {
  auto h = std::make_unique<Head>(a...);
  h->set_rows_per_call(1);
  return h;
}
template <class Head, class... A>
std::unique_ptr<Head> one_subtree_per_call(long, const A&...) {
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const index_t classes = argc > 1 ? std::atol(argv[1]) : 1000000, dim = argc > 2 ? std::atol(argv[2]) : 128;
  const index_t rows = argc > 3 ? std::atol(argv[3]) : 2048;
  const int cut = argc > 4 ? std::atoi(argv[4]) : 10, steps = argc > 5 ? std::atoi(argv[5]) : 4,
            repeats = argc > 6 ? std::atoi(argv[6]) : 5;
  const index_t chunk = std::max<index_t>(1, argc > 7 ? std::atol(argv[7]) : 8192 / dim);  // the head's default
  using tree_t = xs::runtime_tree<>;
  using head_t = xs::sharded_hierarchical_softmax<xs::mpi_communicator>;
  using hs_t = xs::hierarchical_softmax<tree_t>;
  const xs::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), size = comm.size();
  const auto u = [](auto i) { return static_cast<std::size_t>(i); };

  std::vector<double> freq(u(classes));
  for (index_t c = 0; c < classes; ++c) freq[u(c)] = 1.0 / static_cast<double>(c + 1);
  const tree_t full_tree = tree_t::huffman(freq);
  xs::hs_shard_options o;
  o.cut_depth = cut;
  const head_t::plan_type plan(full_tree, size, o);
  const index_t n_top = static_cast<index_t>(plan.top_rows().size()),
                n_local = static_cast<index_t>(plan.local_rows(rank).size()), n_full = hs_t::weight_rows(full_tree);
  std::mt19937 wg(99 + static_cast<unsigned>(rank));
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> top_w(u(n_top * dim), 0.01f), local_w(u(n_local * dim)), full_w(u(n_full * dim));
  for (auto& x : local_w) x = nd(wg);
  for (auto& x : full_w) x = nd(wg);
  for (index_t r = 0; r < n_top; ++r)
    std::copy(top_w.begin() + r * dim, top_w.begin() + (r + 1) * dim, full_w.begin() + plan.top_rows()[u(r)] * dim);
  for (index_t r = 0; r < n_local; ++r)
    std::copy(local_w.begin() + r * dim, local_w.begin() + (r + 1) * dim,
              full_w.begin() + plan.local_rows(rank)[u(r)] * dim);
  const head_t head(plan, comm, {top_w.data(), n_top, dim}, {local_w.data(), n_local, dim});
  const auto head_per_subtree = one_subtree_per_call<head_t>(0, plan, comm, xs::matrix_view<float>(top_w.data(), n_top, dim),
                                                             xs::matrix_view<float>(local_w.data(), n_local, dim));
  const hs_t full(full_tree, xs::matrix_view<float>(full_w.data(), n_full, dim));
  const hs_t top(plan.top_tree(), xs::matrix_view<float>(top_w.data(), n_top, dim));
  std::vector<hs_t> subs;
  std::vector<index_t> slot(u(plan.num_subtrees()), -1);
  for (index_t s : plan.subtrees_of(rank)) {
    slot[u(s)] = static_cast<index_t>(subs.size());
    subs.emplace_back(plan.subtree(s), xs::matrix_view<float>(local_w.data() + plan.local_row_offset(s) * dim,
                                                              head_t::plan_type::weight_rows(plan.subtree(s)), dim));
  }

  const auto forest_tree = local_forest_of(plan, rank, 0);
  std::optional<hs_t> forest;
  std::vector<index_t> class_offset(u(plan.num_subtrees()), 0);
  index_t forest_classes = 0;
  for (index_t s : plan.subtrees_of(rank)) class_offset[u(s)] = forest_classes, forest_classes += plan.subtree(s).num_classes();
  if (forest_tree) forest.emplace(*forest_tree, xs::matrix_view<float>(local_w.data(), n_local, dim));

  // Every rank's batches (the same seeds everywhere), and the rows each step routes to this rank.
  std::discrete_distribution<index_t> pick(freq.begin(), freq.end());
  std::vector<std::vector<std::vector<float>>> h(u(size), std::vector<std::vector<float>>(u(steps)));
  std::vector<std::vector<std::vector<index_t>>> t(u(size), std::vector<std::vector<index_t>>(u(steps)));
  for (int q = 0; q < size; ++q) {
    std::mt19937 g(7 + static_cast<unsigned>(q));
    for (int s = 0; s < steps; ++s) {
      for (index_t i = 0; i < rows * dim; ++i) h[u(q)][u(s)].push_back(nd(g) * 20.f);
      for (index_t i = 0; i < rows; ++i) t[u(q)][u(s)].push_back(pick(g));
    }
  }
  std::vector<std::vector<float>> mine_h(u(steps));
  std::vector<std::vector<index_t>> mine_sub(u(steps)), mine_local(u(steps)), mine_full(u(steps)), mine_top(u(steps)),
      mine_forest(u(steps));
  index_t received = 0, calls = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<char> used(u(plan.num_subtrees()), 0);
    for (int q = 0; q < size; ++q)
      for (index_t i = 0; i < rows; ++i) {
        const index_t c = t[u(q)][u(s)][u(i)], sub = plan.subtree_of(c);
        if (sub < 0 || plan.owner(sub) != rank) continue;
        mine_h[u(s)].insert(mine_h[u(s)].end(), h[u(q)][u(s)].begin() + i * dim, h[u(q)][u(s)].begin() + (i + 1) * dim);
        mine_sub[u(s)].push_back(sub), mine_local[u(s)].push_back(plan.local_class(c));
        mine_full[u(s)].push_back(c), mine_top[u(s)].push_back(plan.top_class(c));
        mine_forest[u(s)].push_back(class_offset[u(sub)] + plan.local_class(c));
        calls += used[u(sub)] ? 0 : 1, used[u(sub)] = 1, ++received;
      }
  }

  xs::loss_options none;
  none.reduce = xs::reduction::none;
  std::vector<float> grad_h(u(rows * dim));
  head_t::gradient_type grad_top, grad_local;
  // The first version's step 4 on step s's rows: per subtree, its rows copied in, one call, copied out.
  const auto per_subtree = [&](int s, bool first_row_only) {
    const index_t m_all = static_cast<index_t>(mine_sub[u(s)].size());
    std::vector<float> reply(u(m_all * (1 + dim)));
    std::vector<std::vector<index_t>> by_slot(subs.size());
    for (index_t r = 0; r < m_all; ++r) by_slot[u(slot[u(mine_sub[u(s)][u(r)])])].push_back(r);
    for (std::size_t k = 0; k < subs.size(); ++k) {
      const index_t m = first_row_only ? std::min<index_t>(1, static_cast<index_t>(by_slot[k].size()))
                                       : static_cast<index_t>(by_slot[k].size());
      if (m == 0) continue;
      std::vector<float> hh(u(m * dim)), up(u(m), 1.f), out(u(m)), gh(u(m * dim));
      std::vector<index_t> tt(u(m));
      for (index_t j = 0; j < m; ++j) {
        const index_t r = by_slot[k][u(j)];
        std::copy(mine_h[u(s)].begin() + r * dim, mine_h[u(s)].begin() + (r + 1) * dim, hh.begin() + j * dim);
        tt[u(j)] = mine_local[u(s)][u(r)];
      }
      hs_t::gradient_type g;
      subs[k].forward_backward(xs::matrix_view<const float>(hh.data(), m, dim), xs::vector_view<const index_t>(tt.data(), m),
                               xs::matrix_view<float>(gh.data(), m, dim), g, none, xs::vector_view<float>(out.data(), m),
                               xs::vector_view<const float>(up.data(), m));
      for (index_t j = 0; j < m; ++j) {
        const index_t r = by_slot[k][u(j)];
        reply[u(r * (1 + dim))] = out[u(j)];
        std::copy(gh.begin() + j * dim, gh.begin() + (j + 1) * dim, reply.begin() + r * (1 + dim) + 1);
      }
    }
  };
  // One call of `head` over step s's rows with `targets`; the weight gradient's buffers reused
  // from call to call, as the sharded head reuses the caller's `grad_local`.
  hs_t::gradient_type g;
  const auto one_call = [&](const hs_t& hd, int s, const std::vector<index_t>& targets) {
    const index_t m = static_cast<index_t>(targets.size());
    std::vector<float> up(u(m), 1.f), out(u(m)), gh(u(m * dim));
    hd.forward_backward(xs::matrix_view<const float>(mine_h[u(s)].data(), m, dim),
                        xs::vector_view<const index_t>(targets.data(), m), xs::matrix_view<float>(gh.data(), m, dim), g,
                        none, xs::vector_view<float>(out.data(), m), xs::vector_view<const float>(up.data(), m));
  };

  // The forest in calls of at least `chunk` rows each (whole subtrees; rows sorted by subtree).
  std::vector<std::vector<float>> sorted_h(u(steps));
  std::vector<std::vector<index_t>> sorted_t(u(steps)), cuts(u(steps));
  for (int s = 0; s < steps; ++s) {
    std::vector<index_t> order(mine_forest[u(s)].size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<index_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return mine_sub[u(s)][u(a)] < mine_sub[u(s)][u(b)]; });
    cuts[u(s)].push_back(0);
    for (std::size_t p = 0; p < order.size(); ++p) {
      const index_t r = order[p];
      sorted_h[u(s)].insert(sorted_h[u(s)].end(), mine_h[u(s)].begin() + r * dim, mine_h[u(s)].begin() + (r + 1) * dim);
      sorted_t[u(s)].push_back(mine_forest[u(s)][u(r)]);
      const bool last = p + 1 == order.size() || mine_sub[u(s)][u(order[p + 1])] != mine_sub[u(s)][u(r)];
      if (last && (static_cast<index_t>(p + 1) - cuts[u(s)].back() >= chunk || p + 1 == order.size()))
        cuts[u(s)].push_back(static_cast<index_t>(p + 1));
    }
  }
  const auto chunked = [&](int s) {
    for (std::size_t c = 0; c + 1 < cuts[u(s)].size(); ++c) {
      const index_t b = cuts[u(s)][c], m = cuts[u(s)][c + 1] - b;
      std::vector<float> up(u(m), 1.f), out(u(m)), gh(u(m * dim));
      forest->forward_backward(xs::matrix_view<const float>(sorted_h[u(s)].data() + b * dim, m, dim),
                               xs::vector_view<const index_t>(sorted_t[u(s)].data() + b, m),
                               xs::matrix_view<float>(gh.data(), m, dim), g, none, xs::vector_view<float>(out.data(), m),
                               xs::vector_view<const float>(up.data(), m));
    }
  };

  const char* modes[8] = {"step", "per_subtree", "full", "top", "one_row_per_subtree", "forest", "forest_chunked",
                          "step_one_subtree_per_call"};
  std::vector<double> ms[8];
  const int n_modes = forest && head_per_subtree ? 8 : 5;
  for (int round = 0; round < repeats; ++round)
    for (int m = 0; m < n_modes; ++m) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int s = 0; s < steps; ++s) {
        if (m == 0 || m == 7)
          (m == 0 ? head : *head_per_subtree).forward_backward(xs::matrix_view<const float>(h[u(rank)][u(s)].data(), rows, dim),
                                xs::vector_view<const index_t>(t[u(rank)][u(s)].data(), rows),
                                {grad_h.data(), rows, dim}, grad_top, grad_local);
        else if (m == 1 || m == 4) per_subtree(s, m == 4);
        else if (m == 5) one_call(*forest, s, mine_forest[u(s)]);
        else if (m == 6) chunked(s);
        else one_call(m == 2 ? full : top, s, m == 2 ? mine_full[u(s)] : mine_top[u(s)]);
      }
      double mine = MPI_Wtime() - t0, sum = 0;
      MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      ms[m].push_back(sum * 1e3 / (static_cast<double>(size) * steps));
      if (rank == 0) std::printf("round %d mode=%s ms=%.2f\n", round, modes[m], ms[m].back());
    }
  long totals[2] = {static_cast<long>(received), static_cast<long>(calls)}, all[2];
  MPI_Allreduce(totals, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("# %d ranks, %ld classes, dim %ld, %ld rows/rank, cut %d: %d subtrees; per rank and step: %.0f rows "
                "received, %.1f subtrees with rows\n",
                size, static_cast<long>(classes), static_cast<long>(dim), static_cast<long>(rows), cut,
                static_cast<int>(plan.num_subtrees()), static_cast<double>(all[0]) / (size * steps),
                static_cast<double>(all[1]) / (size * steps));
    const double step = median(ms[0]), loop = median(ms[1]), one = median(ms[2]) - median(ms[3]);
    std::printf("summary step_ms=%.2f per_subtree_ms=%.2f full_ms=%.2f top_ms=%.2f full_minus_top_ms=%.2f "
                "overhead_ms=%.2f (%.1f%% of the step) one_row_per_subtree_ms=%.2f (%.1f%% of the step)\n",
                step, loop, median(ms[2]), median(ms[3]), one, loop - one, 100.0 * (loop - one) / step, median(ms[4]),
                100.0 * median(ms[4]) / step);
    if (n_modes == 8)
      std::printf("summary forest_ms=%.2f per_subtree_minus_forest_ms=%.2f (%.1f%% of the step)\n", median(ms[5]),
                  loop - median(ms[5]), 100.0 * (loop - median(ms[5])) / step);
    if (n_modes == 8) {
      std::printf("summary forest_chunked_ms=%.2f (calls of >= %ld rows)\n", median(ms[6]), static_cast<long>(chunk));
      std::vector<double> ratio;  // per round: the step over the step with one subtree per call
      for (int r = 0; r < repeats; ++r) ratio.push_back(ms[0][u(r)] / ms[7][u(r)]);
      std::printf("summary step_one_subtree_per_call_ms=%.2f paired_step_ratio=%.3f (%.3f - %.3f)\n", median(ms[7]),
                  median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()));
    }
  }
  MPI_Finalize();
  return 0;
}
