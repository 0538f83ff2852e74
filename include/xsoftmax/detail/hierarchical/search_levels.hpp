// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The host backends' exact top-k search over softmax nodes, level by level above a cut: the
/// runner `tree_search_tuning<serial / omp>` takes for an exact search (a beam search takes the
/// lockstep rounds of search_rounds.hpp). The generic best-first search (`topk_search_step`) is its
/// oracle: the same classes and log-probabilities, to the bit.
///
/// Why: a best-first search expands one node at a time per row, each row at its own node, so the
/// rows that share an expansion are few (two on average for an exact top-10 at 512 rows of a
/// 2-level tree over 1e5 classes, d = 256, trained weights: ~177 expansions a row; the rounds ran
/// at ~8x the cost of the same expansions done node by node for all their rows). Here the open
/// nodes of a level are expanded together, node by node for all the rows that reach it (~27 rows a
/// node there), each weight block read once per 32 rows and scored two children against four rows
/// a pass (`node_child_log_probs`).
///
/// How, per tile of rows (keys: `open_heap::pack`, log-probability, then the smaller weight row):
///  1. a greedy dive: from each row's start, the best child node level by level, expanded; once a
///     row holds k leaves, the k-th's key is a cut: the exact top-k are k leaves at or above it;
///  2. level by level below the start: a level's open nodes are the children nodes of the level
///     above's expansions (the dive's included; its nodes are not expanded again) at or above their
///     rows' cuts, taken each row's best first in waves (`search_first_wave`, then twice as many
///     ...); a wave's nodes are grouped by node and their children scored for their rows together;
///     a child at or above its row's cut is a candidate leaf or an open node of the next level,
///     anything below is dropped with all it holds (log-probabilities only fall along a path, and a
///     child's weight row is after its parent's in the breadth-first layout, so a descendant's key
///     is below its ancestor's). Once a row holds k candidate leaves the cut rises to the k-th;
///  3. each row's k best candidates by key, descending: the best-first search's output, because with
///     keys that fall along every path a best-first search pops leaves in key order.
/// A child's log-probability is `child_log_probs<false>`'s and a path's sum the same additions as
/// the best-first search's (parent's value + child's), so the keys are the oracle's bit for bit.
/// Every node is expanded once; the expansions counted are a superset of the best-first search's
/// (every node it expands is at or above the k-th leaf's key): the nodes between the dive's cut and
/// the k-th leaf, and a wave's nodes that an earlier leaf in the same wave would have cut, are the
/// price of the batching (177.4 expansions a row against 177.3 on the trained weights above; 4.0
/// against 3.5 where one node holds a row's top 10). No open list of the step is used: its
/// capacity does not bound this search, whose levels are bounded by `search_level_budget_bytes`.

#include <xsoftmax/detail/hierarchical/search_rounds.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

/// How many of a row's open nodes of a level the level search expands first (then twice as many,
/// and so on, each wave only the nodes at or above the cut the earlier waves' leaves raised). Small,
/// so that a row whose best node holds its top k stops soon (weights that learnt only the class
/// prior: 4.0 expansions a row against 5.5 with waves of 16 and the best-first search's 3.5); the
/// waves then double, so that rows that expand many nodes do it in few waves.
inline constexpr index_t search_first_wave = 4;

/// An open node of the level-by-level search: tile row `row` at the node whose children are the
/// block [block_begin, block_begin + block_size); `key`: the node's (`open_heap::pack` of its
/// log-probability and weight row; a start block's: log-probability 0). Rows, blocks and weight
/// rows are below 2^32 (the head checks its weight rows), so 24 bytes.
struct level_open_node {
  std::uint64_t key;
  std::uint32_t row, block_begin, block_size;
};

/// Memory for one level's open nodes (the next level's, as they are made), and for the
/// log-probabilities of the dived nodes' children: rows are searched in parts small enough for it
/// (`host_level_search`).
inline constexpr std::size_t search_level_budget_bytes = std::size_t(128) << 20;

/// A candidate leaf: tile row `row`, its key (`open_heap::pack`: log-probability and weight row).
struct level_leaf {
  index_t row;
  std::uint64_t key;
};

/// The runner (see the file comment). `run` returns false, having written nothing, for a beam
/// search (not one it takes). The tile's rows are searched in parts whose
/// levels' open nodes fit `budget_bytes`: all of them at once, else halves, quarters ... (a part
/// that outgrows it is searched again in halves); a lone row that outgrows it takes the rounds.
template <class B>
struct host_level_search {
  template <class T, class View>
  static bool run(const execution<B>& ex, const topk_search_step<false, T, View, 1>& step,
                  std::size_t budget_bytes = search_level_budget_bytes) {
    if (step.beam > 0 || step.n == 0 || step.k == 0) return false;
    for (index_t off = 0, part = step.n; off < step.n;) {
      const auto rows = rows_of(step, off, std::min(part, step.n - off));
      if (search_rows(ex, rows, budget_bytes)) {
        off += rows.n;
      } else if (part > 1) {
        part = (part + 1) / 2;
      } else {
        host_search_rounds<B>::run(ex, rows);
        off += 1;
      }
    }
    return true;
  }

 private:
  /// Rows [off, off + m) of the tile of `step`, as a step of their own.
  template <class Step>
  static Step rows_of(const Step& step, index_t off, index_t m) {
    Step s = step;
    s.row0 = step.row0 + off;
    s.n = m;
    s.open_key = step.open_key + off * step.capacity;
    s.child_lp = step.child_lp + off * step.max_block;
    s.leaf_lp = step.leaf_lp + off * step.k;
    s.overflow = step.overflow + off;
    return s;
  }

  /// The search of the step's rows; false when a level's open nodes, or the dive's kept
  /// log-probabilities, outgrow `budget_bytes`.
  template <class T, class View>
  static bool search_rows(const execution<B>& ex, const topk_search_step<false, T, View, 1>& step,
                          std::size_t budget_bytes) {
    const index_t n = step.n, k = step.k;
    std::vector<std::uint64_t> cut(static_cast<std::size_t>(n), 0);
    std::vector<index_t> expanded(static_cast<std::size_t>(n), 0), row_begin(static_cast<std::size_t>(n + 1));
    std::vector<std::vector<std::uint64_t>> found(static_cast<std::size_t>(n));
    const auto starts = [&] {
      std::vector<level_open_node> o(static_cast<std::size_t>(n));
      for (index_t i = 0; i < n; ++i) {
        const index_t r = step.row0 + i;
        o[i] = level_open_node{open_heap::pack(0.f, 0), static_cast<std::uint32_t>(i),
                               static_cast<std::uint32_t>(step.start_begin ? step.start_begin[r] : 0),
                               static_cast<std::uint32_t>(step.start_begin ? step.start_size[r] : step.tv.root_block_size())};
      }
      return o;
    };
    // The open nodes `o` grouped by row (row_begin), each row's best first. A counting sort by
    // row, then each row's own (short) sort: one sort of all of them by (row, key) was 6-8 ms at
    // 512 rows x 317 nodes.
    std::vector<level_open_node> by_row;
    const auto group_by_row = [&](std::vector<level_open_node>& o) {
      std::fill(row_begin.begin(), row_begin.end(), 0);
      for (const level_open_node& x : o) ++row_begin[x.row + 1];
      for (index_t i = 0; i < n; ++i) row_begin[i + 1] += row_begin[i];
      by_row.resize(o.size());
      std::vector<index_t> fill_at(row_begin.begin(), row_begin.end() - 1);
      for (const level_open_node& x : o) by_row[fill_at[x.row]++] = x;
      const auto better = [](const level_open_node& a, const level_open_node& b) { return a.key > b.key; };
      for (index_t i = 0; i < n; ++i) {
        const auto first = by_row.begin() + row_begin[i], last = by_row.begin() + row_begin[i + 1];
        std::sort(first, last, better);
      }
      o.swap(by_row);
    };
    std::vector<level_open_node> open = starts(), wave, next;
    wave_buffers buffers;
    const auto too_big = [&](const std::vector<level_open_node>& o) {
      return o.size() * sizeof(level_open_node) > budget_bytes;
    };
    // 1. A greedy dive: from each row's start, the best child node, level by level, expanded; its
    // leaves (k of them, a block of k or more leaves at the bottom) give the row its first cut.
    // What it expanded stays done: per level, each row's dived node and the log-probabilities of
    // its children, whose nodes the level below takes up once the cut is known (materialising
    // every child node of the root as it was scored cost more than the few expansions of rows
    // whose top k one node holds).
    std::vector<std::vector<level_open_node>> dived;  // [level][row]: the dived node (block_size 0: none)
    std::vector<std::vector<std::size_t>> dive_at;    // [level][row]: where its children's log-probabilities start
    std::vector<std::vector<float>> dive_lp;          // [level]: those log-probabilities
    std::size_t dive_bytes = 0;
    while (!open.empty()) {
      dived.emplace_back(static_cast<std::size_t>(n), level_open_node{0, 0, 0, 0});
      dive_at.emplace_back(static_cast<std::size_t>(n), 0);
      std::size_t floats = 0;
      for (const level_open_node& o : open) {  // one node a row
        dived.back()[o.row] = o;
        dive_at.back()[o.row] = floats;
        floats += o.block_size;
        ++expanded[o.row];
      }
      dive_bytes += floats * sizeof(float);
      if (dive_bytes > budget_bytes) return false;
      dive_lp.emplace_back(floats);
      next.clear();
      expand_wave(ex, step, open, cut, found, next, dive_store{dive_lp.back().data(), dive_at.back().data()}, buffers);
      open.clear();
      for (const level_open_node& o : next)  // each row's best child node, while at or above its cut
        if (o.key >= cut[o.row]) open.push_back(o);
    }
    // 2. Level by level below the start (every start was dived): a level's open nodes are the
    // children of the nodes expanded at the level above, those of the dived nodes included, at or
    // above their rows' cuts; its dived nodes are not expanded again.
    for (std::size_t level = 1; level < dived.size() || !open.empty(); ++level) {
      const level_open_node* skip = level < dived.size() ? dived[level].data() : nullptr;
      const auto keep = [&](std::uint64_t key, index_t row) {  // the cut may have risen since they were made
        return key >= cut[row] && !(skip && skip[row].block_size > 0 && key == skip[row].key);
      };
      std::size_t kept = 0;
      for (const level_open_node& o : open)
        if (keep(o.key, o.row)) open[kept++] = o;
      open.resize(kept);
      if (level - 1 < dived.size()) {  // the children nodes of the level above's dived nodes
        for (index_t i = 0; i < n; ++i) {
          const level_open_node& d = dived[level - 1][i];
          const float base = open_heap::lp_of(d.key);  // as expand_level_task added them
          const float* lp = dive_lp[level - 1].data() + dive_at[level - 1][i];
          for (index_t j = 0; j < static_cast<index_t>(d.block_size); ++j) {
            const index_t c = static_cast<index_t>(d.block_begin) + j;
            const std::uint64_t key = open_heap::pack(base + lp[j], c);
            if (!keep(key, i)) continue;
            const child_ref ch = step.tv.child(c);
            if (!ch.is_leaf)
              open.push_back(level_open_node{key, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(ch.block_begin),
                                             static_cast<std::uint32_t>(ch.block_size)});
          }
        }
        std::vector<float>().swap(dive_lp[level - 1]);  // done with: freed
        if (too_big(open)) return false;
      }
      if (open.empty() && level >= dived.size()) break;
      // Each row's best first, in waves of the next search_first_wave, 2 search_first_wave, 4 ...
      // of its nodes: a wave's leaves raise the cut that the next wave's nodes must reach, as a
      // best-first search stops at the k-th leaf.
      group_by_row(open);
      next.clear();
      for (index_t rank = 0, width = search_first_wave;; rank += width, width *= 2) {
        wave.clear();
        for (index_t i = 0; i < n; ++i)
          for (index_t a = row_begin[i] + rank, e = std::min(a + width, row_begin[i + 1]); a < e && open[a].key >= cut[i]; ++a)
            wave.push_back(open[a]);
        if (wave.empty()) break;  // every row's next node is below its cut (or it has none)
        for (const level_open_node& o : wave) ++expanded[o.row];
        expand_wave(ex, step, wave, cut, found, next, dive_store{}, buffers);
        if (too_big(next)) return false;
      }
      open.swap(next);
    }
    // 3. Each row's k best, in key order.
    for (index_t i = 0; i < n; ++i) {
      const index_t r = step.row0 + i;
      auto& f = found[i];
      std::sort(f.begin(), f.end(), std::greater<>());
      const index_t m = std::min<index_t>(k, static_cast<index_t>(f.size()));
      for (index_t q = 0; q < m; ++q) {
        step.classes(r, q) = step.tv.child(open_heap::row_of(f[q])).leaf_class;
        step.log_probs(r, q) = open_heap::lp_of(f[q]);
      }
      step.overflow[i] = 0;
      step.finish_row(r, m, expanded[i]);
    }
    return true;
  }

  /// Where the dive keeps the log-probabilities of its nodes' children: row i's at lp + at[i]
  /// (null lp: not the dive).
  struct dive_store {
    float* lp = nullptr;
    const std::size_t* at = nullptr;
  };

  /// A wave's task outputs, kept from wave to wave of a search so that their memory is reused.
  struct wave_buffers {
    std::vector<index_t> task_begin, touched;
    std::vector<std::vector<level_open_node>> next_parts;
    std::vector<std::vector<level_leaf>> leaf_parts;
  };

  /// The open nodes of `wave` expanded, node by node for their rows (tasks of up to
  /// search_round_task_rows rows at one node, on the execution's threads): children at or above
  /// their rows' cuts appended to `next` (open nodes; in the dive only each row's best, the
  /// children's log-probabilities kept in `dive`) or to their rows' `found` leaves, of which a
  /// row keeps its k best and raises its cut to the k-th once it has k.
  template <class Step>
  static void expand_wave(const execution<B>& ex, const Step& step, std::vector<level_open_node>& wave,
                          std::vector<std::uint64_t>& cut, std::vector<std::vector<std::uint64_t>>& found,
                          std::vector<level_open_node>& next, dive_store dive, wave_buffers& buf) {
    const index_t k = step.k;
    std::sort(wave.begin(), wave.end(), [](const level_open_node& a, const level_open_node& b) {
      return a.block_begin != b.block_begin ? a.block_begin < b.block_begin : a.row < b.row;
    });
    std::vector<index_t>& task_begin = buf.task_begin;
    task_begin.clear();
    for (index_t a = 0; a < static_cast<index_t>(wave.size()); ++a)
      if (a == 0 || wave[a].block_begin != wave[a - 1].block_begin || a - task_begin.back() == search_round_task_rows)
        task_begin.push_back(a);
    task_begin.push_back(static_cast<index_t>(wave.size()));
    const index_t tasks = static_cast<index_t>(task_begin.size()) - 1;
    if (buf.next_parts.size() < static_cast<std::size_t>(tasks)) {
      buf.next_parts.resize(static_cast<std::size_t>(tasks));
      buf.leaf_parts.resize(static_cast<std::size_t>(tasks));
    }
    parallel_for_uneven(ex, tasks, [&](index_t t) {
      buf.next_parts[t].clear();
      buf.leaf_parts[t].clear();
      expand_level_task(step, wave.data() + task_begin[t], task_begin[t + 1] - task_begin[t], cut.data(), dive,
                        buf.next_parts[t], buf.leaf_parts[t]);
    });
    for (index_t t = 0; t < tasks; ++t) next.insert(next.end(), buf.next_parts[t].begin(), buf.next_parts[t].end());
    std::vector<index_t>& touched = buf.touched;
    touched.clear();
    for (index_t t = 0; t < tasks; ++t)
      for (const level_leaf& l : buf.leaf_parts[t]) {
        found[l.row].push_back(l.key);
        touched.push_back(l.row);
      }
    for (const index_t i : touched) {
      auto& f = found[i];
      if (static_cast<index_t>(f.size()) < k) continue;
      std::nth_element(f.begin(), f.begin() + (k - 1), f.end(), std::greater<>());
      f.resize(static_cast<std::size_t>(k));
      cut[i] = std::max(cut[i], f[static_cast<std::size_t>(k - 1)]);
    }
  }

  /// The m open nodes `e` (one node, distinct rows) expanded: their children's keys against their
  /// rows' cuts; candidate leaves into `leaves` (each node's k best at most: pushing every leaf and
  /// selecting afterwards was 5.7-7.9 us a row-expansion in the dive, whose first leaves meet no
  /// cut), open nodes into `next` (in the dive: each row's best only, the log-probabilities kept
  /// in `dive`). The children's log-probabilities and the leaf heap live in per-thread buffers
  /// that grow as needed and are not value-initialised a task at a time.
  template <class Step>
  static void expand_level_task(const Step& step, const level_open_node* e, index_t m, const std::uint64_t* cut,
                                dive_store dive, std::vector<level_open_node>& next, std::vector<level_leaf>& leaves) {
    const index_t nb = e[0].block_begin, ns = e[0].block_size;
    thread_local std::vector<float> lp;
    thread_local std::vector<std::uint64_t> best;
    if (!dive.lp && lp.size() < static_cast<std::size_t>(m * ns)) lp.resize(static_cast<std::size_t>(m * ns));
    const float* hr[search_round_task_rows] = {};
    float* out[search_round_task_rows] = {};  // initialised: GCC takes the const-pointer argument as a read of every entry
    for (index_t a = 0; a < m; ++a) {
      hr[a] = step.h + (step.row0 + e[a].row) * step.d;
      out[a] = dive.lp ? dive.lp + dive.at[e[a].row] : lp.data() + a * ns;
    }
    node_child_log_probs(step, nb, ns, hr, out, m);
    for (index_t a = 0; a < m; ++a) {
      const index_t i = e[a].row;
      const float base = open_heap::lp_of(e[a].key);  // as the best-first search expands it (-0 as +0)
      // This node's k best leaves in a min-heap; once it holds k, its least is a floor above the
      // row's cut for every later child (a leaf or node below it cannot reach the row's top k).
      best.clear();
      std::uint64_t floor = cut[i];
      level_open_node top{0, 0, 0, 0};  // the dive's: the best child node
      for (index_t j = 0; j < ns; ++j) {
        const std::uint64_t key = open_heap::pack(base + out[a][j], nb + j);
        if (key < floor) continue;
        const child_ref c = step.tv.child(nb + j);
        if (!c.is_leaf) {
          const level_open_node node{key, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(c.block_begin),
                                     static_cast<std::uint32_t>(c.block_size)};
          if (!dive.lp) next.push_back(node);
          else if (top.block_size == 0 || key > top.key) top = node;
        } else {
          if (static_cast<index_t>(best.size()) == step.k) {
            std::pop_heap(best.begin(), best.end(), std::greater<>());
            best.pop_back();
          }
          best.push_back(key);
          std::push_heap(best.begin(), best.end(), std::greater<>());
          if (static_cast<index_t>(best.size()) == step.k) floor = std::max(floor, best.front());
        }
      }
      if (top.block_size > 0) next.push_back(top);
      for (const std::uint64_t key : best) leaves.push_back(level_leaf{i, key});
    }
  }
};

/// The host backends' runner of `tree_topk`'s softmax-node searches: an exact search level by level
/// (above), else (a beam, or an exact search whose levels outgrow its memory) the lockstep rounds.
template <class B>
struct host_tree_search {
  static constexpr bool available = true;
  template <class T, class View>
  static void run(const execution<B>& ex, const topk_search_step<false, T, View, 1>& step) {
    if (!host_level_search<B>::run(ex, step)) host_search_rounds<B>::run(ex, step);
  }
};

template <>
struct tree_search_tuning<serial> : host_tree_search<serial> {};
template <>
struct tree_search_tuning<omp> : host_tree_search<omp> {};

}  // namespace xsoftmax::detail
