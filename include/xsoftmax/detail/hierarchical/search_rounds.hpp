// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The host backends' runner of the softmax-node beam searches, and of an exact search's rows that
/// the level search (search_levels.hpp) leaves to it (`tree_search_tuning` for serial and omp; the
/// generic `topk_search_step` is its oracle): every row of a tile searches in lockstep rounds, and
/// a round's expansions run node by node. Also the expansion of one node for a group of rows that
/// both runners share (`node_child_log_probs`).
///
/// Why: a search expands nodes one row at a time, and each expansion reads the node's whole block
/// of weight rows (317 x 256 floats, 325 KB, for a 2-level tree over 1e5 classes at d = 256). An
/// exact top-10 on weights trained for 300 steps expands ~177 nodes a row there, over half of that
/// tree, each a stream from memory (18 us on one core), so the search ran at the memory's pace.
/// Rows that expand the same node in a round now do it together: the node's rows are read once and
/// scored against up to four hidden rows at a time (`dot_rows8`: 5.4 us a row-expansion; since
/// stop 46 two children a pass, `dot_grid8`: 3.0; bench/tools/search_expansion_kernels.cpp). Exact top-10 1.49-1.56 s -> 0.61-0.64 s for 512 rows,
/// beam 1 10.0-10.4 -> 5.8-6.1 ms (bench/tools/hs_search_cost.cpp at baae76d against 5dce5f1;
/// bench/RESULTS.md, "HS top-k on trained weights"; at d = 64, where the weights fit the last-level
/// cache, no change).
///
/// Exactness: each row's search is the one-row search (`topk_search_step`'s `next_node` and
/// `push_children`, in the same order); only which rows' expansions run side by side changes, and
/// a child's log-probability is `child_log_probs<false>`'s to the bit (the same dots, bias, log-sum-
/// exp and subtraction). So the results, the expansions and the overflow flags are the generic
/// search's.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace xsoftmax::detail {

/// Rows of one expansion task at most: a round's rows at one node are split into tasks of this many,
/// so that the root's round (every row at one node) spreads over the threads.
inline constexpr index_t search_round_task_rows = 32;

/// One row's search state between rounds (the generic step keeps the same in registers).
struct round_row_state {
  open_heap heap;
  index_t found, leaves, node, size, expanded;
  float base;
};

/// Log-probabilities of the children of the node whose block is [nb, nb + ns) for m hidden rows
/// (m <= search_round_task_rows): hidden row hr[a]'s into out[a][0, ns), each bitwise
/// `child_log_probs<false>`'s. Two children at a time, so that each child's weight row is read once
/// for all m rows: four hidden rows a pass (`dot_grid8<4, 2>`, each dot bitwise `dot_row8`'s: eight
/// add chains side by side, 1.9x the 4-row pass's rate at d = 256), the last m mod 4 one at a time;
/// then each row's log-sum-exp.
template <class Step>
void node_child_log_probs(const Step& step, index_t nb, index_t ns, const float* const* hr, float* const* out,
                          index_t m) {
  const index_t d = step.d, m4 = m / 4 * 4;
  index_t j = 0;
  for (; j + 2 <= ns; j += 2) {  // two children against four rows a pass (`dot_grid8<4, 2>`)
    const auto* w0 = step.w.row(nb + j);
    const decltype(w0) wj[2] = {w0, step.w.row(nb + j + 1)};
    for (index_t a = 0; a < m4; a += 4) {
      float dots[8];
      dot_grid8<4, 2>(hr + a, wj, d, dots);
      for (int q = 0; q < 4; ++q) {
        out[a + q][j] = score_of_dot(dots[2 * q], step.bias, nb + j);
        out[a + q][j + 1] = score_of_dot(dots[2 * q + 1], step.bias, nb + j + 1);
      }
    }
    for (index_t a = m4; a < m; ++a) {
      out[a][j] = score_of_dot(dot_row8(hr[a], wj[0], d), step.bias, nb + j);
      out[a][j + 1] = score_of_dot(dot_row8(hr[a], wj[1], d), step.bias, nb + j + 1);
    }
  }
  if (j < ns) {  // an odd block's last child
    const auto* wj = step.w.row(nb + j);
    const decltype(wj) wr[4] = {wj, wj, wj, wj};
    for (index_t a = 0; a < m4; a += 4) {
      float dots[4];
      dot_rows8<4>(hr + a, wr, d, dots);
      for (int q = 0; q < 4; ++q) out[a + q][j] = score_of_dot(dots[q], step.bias, nb + j);
    }
    for (index_t a = m4; a < m; ++a) out[a][j] = score_of_dot(dot_row8(hr[a], wj, d), step.bias, nb + j);
  }
  for (index_t a = 0; a < m; ++a) scores_to_child_log_probs(out[a], ns);
}

/// `node_child_log_probs` for the m tile rows `rows` of `step`: row i's into step.child_lp + i *
/// max_block.
template <class Step>
void node_child_log_probs_of_rows(const Step& step, index_t nb, index_t ns, const index_t* rows, index_t m) {
  const float* hr[search_round_task_rows] = {};
  float* out[search_round_task_rows] = {};  // initialised: GCC takes the const-pointer argument as a read of every entry
  for (index_t a = 0; a < m; ++a) {
    hr[a] = step.h + (step.row0 + rows[a]) * step.d;
    out[a] = step.child_lp + rows[a] * step.max_block;
  }
  node_child_log_probs(step, nb, ns, hr, out, m);
}

/// The runner (see the file comment). A round opens one parallel region, and the rounds last as long
/// as the longest search: a row that expands far more nodes than the others runs its tail alone,
/// a region a node.
template <class B>
struct host_search_rounds {
  static constexpr bool available = true;

  template <class T, class View>
  static void run(const execution<B>& ex, const topk_search_step<false, T, View, 1>& step) {
    const index_t n = step.n;
    if (n == 0) return;
    std::vector<round_row_state> st(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      const index_t r = step.row0 + i;
      st[i] = round_row_state{open_heap{step.open_key + i * step.capacity, 0, step.capacity}, 0, 0,
                              step.start_begin ? step.start_begin[r] : 0,
                              step.start_begin ? step.start_size[r] : step.tv.root_block_size(), 0, 0.f};
      step.overflow[i] = 0;
    }
    // A round: the live rows sorted by (node, row); tasks of up to search_round_task_rows rows at
    // one node; each task expands its rows, pushes their children and finds their next nodes.
    std::vector<std::uint64_t> order(static_cast<std::size_t>(n));
    std::vector<index_t> rows(static_cast<std::size_t>(n)), task_begin;
    std::vector<unsigned char> live(static_cast<std::size_t>(n), 1);
    index_t nlive = n;
    for (;;) {
      index_t q = 0;
      for (index_t i = 0; i < n; ++i)
        if (live[i]) order[q++] = (static_cast<std::uint64_t>(st[i].node) << 32) | static_cast<std::uint64_t>(i);
      std::sort(order.begin(), order.begin() + nlive);
      task_begin.clear();
      for (index_t a = 0; a < nlive; ++a) {
        rows[a] = static_cast<index_t>(order[a] & 0xFFFFFFFFu);
        if (a == 0 || (order[a] >> 32) != (order[a - 1] >> 32) ||
            a - task_begin.back() == search_round_task_rows)
          task_begin.push_back(a);
      }
      task_begin.push_back(nlive);
      const index_t tasks = static_cast<index_t>(task_begin.size()) - 1;
      round_row_state* s = st.data();
      unsigned char* alive = live.data();
      const index_t* tb = task_begin.data();
      const index_t* rr = rows.data();
      parallel_for_uneven(ex, tasks, [=, &step](index_t t) {
        const index_t a0 = tb[t], m = tb[t + 1] - a0;
        const index_t* tr = rr + a0;
        node_child_log_probs_of_rows(step, s[tr[0]].node, s[tr[0]].size, tr, m);
        for (index_t a = 0; a < m; ++a) {
          const index_t i = tr[a];
          round_row_state& x = s[i];
          ++x.expanded;
          if (!step.push_children(x.heap, step.child_lp + i * step.max_block, x.node, x.size, x.base,
                                  step.leaf_lp + i * step.k, x.leaves)) {
            step.overflow[i] = 1;
            alive[i] = 0;
          } else {
            alive[i] = step.next_node(x.heap, step.row0 + i, x.found, x.node, x.size, x.base) ? 1 : 0;
          }
        }
      });
      nlive = 0;
      for (index_t i = 0; i < n; ++i) nlive += live[i];
      if (nlive == 0) break;
    }
    for (index_t i = 0; i < n; ++i) step.finish_row(step.row0 + i, st[i].found, st[i].expanded);
  }
};

}  // namespace xsoftmax::detail
