// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Every level of a sigmoid-node (binary, word2vec-form) hierarchical-softmax step in one parallel
/// pass on a host backend and two on a device, whatever the tree's depth, on every backend without a
/// tuned gather path (the host ones; the cuda backend's warp-per-sample path is checked against it).
///
/// A (row, level) pair of the step is an *entry*, e = (level - level0) rows + row, level-major as
/// the planning pass lays out each row's node (`node_key`: its block_begin, negative once the row's
/// path has ended) and child. The passes, on a host backend:
///  1. a task per range of consecutive rows (about equal pair counts; one range per thread, one in
///     all on the serial backend or one thread): its hidden rows copied in, every level's runs
///     clipped to its rows, in level order -- each pair's score, loss and dLoss/dscore * upstream,
///     its loss and hidden-gradient row added to its row while the node row is in cache, then the
///     node-gradient rows of the runs that lie inside the range -- and its hidden-gradient rows out;
///  2. (no pass of its own) the node-gradient rows of the runs that cross a range bound, summed in
///     parts by the ranges they span, in row order, each range's part once the ranges before it have
///     summed theirs (`crossing_parts`).
/// On a device, pass 1 is a task per pair (the run list's pieces) into per-entry arrays, and pass 2
/// a task per row (its levels in order: loss terms and hidden-gradient rows gs_e * w_node) beside
/// the long runs' node rows by column blocks.
/// Level by level this was one to three parallel regions per level (17 levels and 58 regions a
/// step at 50K classes, where starting regions cost more than a second thread gained; bench/
/// RESULTS.md, issue 30). Every value is summed in the order the level-by-level step used (each
/// row's terms by level, each node's by sample), so the results are bitwise that step's, and the
/// same for every thread count and range count.

#include <xsoftmax/detail/hierarchical/gather_runs.hpp>
#include <xsoftmax/detail/hierarchical/node_runs.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <type_traits>
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
  /// `node_key` holds the rows the paths take (`path_rows`: block_begin + child; the planning's
  /// one-value layout), so the child is its low bit and `node_run_data::child` is not read.
  bool keys_are_path_rows = false;
  /// Per row, when not null (host): the levels its path has among the planned ones -- with level0 = 0
  /// its pair count (`plan_runs`' `path_levels`).
  const index_t* path_levels = nullptr;
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

/// Pairs a row-range task scores before it sums the node rows of the runs among them that are
/// complete (about 25 K multiply-adds at d = 100: the hidden rows and dLoss/dscore values they read
/// are still in L1 or L2; a range's node rows all summed at its end cost a serial step 4 %).
inline constexpr index_t range_chunk_pairs = 256;

/// No row copies in pass 1 (device backends, tests): the sorted hidden rows are in `a.h` already and
/// the hidden gradients stay in `a.grad_h`.
struct no_row_copies {
  XSOFTMAX_HD void in(index_t, index_t) const {}
  XSOFTMAX_HD void out(index_t, index_t) const {}
};

/// A host row-range task's own rows copied by the task itself (`sigmoid_pair_pass`): the sorted
/// hidden rows in before its pairs (sorted row r = row source[r] of `hidden`, widened to fp32, into
/// row r of `sorted`, the step's `a.h`) and, with `grad_out`, the hidden-gradient rows out after them
/// (row r of `grad_sorted`, the step's `a.grad_h`, to row source[r] of `grad_out`) -- by the thread
/// that uses them, while they are in its cache. As a sorted copy and a scatter back of their own
/// (two parallel regions) they took 28 us of a 2-thread binary-Huffman step's 358 at 50K classes,
/// d = 100, a third of it waiting (bench/RESULTS.md, issue 30).
template <class H>
struct range_row_copies {
  matrix_view<const H> hidden;
  const index_t* source;
  float* sorted;
  matrix_view<float> grad_out;  ///< no rows: no gradients to copy out
  const float* grad_sorted;
  // Host-only in use (a device has no row-range tasks), but callable from the pass's host-device
  // operator() without nvcc's warning about a host function there.
  XSOFTMAX_HD void in(index_t r0, index_t r1) const {
    const index_t d = hidden.cols;
    for (index_t r = r0; r < r1; ++r) {
      const H* from = hidden.row(source[r]);
      float* to = sorted + r * d;
      for (index_t p = 0; p < d; ++p) to[p] = to_float(from[p]);
    }
  }
  XSOFTMAX_HD void out(index_t r0, index_t r1) const {
    if (grad_out.rows == 0) return;
    const index_t d = grad_out.cols;
    for (index_t r = r0; r < r1; ++r) {
      const float* from = grad_sorted + r * d;
      float* to = grad_out.row(source[r]);
      for (index_t p = 0; p < d; ++p) to[p] = from[p];
    }
  }
};

/// Pass-1 work: runs [run_begin, run_end) whole (row_end == 0), or rows [row_begin, row_end) of the
/// long run run_begin (scores only: its node-gradient row is pass 2's).
struct sigmoid_task {
  index_t run_begin = 0, run_end = 0, row_begin = 0, row_end = 0;
};

/// Pass 1, task t: the scores, losses and dLoss/dscore of its pairs, G at a time (their dot products
/// first, then their losses side by side: `sigmoid_node_losses`), then the node rows of its whole
/// runs. A task is either a piece of the run list (`tasks[t]`: device backends) or, on a host
/// backend, the rows [row_first[t], row_first[t + 1]) through every level (`row_first` set): each
/// level's runs clipped to those rows, in level order, so that the task owns its rows' losses and
/// hidden gradients and adds each pair's terms there while the node row is in cache (see `owns_rows`),
/// and copies its rows in and out itself (`Copies`: `range_row_copies`, or none).
template <class T, index_t G, class Copies = no_row_copies>
struct sigmoid_pair_pass {
  node_run_data<T> a;  // child: per entry
  level_entries at;
  const node_run* runs;
  const sigmoid_task* tasks;       ///< the run-list tasks (when row_first is null)
  const index_t* row_first;        ///< host: the row ranges' bounds (null: run-list tasks)
  const std::size_t* level_first;  ///< with row_first: level l's runs are [level_first[l], level_first[l + 1])
  float* pair_loss;  ///< per entry (read by pass 2 when !owns_rows)
  float* gs;         ///< per entry; null without gradients
  /// Each task owns its rows (row-range tasks): every pair's loss and hidden-gradient row are added
  /// to its row here, while the node row is in cache, in level order as pass 2 would add them
  /// (bitwise its values); pass 2 then has only the node rows of the runs that cross a range
  /// boundary. Pass 2 read every node row a second time, most of them from beyond L2 (a
  /// binary-Huffman step at 50K classes, d = 100, in callgrind's cache model with a 1 MiB L2: 1.7 of
  /// its 8.7 MB of L2 read misses; bench/RESULTS.md, issue 30).
  bool owns_rows;
  Copies copies;  ///< row-range tasks: their rows in before their pairs, out after them
  /// Row-range tasks: the runs that cross a range bound (`runs_across`, in plan order), and for each
  /// the row its node-gradient row's sum has reached (`crossing_parts`).
  const node_run* across = nullptr;
  index_t across_count = 0;
  std::atomic<index_t>* summed_to = nullptr;

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
      const index_t child = at.keys_are_path_rows ? path_rows::child(at.node_key[q.entry[j]]) : a.child[q.entry[j]];
      q.first[j] = child == 0 ? 1.f : 0.f;
    }
  }

  XSOFTMAX_HD void losses(group& q) const { sigmoid_node_losses<G>(q.sc, q.first, q.loss, q.ds); }

  XSOFTMAX_HD void effects(const group& q) const {
    for (index_t j = 0; j < q.m; ++j) {
      const float g = gs ? q.ds[j] * a.upstream[q.row[j]] : 0.f;
      if (gs) gs[q.entry[j]] = g;  // the node rows' sums read it
      if (!owns_rows) {  // pass 2 adds the losses and hidden gradients
        pair_loss[q.entry[j]] = q.loss[j];
        continue;
      }
      a.loss[q.row[j]] += q.loss[j];
      if (gs)  // entry < rows: the row's first level
        put_row_term(at.grad_h_unset && q.entry[j] < at.rows, g, q.wr[j], a.grad_h + q.row[j] * a.dim, a.dim);
    }
  }

  /// Every pair `pieces(add)` names -- add(run, first row, end row), in the order the pairs' terms
  /// are to be added -- scored G at a time. Two groups in flight: a full group's losses (a
  /// ~50-cycle chain of exp and log1p) are started before the next group's dot products and its
  /// effects (which wait on them) come after, so the core runs the chain beside the dots; scored
  /// one group at a time the chain sat between its dots and its effects (7.5 % of a serial
  /// binary-Huffman step, bench/RESULTS.md, issue 30). Each group's effects still come in group
  /// order: the same values, bitwise.
  template <class Pieces>
  XSOFTMAX_HD void score_pairs(Pieces pieces) const {
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
    pieces([&](const node_run& run, index_t r0, index_t r1) {
      const index_t node = run.block_begin / 2;
      for (index_t r = r0; r < r1; ++r) {
        group& f = q[filling];
        f.row[f.m] = r;
        f.entry[f.m] = at.entry(run.level, r);
        f.wr[f.m] = a.w.row(node);
        f.bias[f.m] = a.bias ? to_float(a.bias[node]) : 0.f;
        if (++f.m == G) flush();
      }
    });
    if (q[filling].m > 0) flush();
    if (pending) {
      losses(q[1 - filling]);
      effects(q[1 - filling]);
    }
  }

  /// A run's node-gradient row, the terms of its rows [from, to) added in order (from = run.begin:
  /// the row starts as the first sample's term, no zeroing pass; otherwise the sum continues where
  /// the rows before `from` left it, its bias too).
  XSOFTMAX_HD void node_row_part(const node_run& run, index_t from, index_t to) const {
    const index_t d = a.dim;
    const float* g = gs + at.entry(run.level, run.begin);
    float* gwr = a.grad_w + run.grad_offset * d;
    float bias_acc = from == run.begin || !a.grad_b ? 0.f : a.grad_b[run.grad_offset];
    for (index_t i = from - run.begin; i < to - run.begin; ++i) {
      const float* h = a.h + (run.begin + i) * d;
      if (i == 0)
        scale_row(g[i], h, gwr, d);
      else
        axpy_row(g[i], h, gwr, d);
      bias_acc += g[i];
    }
    if (a.grad_b) a.grad_b[run.grad_offset] = bias_acc;
  }

  /// A whole run's node-gradient row: its samples' terms in order.
  XSOFTMAX_HD void node_row(const node_run& run) const { node_row_part(run, run.begin, run.end); }

#if !defined(__CUDA_ARCH__)
  /// Rows [r0, r1)'s parts of the runs that cross a range bound, on levels below `level_end` (their
  /// pairs in those rows all scored): each part once the ranges before have summed the run up to r0
  /// (`summed_to`, acquire; a first part waits for nothing), published as the row its sum reached
  /// (release) -- a run's terms in row order: `node_row`'s bits. Called after every chunk without
  /// waiting (a part not ready yet is left), and at the task's end waiting: a part waits only on
  /// lower ranges, which `parallel_for_uneven` hands out first (in index order), so nothing
  /// deadlocks. Summed apart, in a pass of their own by column blocks, these rows (2,135 of a
  /// 2-thread binary-Huffman step's 10,981 pairs at 50K classes, d = 100) read half their hidden rows
  /// from the other core's cache: 16-22 us of a 0.33-0.36 ms step (bench/RESULTS.md, issue 30).
  void crossing_parts(index_t r0, index_t r1, int level_end, bool wait) const {
    for (index_t k = 0; k < across_count; ++k) {
      const node_run& run = across[k];
      if (run.level - at.level0 >= level_end) break;  // plan order: level by level
      if (run.end <= r0 || run.begin >= r1) continue;
      const index_t from = run.begin > r0 ? run.begin : r0, to = run.end < r1 ? run.end : r1;
      index_t reached = summed_to[k].load(std::memory_order_acquire);
      if (reached >= to) continue;  // this part is in
      if (from > run.begin && reached != from) {  // the ranges before have not summed up to r0
        if (!wait) continue;
        for (unsigned spins = 1; (reached = summed_to[k].load(std::memory_order_acquire)) != from; ++spins)
          if (spins % 64 == 0) std::this_thread::yield();
      }
      node_row_part(run, from, to);
      summed_to[k].store(to, std::memory_order_release);
    }
  }
#endif

  /// The first of level l's runs that ends after row r (runs of a level are in row order).
  XSOFTMAX_HD index_t first_run_after(int l, index_t r) const {
    index_t lo = static_cast<index_t>(level_first[l]), hi = static_cast<index_t>(level_first[l + 1]);
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (runs[mid].end <= r) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /// Where a row-range task is: run k of level l (clipped to rows [r0, r1)), level by level.
  struct range_cursor {
    const sigmoid_pair_pass* pass;
    index_t r0, r1;
    int l;
    index_t k;
    XSOFTMAX_HD bool done() const { return l >= pass->at.levels; }
    /// Moves to the first run at or after (l, k) that has rows in [r0, r1).
    XSOFTMAX_HD void settle() {
      while (!done() && !(k < static_cast<index_t>(pass->level_first[l + 1]) && pass->runs[k].begin < r1))
        if (++l < pass->at.levels) k = pass->first_run_after(l, r0);
    }
    XSOFTMAX_HD void advance() {
      ++k;
      settle();
    }
    XSOFTMAX_HD bool same(const range_cursor& o) const { return l == o.l && (done() || k == o.k); }
  };

  XSOFTMAX_HD void operator()(index_t t) const {
    if (row_first) {  // rows [r0, r1) through every level, `range_chunk_pairs` pairs at a time
      copies.in(row_first[t], row_first[t + 1]);
      range_cursor c{this, row_first[t], row_first[t + 1], 0, 0};
      c.k = first_run_after(0, c.r0);
      c.settle();
      while (!c.done()) {
        const range_cursor chunk = c;
        score_pairs([&](auto&& add) {
          for (index_t pairs = 0; !c.done() && pairs < range_chunk_pairs; c.advance()) {
            const node_run& run = runs[c.k];
            const index_t b = run.begin > c.r0 ? run.begin : c.r0, e = run.end < c.r1 ? run.end : c.r1;
            add(run, b, e);
            pairs += e - b;
          }
        });
        // The chunk's node rows while its rows are in cache: those of the runs inside the range
        // (the others' parts: `crossing_parts`).
        if (gs)
          for (range_cursor n = chunk; !n.same(c); n.advance())
            if (runs[n.k].begin >= c.r0 && runs[n.k].end <= c.r1) node_row(runs[n.k]);
#if !defined(__CUDA_ARCH__)
        if (gs && across_count > 0) crossing_parts(c.r0, c.r1, c.done() ? at.levels : c.l, false);
#endif
      }
      if (gs) copies.out(c.r0, c.r1);  // every term of its rows' hidden gradients is in
#if !defined(__CUDA_ARCH__)
      if (gs && across_count > 0) crossing_parts(c.r0, c.r1, at.levels, true);
#endif
      return;
    }
    const sigmoid_task task = tasks[t];
    const bool slice = task.row_end > task.row_begin;
    score_pairs([&](auto&& add) {
      for (index_t k = task.run_begin; k < task.run_end; ++k) {
        const node_run& run = runs[k];
        add(run, slice ? task.row_begin : run.begin, slice ? task.row_end : run.end);
      }
    });
    if (!gs || slice) return;
    for (index_t k = task.run_begin; k < task.run_end; ++k) node_row(runs[k]);
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
template <class Runs>
inline std::vector<sigmoid_task> sigmoid_tasks(const Runs& runs, index_t pairs,
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

/// Row ranges a host step's pass-1 tasks take per thread: enough for the threads to even out
/// rows of different path depths (`parallel_for_uneven`), few enough that few runs cross a range
/// boundary (their node rows are summed in parts, one range after another: `crossing_parts`).
inline constexpr index_t sigmoid_ranges_per_thread = 1;

/// The bounds of `ranges` ranges of consecutive rows with about equal pair counts (rows [first[j],
/// first[j + 1]); empty ranges dropped), row r having pairs_of(r) of the `pairs` in all.
template <class PairsOf>
std::vector<index_t> row_ranges_by(index_t rows, index_t ranges, index_t pairs, PairsOf pairs_of) {
  std::vector<index_t> first{0};
  if (ranges > 1) {
    index_t done = 0;               // pairs of rows before r
    index_t next = pairs / ranges;  // the next bound: after j / ranges of the pairs, j = first.size()
    for (index_t r = 0; r < rows; ++r) {
      if (done >= next && r > first.back()) {
        first.push_back(r);
        const index_t j = static_cast<index_t>(first.size());
        next = j < ranges ? pairs * j / ranges : pairs + 1;  // divided once a bound, not once a row
      }
      done += pairs_of(r);
    }
  }
  first.push_back(rows);
  return first;
}

/// `row_ranges_by` from `runs` (a row's pairs: the runs it is in).
template <class Runs>
std::vector<index_t> sigmoid_row_ranges(const Runs& runs, index_t rows, index_t ranges) {
  if (ranges <= 1) return {0, rows};
  std::vector<index_t> starts(static_cast<std::size_t>(rows) + 1, 0);  // pairs per row, as differences
  index_t pairs = 0;
  for (const node_run& run : runs) {
    ++starts[static_cast<std::size_t>(run.begin)];
    --starts[static_cast<std::size_t>(run.end)];
    pairs += run.end - run.begin;
  }
  index_t open = 0;  // runs open at row r (rows are visited in order)
  return row_ranges_by(rows, ranges, pairs, [&](index_t r) { return open += starts[static_cast<std::size_t>(r)]; });
}

/// `row_ranges_by` from each row's pair count (`level_entries::path_levels`): no pass over the run
/// list, which the other threads have just written (perf: 0.4 % of a 2-thread binary-Huffman step's
/// samples at 50K classes, all on the calling thread; bench/RESULTS.md, issue 30).
inline std::vector<index_t> sigmoid_row_ranges_by_pairs(const index_t* pairs_per_row, index_t rows, index_t ranges) {
  if (ranges <= 1) return {0, rows};
  index_t pairs = 0;
  for (index_t r = 0; r < rows; ++r) pairs += pairs_per_row[r];
  return row_ranges_by(rows, ranges, pairs, [&](index_t r) { return pairs_per_row[r]; });
}

/// The runs of `runs` (level l's: [level_first[l], level_first[l + 1])) that cross one of the range
/// bounds in `row_first` (begin < bound < end), each once, in plan order.
template <class Runs>
inline std::vector<node_run> runs_across(const Runs& runs, const std::vector<std::size_t>& level_first,
                                        const std::vector<index_t>& row_first) {
  std::vector<node_run> across;
  for (std::size_t l = 0; l + 1 < level_first.size(); ++l) {
    const auto first = runs.begin() + static_cast<std::ptrdiff_t>(level_first[l]),
               last = runs.begin() + static_cast<std::ptrdiff_t>(level_first[l + 1]);
    auto from = first;
    for (std::size_t j = 1; j + 1 < row_first.size(); ++j) {
      const index_t bound = row_first[j];
      from = std::partition_point(from, last, [&](const node_run& run) { return run.end <= bound; });
      if (from == last) break;
      if (from->begin < bound && (across.empty() || across.back().level != from->level ||
                                  across.back().begin != from->begin))
        across.push_back(*from);
    }
  }
  return across;
}

/// Every level's sigmoid `runs` (any levels within `at`, in plan order; one level's runs cover its
/// rows whose key is not negative) in one parallel pass on a host, two on a device (see the file
/// comment). `a.child` is per
/// entry, `a.scratch` holds `sigmoid_levels_scratch(at, a.backward())` floats; losses and hidden
/// gradients are added to `a.loss` / `a.grad_h`, each run's gradient rows written at its offset.
///
/// On a host backend the step is one parallel region: a task per row range through every level
/// (`sigmoid_pair_pass`: each adds its rows' terms itself and its parts of the node rows of the runs
/// that cross a range bound; one range on the serial backend or one thread). The run-list
/// tasks with a per-entry pass 2 (device backends) left each node row to be read twice and the
/// losses and hidden gradients to a pass of their own (the 2-thread binary-Huffman step at 50K
/// classes, d = 100: bench/RESULTS.md, issue 30). `ranges` > 0 sets the host's range count (tests:
/// every count gives the same bits); 0, the default: one, or `sigmoid_ranges_per_thread` per thread.
/// `runs`: a vector of `node_run` (any allocator). `copies` (host): each range copies its own rows
/// in and out (`range_row_copies`); then `a.h` is filled by the ranges, and with gradients every
/// row's hidden gradient reaches `copies.grad_out` (runs empty: nothing is copied).
template <class B, class T, class Runs, class Copies = no_row_copies>
void sigmoid_levels_generic(const execution<B>& ex, const node_run_data<T>& a, const Runs& runs,
                            const level_entries& at, index_t ranges = 0, const Copies& copies = {}) {
  static_assert(is_host_backend<B> || std::is_same_v<Copies, no_row_copies>,
                "xsoftmax: row copies are the host row ranges' (a device has no row-range tasks)");
  if (runs.empty() || at.rows == 0) return;
  constexpr bool host = is_host_backend<B>;
  constexpr index_t G = host ? sigmoid_group : 1;
  float* pair_loss = a.scratch;
  float* gs = a.backward() ? a.scratch + at.count() : nullptr;
  if constexpr (host) {
    // Each level's runs (plan order: level by level, rows ascending within a level).
    std::vector<std::size_t> level_first(static_cast<std::size_t>(at.levels) + 1, 0);
    for (int l = 0; l < at.levels; ++l)
      level_first[static_cast<std::size_t>(l) + 1] = static_cast<std::size_t>(
          std::partition_point(runs.begin() + static_cast<std::ptrdiff_t>(level_first[static_cast<std::size_t>(l)]),
                               runs.end(), [&](const node_run& run) { return run.level <= at.level0 + l; }) -
          runs.begin());
    if (ranges <= 0) ranges = runs_tasks_in_order(ex) ? 1 : execution<B>::ops::threads() * sigmoid_ranges_per_thread;
    const std::vector<index_t> row_first = at.path_levels && at.level0 == 0
                                               ? sigmoid_row_ranges_by_pairs(at.path_levels, at.rows, ranges)
                                               : sigmoid_row_ranges(runs, at.rows, ranges);
    const std::vector<node_run> across = runs_across(runs, level_first, row_first);
    const std::unique_ptr<std::atomic<index_t>[]> summed_to(new std::atomic<index_t>[across.size()]);
    for (std::size_t k = 0; k < across.size(); ++k) summed_to[k].store(-1, std::memory_order_relaxed);
    sigmoid_pair_pass<T, G, Copies> pass{a,
                                         at,
                                         runs.data(),
                                         nullptr,
                                         row_first.data(),
                                         level_first.data(),
                                         pair_loss,
                                         gs,
                                         true,
                                         copies,
                                         across.data(),
                                         static_cast<index_t>(across.size()),
                                         summed_to.get()};
    parallel_for_uneven(ex, static_cast<index_t>(row_first.size()) - 1, pass);
    return;
  }
  std::vector<node_run> long_runs;
  const std::vector<sigmoid_task> tasks = sigmoid_tasks(runs, 1, long_runs, run_parallel_inside);
  // A device gets copies of the three lists in working memory of the call, one upload for all
  // (was one each: a wait for the stream each).
  scratch_lists<B, node_run, sigmoid_task, node_run> device(ex, runs, tasks, long_runs);
  const node_run* device_runs = device.template list<0>();
  const sigmoid_task* device_tasks = device.template list<1>();
  const node_run* device_long = device.template list<2>();
  parallel_for_uneven(ex, static_cast<index_t>(tasks.size()),
                      sigmoid_pair_pass<T, G>{a, at, device_runs, device_tasks, nullptr, nullptr, pair_loss, gs, false,
                                              {}, nullptr, 0, nullptr});
  const index_t blocks = (a.dim + sigmoid_column_block::width - 1) / sigmoid_column_block::width;
  const index_t row_tasks = at.rows;  // a row per task
  const index_t column_tasks = gs ? static_cast<index_t>(long_runs.size()) * blocks : 0;
  parallel_for_uneven(ex, row_tasks + column_tasks,
                      sigmoid_row_pass<T>{a, at, pair_loss, gs, device_long, 1, row_tasks, blocks});
}

}  // namespace xsoftmax::detail
