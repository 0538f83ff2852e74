// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// log_distribution of a hierarchical softmax, on every backend: the range's paths are planned
/// once on the host (the unique nodes they pass through, and per class the offsets of its path's
/// children); then per row every such node's child log-probabilities are computed once
/// (`node_log_probs` of tree_search.hpp), and each class sums its path. Rows are processed in tiles
/// whose node log-probabilities fit a fixed budget.

#include <xsoftmax/detail/hierarchical/tree_search.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <unordered_map>
#include <vector>

namespace xsoftmax::detail {

/// The range's paths, planned on the host: the unique nodes (block, size, offset of its children
/// among all nodes' children) and, per class, the offsets of its path's children (CSR).
struct range_paths {
  std::vector<index_t> block_begin, block_size, block_offset;
  index_t children = 0;                 ///< total children of the unique nodes
  std::vector<index_t> path_ptr{0};     ///< class c - begin: path_off[path_ptr[c], path_ptr[c + 1])
  std::vector<index_t> path_off;
};

template <class View>
range_paths plan_range_paths(const View& tv, index_t class_begin, index_t class_end) {
  range_paths p;
  std::unordered_map<index_t, index_t> offset_of;  // block_begin -> offset of its children
  for (index_t c = class_begin; c < class_end; ++c) {
    for (int l = 0; l < tv.depth(c); ++l) {
      const path_step s = tv.step(c, l);
      auto it = offset_of.find(s.block_begin);
      if (it == offset_of.end()) {
        it = offset_of.emplace(s.block_begin, p.children).first;
        p.block_begin.push_back(s.block_begin);
        p.block_size.push_back(s.block_size);
        p.block_offset.push_back(p.children);
        p.children += s.block_size;
      }
      p.path_off.push_back(it->second + s.child);
    }
    p.path_ptr.push_back(static_cast<index_t>(p.path_off.size()));
  }
  return p;
}

/// Row i of a tile, node b: its children's log-probabilities into lp[i * children + offset].
template <bool Sigmoid, class T>
struct tile_node_log_probs {
  const float* h;  ///< the tile's first row
  index_t d;
  matrix_view<const T> w;
  const T* bias;
  const index_t *block_begin, *block_size, *block_offset;
  index_t blocks, children;
  float* lp;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t i = e / blocks, b = e % blocks;
    child_log_probs<Sigmoid>(h + i * d, w, bias, block_begin[b], block_size[b], lp + i * children + block_offset[b]);
  }
};

/// out(row0 + i, c) = the sum of class c's path log-probabilities (e = i * classes + c).
struct tile_path_sums {
  const float* lp;
  const index_t *path_ptr, *path_off;
  index_t classes, children, row0;
  matrix_view<float> out;
  XSOFTMAX_HD void operator()(index_t e) const {
    const index_t i = e / classes, c = e % classes;
    float total = 0.f;
    for (index_t q = path_ptr[c]; q < path_ptr[c + 1]; ++q) total += lp[i * children + path_off[q]];
    out(row0 + i, c) = total;
  }
};

/// log p(c | row) for c in [class_begin, class_end), every row of `h`, into `out` (rows x range).
/// `host_view` is the tree's view in host memory: the plan carries every tree fact the loops need.
template <bool Sigmoid, class B, class T, class HostView>
void tree_log_distribution(const execution<B>& ex, const HostView& host_view, matrix_view<const float> h,
                           matrix_view<const T> w, const T* bias, index_t class_begin, index_t class_end,
                           matrix_view<float> out) {
  const index_t rows = h.rows, classes = class_end - class_begin, d = h.cols;
  if (rows == 0 || classes == 0) return;
  const range_paths p = plan_range_paths(host_view, class_begin, class_end);
  // The plan's five lists go to the execution's memory in one copy (on a device one transfer, not
  // five), and they and the tiles' log-probabilities are the call's working memory (scratch:
  // written before they are read; on a device no cudaMalloc, fill or synchronising cudaFree).
  scratch_lists<B, index_t, index_t, index_t, index_t, index_t> uploaded(ex, p.block_begin, p.block_size,
                                                                         p.block_offset, p.path_ptr, p.path_off);
  const index_t* bb = uploaded.template list<0>();
  const index_t* bs = uploaded.template list<1>();
  const index_t* bo = uploaded.template list<2>();
  const index_t* pp = uploaded.template list<3>();
  const index_t* po = uploaded.template list<4>();
  const index_t blocks = static_cast<index_t>(p.block_begin.size());
  const index_t tile = std::clamp<index_t>(
      static_cast<index_t>(tree_search_budget_bytes / (sizeof(float) * static_cast<std::size_t>(std::max<index_t>(p.children, 1)))),
      1, rows);
  scratch_buffer<B, float> lp(static_cast<std::size_t>(tile * p.children), ex);
  for (index_t row0 = 0; row0 < rows; row0 += tile) {
    const index_t n = std::min(tile, rows - row0);
    parallel_for(ex, n * blocks,
                 tile_node_log_probs<Sigmoid, T>{h.data + row0 * d, d, w, bias, bb, bs, bo, blocks, p.children,
                                                 raw(lp)});
    parallel_for(ex, n * classes, tile_path_sums{raw(lp), pp, po, classes, p.children, row0, out});
  }
}

}  // namespace xsoftmax::detail
