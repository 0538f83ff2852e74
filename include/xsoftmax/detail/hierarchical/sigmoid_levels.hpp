// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Every level of a sigmoid-node (binary, word2vec-form) hierarchical-softmax step in two parallel
/// passes, whatever the tree's depth, on every backend without a tuned gather path (the host ones;
/// the cuda backend's warp-per-sample path is checked against it).
///
/// A (row, level) pair of the step is an *entry*, e = (level - level0) rows + row, level-major as
/// the planning pass lays out each row's node (`node_key`: its block_begin, negative once the row's
/// path has ended) and child. The passes:
///  1. every pair of every level: its score, loss and dLoss/dscore * upstream, into per-entry
///     arrays (no two tasks share an entry); runs shorter than `run_parallel_inside` are grouped
///     into tasks of about `sigmoid_task_pairs` pairs, each also summing its runs' node-gradient
///     rows (a run's entries are all in its task); longer runs are cut into slices of rows;
///  2. per row, its levels in order: the loss terms, and the hidden-gradient rows gs_e * w_node;
///     beside them, the long runs' node-gradient rows by column blocks (`sigmoid_column_block`).
/// Level by level this was one to three parallel regions per level (17 levels and 58 regions a
/// step at 50K classes, where starting regions cost more than a second thread gained; bench/
/// RESULTS.md, issue 30). Every value is summed in the order the level-by-level step used (each
/// row's terms by level, each node's by sample), so the results are bitwise that step's, and the
/// same for every thread count and task size.
///
/// On the serial backend (and omp with one thread) the tasks run one at a time in plan order, so
/// pass 1 does it all: no run is sliced, and each pair's loss and hidden-gradient row are added
/// while its node row is in cache (`sigmoid_pair_pass::in_order`) -- the same sums in the same
/// order, with each node row read once.

#include <xsoftmax/detail/hierarchical/gather_runs.hpp>
#include <xsoftmax/detail/hierarchical/node_runs.hpp>

#include <limits>
#include <vector>

namespace xsoftmax::detail {

/// Where a step's entries are: level `level0 + l`'s row r is entry l rows + r, for l < levels.
struct level_entries {
  index_t rows = 0;
  int level0 = 0;
  int levels = 0;
  const index_t* node_key = nullptr;  ///< per entry: the row's node's block_begin; < 0: path ended above
  /// The hidden gradients hold no values yet (not even zeros): each row's first level (level0)
  /// writes its term, deeper levels add theirs. Every row's path has a level0 entry when level0 = 0.
  bool grad_h_unset = false;
  [[nodiscard]] XSOFTMAX_HD index_t entry(int level, index_t row) const { return (level - level0) * rows + row; }
  [[nodiscard]] index_t count() const { return rows * levels; }
};

/// y = g x (first: the row's first term, into a row holding no values yet) or y += g x.
template <class T>
XSOFTMAX_HD inline void put_row_term(bool first, float g, const T* x, float* y, index_t d) {
  if (first)
    scale_row(g, x, y, d);
  else
    axpy_row(g, x, y, d);
}

/// Scratch floats `sigmoid_levels_generic` needs in `node_run_data::scratch`: a loss per entry and,
/// with gradients, a dLoss/dscore * upstream per entry.
inline index_t sigmoid_levels_scratch(const level_entries& at, bool backward) {
  return at.count() * (backward ? 2 : 1);
}

/// Pairs a pass-1 task of a host backend scores (about 25 K multiply-adds at d = 100: enough that a
/// task dwarfs its dispatch, small enough to balance two to sixteen threads).
inline constexpr index_t sigmoid_task_pairs = 256;

/// Pass-1 work: runs [run_begin, run_end) whole (row_end == 0), or rows [row_begin, row_end) of the
/// long run run_begin (scores only: its node-gradient row is pass 2's).
struct sigmoid_task {
  index_t run_begin = 0, run_end = 0, row_begin = 0, row_end = 0;
};

/// Pass 1, task t: the scores, losses and dLoss/dscore of its pairs, G at a time (their dot products
/// first, then their losses side by side: `sigmoid_node_losses`), then its whole runs' node rows.
template <class T, index_t G>
struct sigmoid_pair_pass {
  node_run_data<T> a;  // child: per entry
  level_entries at;
  const node_run* runs;
  const sigmoid_task* tasks;
  float* pair_loss;  ///< per entry
  float* gs;         ///< per entry; null without gradients
  /// The tasks run one at a time in plan order (`runs_tasks_in_order`): each pair's loss and hidden-
  /// gradient row are added to its row here, while the node row is in cache, in level order as
  /// pass 2 would add them (bitwise its values); pass 2 then has only the long runs' node rows.
  /// Pass 2 read every node row a second time, most of them from beyond L2 (a binary-Huffman step
  /// at 50K classes, d = 100, in callgrind's cache model with a 1 MiB L2: 1.7 of its 8.7 MB of L2
  /// read misses; bench/RESULTS.md, issue 30).
  bool in_order;

  /// Up to G pairs scored together: filled, then their dot products, their losses, their effects.
  struct group {
    index_t row[G] = {}, entry[G] = {};
    const T* wr[G] = {};
    float bias[G] = {}, sc[G] = {}, first[G] = {}, loss[G] = {}, ds[G] = {};
    index_t m = 0;
  };

  XSOFTMAX_HD void dots(group& q) const {
    for (index_t j = 0; j < q.m; ++j) {
      const float dot = dot_row8(a.h + q.row[j] * a.dim, q.wr[j], a.dim);
      q.sc[j] = a.bias ? dot + q.bias[j] : dot;
      q.first[j] = a.child[q.entry[j]] == 0 ? 1.f : 0.f;
    }
  }

  XSOFTMAX_HD void losses(group& q) const { sigmoid_node_losses<G>(q.sc, q.first, q.loss, q.ds); }

  XSOFTMAX_HD void effects(const group& q) const {
    for (index_t j = 0; j < q.m; ++j) {
      const float g = gs ? q.ds[j] * a.upstream[q.row[j]] : 0.f;
      if (gs) gs[q.entry[j]] = g;  // the node rows' sums read it
      if (!in_order) {  // pass 2 adds the losses and hidden gradients
        pair_loss[q.entry[j]] = q.loss[j];
        continue;
      }
      a.loss[q.row[j]] += q.loss[j];
      if (gs)  // entry < rows: the row's first level
        put_row_term(at.grad_h_unset && q.entry[j] < at.rows, g, q.wr[j], a.grad_h + q.row[j] * a.dim, a.dim);
    }
  }

  XSOFTMAX_HD void operator()(index_t t) const {
    const sigmoid_task task = tasks[t];
    const bool slice = task.row_end > task.row_begin;
    // Two groups in flight: a full group's losses (a ~50-cycle chain of exp and log1p) are started
    // before the next group's dot products and its effects (which wait on them) come after, so the
    // core runs the chain beside the dots; scored one group at a time the chain sat between its
    // dots and its effects (7.5 % of a serial binary-Huffman step, bench/RESULTS.md, issue 30).
    // Each group's effects still come in group order: the same values, bitwise.
    group q[2];
    int filling = 0;
    bool pending = false;  // q[1 - filling] holds a group whose losses and effects are still to do
    const auto flush = [&] {
      group& next = q[filling];
      group& prev = q[1 - filling];
      if (pending) losses(prev);
      dots(next);
      if (pending) effects(prev);
      pending = true;
      filling = 1 - filling;
      q[filling].m = 0;
    };
    for (index_t k = task.run_begin; k < task.run_end; ++k) {
      const node_run run = runs[k];
      const index_t node = run.block_begin / 2, r1 = slice ? task.row_end : run.end;
      for (index_t r = slice ? task.row_begin : run.begin; r < r1; ++r) {
        group& f = q[filling];
        f.row[f.m] = r;
        f.entry[f.m] = at.entry(run.level, r);
        f.wr[f.m] = a.w.row(node);
        f.bias[f.m] = a.bias ? to_float(a.bias[node]) : 0.f;
        if (++f.m == G) flush();
      }
    }
    if (q[filling].m > 0) flush();
    if (pending) {
      losses(q[1 - filling]);
      effects(q[1 - filling]);
    }
    if (!gs || slice) return;
    const index_t d = a.dim;
    for (index_t k = task.run_begin; k < task.run_end; ++k) {  // each node's row, its samples in order
      const node_run run = runs[k];
      const float* g = gs + at.entry(run.level, run.begin);
      float* gwr = a.grad_w + run.grad_offset * d;
      float bias_acc = 0.f;
      for (index_t i = 0; i < run.end - run.begin; ++i) {
        const float* h = a.h + (run.begin + i) * d;
        if (i == 0)  // the row starts as the first sample's term (no zeroing pass)
          scale_row(g[i], h, gwr, d);
        else
          axpy_row(g[i], h, gwr, d);
        bias_acc += g[i];
      }
      if (a.grad_b) a.grad_b[run.grad_offset] = bias_acc;
    }
  }
};

/// Pass 2, task t: for t < row_tasks, rows [R t, R t + R): loss[r] += its entries' losses and
/// grad_h[r] += gs_e w_node, level by level; then `sigmoid_column_block`s of the long runs.
template <class T>
struct sigmoid_row_pass {
  node_run_data<T> a;
  level_entries at;
  const float* pair_loss;
  const float* gs;         ///< null without gradients
  const node_run* long_runs;
  index_t rows_per_task, row_tasks, column_blocks;  ///< column_blocks: per long run

  XSOFTMAX_HD void operator()(index_t t) const {
    const index_t d = a.dim;
    if (t < row_tasks) {
      const index_t r0 = t * rows_per_task, r1 = r0 + rows_per_task < at.rows ? r0 + rows_per_task : at.rows;
      for (index_t r = r0; r < r1; ++r) {
        float loss = a.loss[r];
        for (int l = at.level0; l < at.level0 + at.levels; ++l) {
          const index_t e = at.entry(l, r), key = at.node_key[e];
          if (key < 0) break;  // the path ended above: no deeper level either
          loss += pair_loss[e];
          if (gs) put_row_term(at.grad_h_unset && l == at.level0, gs[e], a.w.row(key / 2), a.grad_h + r * d, d);
        }
        a.loss[r] = loss;
      }
      return;
    }
    const index_t b = t - row_tasks;
    const node_run run = long_runs[b / column_blocks];
    sigmoid_column_block{a.h + run.begin * d, gs + at.entry(run.level, run.begin), run.end - run.begin, d,
                         a.grad_w + run.grad_offset * d, a.grad_b ? a.grad_b + run.grad_offset : nullptr}(
        b % column_blocks);
  }
};

/// The pass-1 tasks over `runs` (in plan order): short runs grouped up to `pairs` pairs, long runs
/// (`long_from` or more rows) cut into slices of `pairs` rows, listed in `long_runs`.
inline std::vector<sigmoid_task> sigmoid_tasks(const std::vector<node_run>& runs, index_t pairs,
                                               std::vector<node_run>& long_runs,
                                               index_t long_from = run_parallel_inside) {
  std::vector<sigmoid_task> tasks;
  sigmoid_task open{0, 0, 0, 0};
  index_t open_pairs = 0;
  const auto close = [&] {
    if (open.run_end > open.run_begin) tasks.push_back(open);
    open_pairs = 0;
  };
  for (index_t k = 0; k < static_cast<index_t>(runs.size()); ++k) {
    const node_run& run = runs[static_cast<std::size_t>(k)];
    const index_t len = run.end - run.begin;
    if (len >= long_from) {
      close();
      long_runs.push_back(run);
      for (index_t r = run.begin; r < run.end; r += pairs)
        tasks.push_back(sigmoid_task{k, k + 1, r, r + pairs < run.end ? r + pairs : run.end});
      open = sigmoid_task{k + 1, k + 1, 0, 0};
      continue;
    }
    if (open.run_end == open.run_begin) open = sigmoid_task{k, k, 0, 0};
    open.run_end = k + 1;
    open_pairs += len;
    if (open_pairs >= pairs) {
      close();
      open = sigmoid_task{k + 1, k + 1, 0, 0};
    }
  }
  close();
  return tasks;
}

/// Every level's sigmoid `runs` (any levels within `at`, in plan order; one level's runs cover its
/// rows whose key is not negative) in two parallel passes (see the file comment). `a.child` is per
/// entry, `a.scratch` holds `sigmoid_levels_scratch(at, a.backward())` floats; losses and hidden
/// gradients are added to `a.loss` / `a.grad_h`, each run's gradient rows written at its offset.
template <class B, class T>
void sigmoid_levels_generic(const execution<B>& ex, const node_run_data<T>& a, const std::vector<node_run>& runs,
                            const level_entries& at) {
  if (runs.empty() || at.rows == 0) return;
  constexpr bool host = is_host_backend<B>;
  constexpr index_t G = host ? sigmoid_group : 1;
  // One task at a time in plan order (see `sigmoid_pair_pass::in_order`): no run is long, each
  // node row is summed in pass 1 with the row kernels (the column blocks are for sharing a long
  // run's row among threads).
  const bool in_order = runs_tasks_in_order(ex);
  std::vector<node_run> long_runs;
  const std::vector<sigmoid_task> tasks =
      sigmoid_tasks(runs, host ? sigmoid_task_pairs : 1, long_runs,
                    in_order ? std::numeric_limits<index_t>::max() : run_parallel_inside);
  float* pair_loss = a.scratch;
  float* gs = a.backward() ? a.scratch + at.count() : nullptr;
  // A host backend reads the lists where they are; a device gets copies.
  backend_vector<B, node_run> device_runs(host ? 0 : runs.size()), device_long(host ? 0 : long_runs.size());
  backend_vector<B, sigmoid_task> device_tasks(host ? 0 : tasks.size());
  const node_run* run_list = runs.data();
  const node_run* long_list = long_runs.data();
  const sigmoid_task* task_list = tasks.data();
  if constexpr (!host) {
    using ops = typename execution<B>::ops;
    ops::copy(ex.res, raw(device_runs), runs.data(), static_cast<index_t>(runs.size()));
    ops::copy(ex.res, raw(device_tasks), tasks.data(), static_cast<index_t>(tasks.size()));
    if (!long_runs.empty()) ops::copy(ex.res, raw(device_long), long_runs.data(), static_cast<index_t>(long_runs.size()));
    run_list = raw(device_runs);
    long_list = raw(device_long);
    task_list = raw(device_tasks);
  }
  parallel_for_uneven(ex, static_cast<index_t>(tasks.size()),
                      sigmoid_pair_pass<T, G>{a, at, run_list, task_list, pair_loss, gs, in_order});
  const index_t rows_per_task = host ? 16 : 1, row_tasks = in_order ? 0 : (at.rows + rows_per_task - 1) / rows_per_task;
  const index_t blocks = (a.dim + sigmoid_column_block::width - 1) / sigmoid_column_block::width;
  const index_t column_tasks = gs ? static_cast<index_t>(long_runs.size()) * blocks : 0;
  parallel_for_uneven(ex, row_tasks + column_tasks,
                      sigmoid_row_pass<T>{a, at, pair_loss, gs, long_list, rows_per_task, row_tasks, blocks});
}

}  // namespace xsoftmax::detail
