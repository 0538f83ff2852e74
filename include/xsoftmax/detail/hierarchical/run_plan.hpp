// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Planning a hierarchical-softmax step, on every backend: the packed rows sorted once by their
/// target's leaf rank (below any node the samples are then one contiguous run at every level),
/// each row's path step at a level, and the runs of rows that share a node, level by level, with
/// the sparse-gradient rows each run's block gets. Only the batch's deepest path length and the
/// run list come back to the host (they decide the levels, the launches and the gradient's shape).

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/tree/tree_types.hpp>

#include <thrust/functional.h>
#include <thrust/gather.h>
#include <thrust/iterator/constant_iterator.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform_reduce.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/tuple.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace xsoftmax::detail {

/// A run of sorted rows that share one node at one level, and where its gradient rows go.
struct node_run {
  int level = 0;
  index_t begin = 0, end = 0;              ///< sorted rows [begin, end)
  index_t block_begin = 0, block_size = 0;  ///< the node's block of child rows
  index_t grad_offset = 0;                  ///< first row of this run's block in the sparse gradient
  index_t scratch_offset = 0;               ///< first value of the run in its level's gather scratch
};

/// The allocator of a plan's run list: blocks from the host working-memory cache (`host_block_cache`:
/// no page faults from one step to the next), and `resize` leaves the new runs unwritten -- the
/// host planning writes every run before any is read (`plan_host_runs_by`). Value-initialised, they
/// were a memset on the calling thread while the other threads waited: ~1 % of a 2-thread
/// binary-Huffman step's perf samples at 50K classes, d = 100 (2,743 runs; bench/RESULTS.md, issue 30).
template <class T>
struct run_list_allocator {
  using value_type = T;
  run_list_allocator() = default;
  template <class U>
  run_list_allocator(const run_list_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(host_block_cache::take(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { host_block_cache::give(p, n * sizeof(T)); }
  template <class U>
  void construct(U*) noexcept {}  // resize: left for the planning to write
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const run_list_allocator&, const run_list_allocator&) { return true; }
  friend bool operator!=(const run_list_allocator&, const run_list_allocator&) { return false; }
};

/// A plan's run list (see `run_list_allocator`; `resize` leaves new runs unwritten).
using node_run_list = std::vector<node_run, run_list_allocator<node_run>>;

/// The runs of a step, level by level: level l's runs are runs[level_first[l], level_first[l + 1]).
struct run_plan {
  node_run_list runs;
  std::vector<std::size_t> level_first{0};
  index_t grad_rows = 0;      ///< rows of the sparse weight gradient
  index_t gather_values = 0;  ///< the largest level's gather scratch (values)
  [[nodiscard]] std::size_t levels() const { return level_first.size() - 1; }
};

/// key[r] = leaf_rank(target[r]).
template <class View>
struct leaf_rank_of {
  View tv;
  const index_t* target;
  index_t* key;
  XSOFTMAX_HD void operator()(index_t r) const { key[r] = tv.leaf_rank(target[r]); }
};

/// A path-row key's node block (its first row; blocks of two rows start at even rows) and the child
/// it takes. A negative key (the path ended above: -1 - level) stays negative, and equal to every
/// other ended path's of its level.
struct path_rows {
  XSOFTMAX_HD static index_t block(index_t key) { return key & ~index_t(1); }
  XSOFTMAX_HD static index_t child(index_t key) { return key & 1; }
};

/// Row r's node at every level l < `levels`, entry i = l rows + r (levels x rows, level-major):
/// key = its block_begin, or -1 - l when r's path ended above (so that one key never spans two
/// levels: a node sits at one depth, and ended paths differ by level), its block size and the
/// child r's target takes. One task per row walking its path from the root: its target and depth
/// read once and its path's rows in order (a task per entry divided i by rows and looked the path
/// up again at every level: 26 % of a serial binary-Huffman step at 50K classes, d = 100, went to
/// that planning loop, most of it waiting on those loads; bench/RESULTS.md, issue 30).
/// *Path rows* (`block_size` and `child` null; every block of two rows at an even row, as a
/// sigmoid-node tree's): key = the path's row, block_begin + child, which holds both (`path_rows`).
template <class View>
struct all_level_steps_of {
  View tv;
  const index_t* target;
  index_t rows;
  int levels;
  index_t* key;
  index_t* block_size;  ///< null: path rows
  index_t* child;       ///< null: path rows
  index_t* path_levels = nullptr;  ///< per row, when not null: the levels its path has (< levels)
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t t = target[r];
    const int depth = tv.depth(t) < levels ? tv.depth(t) : levels;
    if (path_levels) path_levels[r] = depth;
    for (int l = 0; l < levels; ++l) put(l * rows + r, t, l, l < depth);
  }
  /// Entry i (level l of a row whose target is t): its step, or the ended-path key when !on_path.
  XSOFTMAX_HD void put(index_t i, index_t t, int l, bool on_path) const {
    if (!on_path) {
      key[i] = -1 - l;
      if (!block_size) return;  // path rows: one value an entry
      block_size[i] = 0;
      child[i] = 0;
      return;
    }
    const path_step s = tv.step(t, l);
    if (!block_size) {
      key[i] = s.block_begin + s.child;
      return;
    }
    key[i] = s.block_begin;
    block_size[i] = s.block_size;
    child[i] = s.child;
  }
};

/// The same for a host task: rows [tile_rows t, tile_rows t + tile_rows) level by level, so that a
/// level's stores fill one cache line of each array. A task per row wrote a column of the
/// level-major arrays, a line per store, the lines `rows` entries apart -- 8 KiB at 1024 rows, so
/// that every level's line fell in one L1 set and each store missed (a third of the planning's time
/// in a serial binary-Huffman step at 50K classes, d = 100; bench/RESULTS.md, issue 30).
template <class View>
struct all_level_steps_of_tile {
  static constexpr index_t tile_rows = 8;  // one 64-byte line of index_t
  all_level_steps_of<View> row;
  void operator()(index_t tile) const {
    const index_t r0 = tile * tile_rows, rest = row.rows - r0, n = rest < tile_rows ? rest : tile_rows;
    index_t target[tile_rows];
    int depth[tile_rows];
    for (index_t j = 0; j < n; ++j) {
      target[j] = row.target[r0 + j];
      depth[j] = row.tv.depth(target[j]) < row.levels ? row.tv.depth(target[j]) : row.levels;
      if (row.path_levels) row.path_levels[r0 + j] = depth[j];
    }
    for (int l = 0; l < row.levels; ++l)
      for (index_t j = 0; j < n; ++j) row.put(l * row.rows + r0 + j, target[j], l, l < depth[j]);
  }
};

/// Row r's node at `level`: key = its block_begin (-1 when r's path ended above), its block size
/// and the child r's target takes.
template <class View>
struct level_step_of {
  View tv;
  const index_t* target;
  int level;
  index_t* key;
  index_t* block_size;
  index_t* child;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t t = target[r];
    if (tv.depth(t) > level) {
      const path_step s = tv.step(t, level);
      key[r] = s.block_begin;
      block_size[r] = s.block_size;
      child[r] = s.child;
    } else {
      key[r] = -1;
      block_size[r] = 0;
      child[r] = 0;
    }
  }
};

/// word[r] = leaf_rank(target[r]) << index_bits | r: the leaf rank and the row in one unsigned word.
template <class View, class Word>
struct leaf_rank_word_of {
  View tv;
  const index_t* target;
  int index_bits;
  Word* word;
  XSOFTMAX_HD void operator()(index_t r) const {
    word[r] = static_cast<Word>(tv.leaf_rank(target[r])) << index_bits | static_cast<Word>(r);
  }
};

/// order = the rows 0..n-1 stable-sorted by their target's leaf rank, on a host backend: each rank
/// packed above its row into one `Word` (`leaf_rank_word_of`: equal ranks then order by row, so a
/// plain sort is stable) and those words radix-sorted alone. Thrust's stable_sort_by_key on 64-bit
/// keys and values makes eight digit histograms and moves both arrays: 5.6-6.7 us against 4.8-5.9
/// for 1,024 rows of 50K classes (a small gain, on the calling thread while the others wait;
/// bench/tools/leaf_rank_sort_rates.cpp, bench/RESULTS.md, issue 30).
template <class Word, class B, class View>
void sort_rows_by_packed_rank(const execution<B>& ex, const View& tv, const index_t* target, index_t n,
                              int index_bits, index_t* order) {
  scratch_vector<B, Word> words(static_cast<std::size_t>(n), ex);
  Word* w = raw(words);
  parallel_for_light(ex, n, leaf_rank_word_of<View, Word>{tv, target, index_bits, w});
  with_light_policy(ex, n, [&](auto policy) { thrust::sort(policy, words.begin(), words.end()); });
  const Word mask = (Word(1) << index_bits) - 1;
  XSOFTMAX_PARALLEL_FOR_LIGHT(ex, n, r, { order[r] = static_cast<index_t>(w[r] & mask); });
}

/// Bits of the smallest unsigned integer that holds every value below `n` (n >= 1): 0 for n = 1.
inline int bits_below(index_t n) {
  int b = 0;
  while (b < 63 && (index_t(1) << b) < n) ++b;
  return b;
}

/// `in`'s rows stable-sorted by their target's leaf rank (equal targets keep batch order), with
/// `upstream` (one value per packed row, or empty) permuted alike. The sorted hidden rows go to
/// `hidden_out` (rows x dim floats, written, never read): row r is row `src_row[i]` of `hidden`,
/// i = the packed row sorted to r (row i itself when `src_row` is null). Taking them from the
/// caller's matrix lets the step skip packing them first; `in.hidden` is not read. `hidden_out`
/// null: no rows copied (the host sigmoid step's row ranges copy their own: `range_row_copies`).
template <class B, class View, class H>
batch_rows<B> sort_by_leaf_rank(const execution<B>& ex, const View& tv, const batch_rows<B>& in,
                                scratch_vector<B, float>& upstream, matrix_view<const H> hidden,
                                const index_t* src_row, float* hidden_out) {
  const index_t n = in.rows;
  scratch_vector<B, index_t> order(static_cast<std::size_t>(n), ex);
  // A host packs rank and row into one word where they fit (`sort_rows_by_packed_rank`); a device
  // sorts the ranks with the rows as values (CUB's radix sort).
  bool sorted = false;
  if constexpr (is_host_backend<B>) {
    const int index_bits = bits_below(n > 0 ? n : 1), bits = index_bits + bits_below(tv.num_classes());
    if (bits < 32)  // < : no shift by the word's width
      sort_rows_by_packed_rank<std::uint32_t>(ex, tv, in.target_data(), n, index_bits, raw(order));
    else if (bits < 64)
      sort_rows_by_packed_rank<std::uint64_t>(ex, tv, in.target_data(), n, index_bits, raw(order));
    sorted = bits < 64;
  }
  if (!sorted) {
    scratch_vector<B, index_t> keys(static_cast<std::size_t>(n), ex);
    parallel_for_light(ex, n, leaf_rank_of<View>{tv, in.target_data(), raw(keys)});
    with_light_policy(ex, n, [&](auto policy) {
      thrust::sequence(policy, order.begin(), order.end());
      thrust::stable_sort_by_key(policy, keys.begin(), keys.end(), order.begin());
    });
  }
  batch_rows<B> out;
  out.dim = in.dim;
  out.rows = n;
  out.sample = scratch_vector<B, index_t>(static_cast<std::size_t>(n), ex);
  out.target = scratch_vector<B, index_t>(static_cast<std::size_t>(n), ex);
  scratch_vector<B, float> up(upstream.size(), ex);
  with_light_policy(ex, n, [&](auto policy) {  // light: a few operations a row
    thrust::gather(policy, order.begin(), order.end(), in.sample.begin(), out.sample.begin());
    thrust::gather(policy, order.begin(), order.end(), in.target.begin(), out.target.begin());
    if (!upstream.empty()) thrust::gather(policy, order.begin(), order.end(), upstream.begin(), up.begin());
  });
  if (!upstream.empty()) upstream.swap(up);
  if (!hidden_out) return out;
  // Row r of hidden_out = row src_row[order[r]] of `hidden` (row order[r] when src_row is null).
  const index_t* by = raw(order);
  const index_t d = hidden.cols;
  if constexpr (runs_on_device<execution<B>>) {  // a thread per element: coalesced
    XSOFTMAX_PARALLEL_FOR_2D(ex, n, d, r, p, {
      const index_t i = by[r];
      hidden_out[r * d + p] = to_float(hidden.row(src_row ? src_row[i] : i)[p]);
    });
  } else {  // a task per row, its source found once (per element, the copy took 7 % of a serial
            // binary-Huffman step at d = 100: the compiler cannot hoist it past the stores)
    XSOFTMAX_PARALLEL_FOR(ex, n, r, {
      const index_t i = by[r];
      const H* from = hidden.row(src_row ? src_row[i] : i);
      float* to = hidden_out + r * d;
      for (index_t p = 0; p < d; ++p) to[p] = to_float(from[p]);
    });
  }
  return out;
}

/// The same with the sorted rows in the returned batch's `hidden`, taken from `in.hidden`.
template <class B, class View>
batch_rows<B> sort_by_leaf_rank(const execution<B>& ex, const View& tv, const batch_rows<B>& in,
                                scratch_vector<B, float>& upstream) {
  scratch_vector<B, float> hidden(static_cast<std::size_t>(in.rows * in.dim), ex);
  batch_rows<B> out = sort_by_leaf_rank(ex, tv, in, upstream, in.hidden_view(), nullptr, raw(hidden));
  out.hidden.swap(hidden);
  return out;
}

/// Each sorted row's step at `level` (see `level_step_of`), into backend vectors of `rows` entries.
template <class B, class View>
void level_steps(const execution<B>& ex, const View& tv, const index_t* target, index_t rows, int level, index_t* key,
                 index_t* block_size, index_t* child) {
  parallel_for(ex, rows, level_step_of<View>{tv, target, level, key, block_size, child});
}

/// The depth of row r's target's path.
template <class View>
struct path_depth_of {
  View tv;
  const index_t* target;
  XSOFTMAX_HD index_t operator()(index_t r) const { return tv.depth(target[r]); }
};

/// (rows, block size) of two pieces of one run: their row counts add, their block sizes agree.
struct count_and_size {
  XSOFTMAX_HD thrust::tuple<index_t, index_t> operator()(const thrust::tuple<index_t, index_t>& a,
                                                        const thrust::tuple<index_t, index_t>& b) const {
    const index_t sa = thrust::get<1>(a), sb = thrust::get<1>(b);
    return thrust::make_tuple(thrust::get<0>(a) + thrust::get<0>(b), sa > sb ? sa : sb);
  }
};

/// Whether every class of a tree view sits at one depth, `View::depth_value` (uniform_tree).
template <class View, class = void>
struct has_fixed_depth : std::false_type {};
template <class View>
struct has_fixed_depth<View, std::void_t<decltype(View::depth_value)>> : std::true_type {};

/// The levels a step plans: the batch's deepest path (a Huffman tree's max_depth is far deeper),
/// at most `max_depth`. A tree whose classes all sit at one depth needs no look at the batch (on a
/// device, no wait for the stream).
template <class B, class View>
int planned_levels(const execution<B>& ex, const View& tv, const index_t* target, index_t rows, int max_depth) {
  if (rows == 0) return 0;
  if constexpr (has_fixed_depth<View>::value) return View::depth_value < max_depth ? View::depth_value : max_depth;
  const thrust::counting_iterator<index_t> first(0);
  count_host_read();  // the deepest path decides the levels
  const index_t deepest = with_light_policy(ex, rows, [&](auto policy) {
    return thrust::transform_reduce(policy, first, first + rows, path_depth_of<View>{tv, target}, index_t(0),
                                    thrust::maximum<index_t>());
  });
  return deepest < max_depth ? static_cast<int>(deepest) : max_depth;
}

/// One level's runs from its entries' keys (`all_level_steps_of`), for a host task: a run starts
/// where the key's block (`block_of(key)`: the key itself, or `path_rows::block`) changes; entries
/// with a negative key (paths ended above) belong to no run. `on_run(begin, end, block)` is called
/// for every run in row order.
template <class BlockOf, class OnRun>
void scan_level_runs(const index_t* key, index_t rows, BlockOf block_of, OnRun on_run) {
  for (index_t begin = 0; begin < rows;) {
    const index_t k = block_of(key[begin]);
    index_t end = begin + 1;
    while (end < rows && block_of(key[end]) == k) ++end;
    if (k >= 0) on_run(begin, end, k);
    begin = end;
  }
}

/// `plan_host_runs` with a key's block (`block_of(key)`) and an entry's block size (`size_at(e)`).
template <class B, class GatherWidth, class BlockOf, class SizeAt>
void plan_host_runs_by(const execution<B>& ex, const index_t* key, index_t rows, int levels, bool sigmoid,
                       GatherWidth gather_width, run_plan& plan, BlockOf block_of, SizeAt size_at) {
  struct level_totals {
    index_t runs = 0, grad_rows = 0, scratch = 0;
  };
  std::vector<level_totals> totals(static_cast<std::size_t>(levels));
  const auto run_at = [&](int l, index_t begin, index_t end, index_t block) {
    return node_run{l, begin, end, block, size_at(l * rows + begin), 0, 0};
  };
  parallel_for_uneven(ex, levels, [&](index_t l) {
    level_totals t;
    scan_level_runs(key + l * rows, rows, block_of, [&](index_t begin, index_t end, index_t block) {
      const node_run run = run_at(static_cast<int>(l), begin, end, block);
      ++t.runs;
      t.grad_rows += sigmoid ? 1 : run.block_size;
      t.scratch += (end - begin) * gather_width(run);
    });
    totals[static_cast<std::size_t>(l)] = t;
  });
  std::vector<level_totals> first(static_cast<std::size_t>(levels));  // each level's offsets
  level_totals sum;
  for (int l = 0; l < levels; ++l) {
    first[static_cast<std::size_t>(l)] = sum;
    const level_totals& t = totals[static_cast<std::size_t>(l)];
    sum.runs += t.runs;
    sum.grad_rows += t.grad_rows;
    plan.gather_values = t.scratch > plan.gather_values ? t.scratch : plan.gather_values;
    plan.level_first.push_back(static_cast<std::size_t>(sum.runs));
  }
  plan.grad_rows = sum.grad_rows;
  plan.runs.resize(static_cast<std::size_t>(sum.runs));  // unwritten (`run_list_allocator`): every run is below
  node_run* out = plan.runs.data();
  parallel_for_uneven(ex, levels, [&](index_t l) {
    const level_totals& at = first[static_cast<std::size_t>(l)];
    index_t i = at.runs, grad = at.grad_rows, scratch = 0;  // scratch offsets restart at every level
    scan_level_runs(key + l * rows, rows, block_of, [&](index_t begin, index_t end, index_t block) {
      node_run run = run_at(static_cast<int>(l), begin, end, block);
      run.grad_offset = grad;
      run.scratch_offset = scratch;
      grad += sigmoid ? 1 : run.block_size;
      scratch += (end - begin) * gather_width(run);
      out[i++] = run;
    });
  });
}

/// The plan's runs from the entries' keys and block sizes (level-major, `levels` x `rows`), on a host
/// backend: levels in parallel, each scanned twice -- its runs, gradient rows and scratch values
/// counted, then, at the offsets the counts give, its runs written in place. The generic form
/// (`plan_runs_by_reduce`: one `reduce_by_key` over every entry, the runs copied back and laid out by
/// one loop on the calling thread) kept the other threads waiting: 18 % of the calling thread's time
/// in a 2-thread binary-Huffman step at 50K classes, d = 100 (bench/RESULTS.md, issue 30). The same
/// plan, run for run (`run_plan_test` compares them). `block_size` null: the keys are path rows
/// (`all_level_steps_of`), every block two rows.
template <class B, class GatherWidth>
void plan_host_runs(const execution<B>& ex, const index_t* key, const index_t* block_size, index_t rows, int levels,
                    bool sigmoid, GatherWidth gather_width, run_plan& plan) {
  if (!block_size) {
    plan_host_runs_by(
        ex, key, rows, levels, sigmoid, gather_width, plan, [](index_t k) { return path_rows::block(k); },
        [](index_t) -> index_t { return 2; });
    return;
  }
  plan_host_runs_by(
      ex, key, rows, levels, sigmoid, gather_width, plan, [](index_t k) { return k; },
      [=](index_t e) { return block_size[e]; });
}

/// out[3 i + 0, 1, 2] = a[i], b[i], c[i].
struct interleave3 {
  const index_t *a, *b, *c;
  index_t* out;
  XSOFTMAX_HD void operator()(index_t i) const { out[3 * i] = a[i], out[3 * i + 1] = b[i], out[3 * i + 2] = c[i]; }
};

/// `plan_runs`'s run list by one `reduce_by_key` over every level's entries (keys never repeat across
/// a level boundary, see `all_level_steps_of`): the runs' keys, row counts and block sizes come back
/// to the host, which lays them out. The device form, and the host form's oracle.
template <class B, class GatherWidth>
void plan_runs_by_reduce(const execution<B>& ex, const index_t* key, const index_t* block_size, index_t rows,
                         int levels, bool sigmoid, GatherWidth gather_width, run_plan& plan) {
  const auto policy = ex.policy();
  const index_t entries = rows * levels;
  const std::size_t n = static_cast<std::size_t>(entries);
  scratch_buffer<B, index_t> run_key_buf(n, ex), run_count_buf(n, ex), run_size_buf(n, ex);
  index_t *run_key = run_key_buf.data(), *run_count = run_count_buf.data(), *run_size = run_size_buf.data();
  // One pass: each run's row count and block size (equal within a run: their maximum). The number of
  // runs comes back to the host.
  count_host_read();
  const auto ends = thrust::reduce_by_key(
      policy, key, key + entries,
      thrust::make_zip_iterator(thrust::make_tuple(thrust::constant_iterator<index_t>(1), block_size)), run_key,
      thrust::make_zip_iterator(thrust::make_tuple(run_count, run_size)), thrust::equal_to<index_t>(), count_and_size{});
  const index_t runs = static_cast<index_t>(ends.first - run_key);
  // The three lists side by side (key, count, size a run), then one copy to the host: one wait for
  // the stream where three copies waited three times.
  scratch_buffer<B, index_t> packed(3 * static_cast<std::size_t>(runs), ex);
  parallel_for(ex, runs, interleave3{run_key, run_count, run_size, packed.data()});
  const std::unique_ptr<index_t[]> host(new index_t[3 * static_cast<std::size_t>(runs)]);
  execution<B>::ops::copy(ex.res, host.get(), packed.data(), 3 * runs);
  const auto keys = [&](index_t i) { return host[static_cast<std::size_t>(3 * i)]; };
  const auto counts = [&](index_t i) { return host[static_cast<std::size_t>(3 * i + 1)]; };
  const auto sizes = [&](index_t i) { return host[static_cast<std::size_t>(3 * i + 2)]; };
  // position: entry of the run's first row (level-major); level l's entries start at level_begin.
  // Tracked, not divided out: a 64-bit division per run was 2 % of a serial binary-Huffman step.
  index_t position = 0, scratch = 0, level_begin = 0;
  int l = 0;
  plan.runs.reserve(static_cast<std::size_t>(runs));
  for (index_t i = 0; i < runs; ++i) {
    if (keys(i) >= 0) {
      const index_t begin = position - level_begin;
      node_run run{l, begin, begin + counts(i), keys(i), sizes(i), plan.grad_rows, scratch};
      scratch += counts(i) * gather_width(run);
      plan.runs.push_back(run);
      plan.grad_rows += sigmoid ? 1 : sizes(i);
    }
    position += counts(i);
    if (position == level_begin + rows) {  // level l ends here (no run spans two): offsets restart
      level_begin = position;
      ++l;
      plan.level_first.push_back(plan.runs.size());
      plan.gather_values = scratch > plan.gather_values ? scratch : plan.gather_values;
      scratch = 0;
    }
  }
}

/// The runs of sorted rows sharing a node, level by level down to `levels` (see `planned_levels`),
/// and the gradient rows of each run's block (one per child row; one per node for sigmoid nodes),
/// laid out run by run, level by level. `gather_width(run)` says how many scratch values per row a
/// run needs on the gather path (0 when it takes another path); offsets restart at every level.
/// `children` (levels x rows, in the execution's memory) receives each row's child at every level
/// (level l: entries [l rows, (l + 1) rows)), which the step then reads instead of walking the
/// paths a second time; `node_keys`, when not null, alike each row's node there (its block_begin;
/// negative where the row's path ended above: `all_level_steps_of`).
///
/// Every level at once: one pass writes each (level, row)'s node; then the runs of every level, by
/// a scan of each level's entries on a host backend (`plan_host_runs`) and by one `reduce_by_key`
/// over all entries on a device (`plan_runs_by_reduce`). Level by level this was six parallel
/// regions per level on a host backend (a third of a binary tree's 2-thread step at d = 100 went
/// to starting them). `by_reduce` asks for the reduce form on a host backend too (its oracle).
///
/// `path_row_keys` (a host backend, a tree whose blocks are all two rows: sigmoid nodes): each entry
/// is one value, the row its path takes (`node_keys`, required; `children` not written, the child is
/// the key's low bit: `path_rows`). A third of the bytes of the three arrays: at 50K classes the
/// planning pass wrote 467 KB a step for 1,024 rows, 12 % of a 2-thread binary-Huffman step
/// (bench/RESULTS.md, issue 30). `path_levels` (rows values, the execution's memory), when not null,
/// receives each row's count of planned levels on its path -- its pair count (`level_entries`).
template <class B, class View, class GatherWidth>
run_plan plan_runs(const execution<B>& ex, const View& tv, const index_t* target, index_t rows, int levels,
                   bool sigmoid, GatherWidth gather_width, index_t* children, index_t* node_keys = nullptr,
                   bool by_reduce = false, bool path_row_keys = false, index_t* path_levels = nullptr) {
  run_plan plan;
  if (rows == 0 || levels == 0) return plan;
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(levels);
  expects(!path_row_keys || (is_host_backend<B> && node_keys && !by_reduce),
          "plan_runs: path-row keys are a host plan's, into node_keys (an internal error)");
  // Working arrays, each written before it is read (no zero-fill): raw pointers, which the policy
  // places in the backend's memory.
  scratch_buffer<B, index_t> key_buf(node_keys ? 0 : n, ex), size_buf(path_row_keys ? 0 : n, ex);
  index_t *key = node_keys ? node_keys : key_buf.data(), *block_size = path_row_keys ? nullptr : size_buf.data();
  const all_level_steps_of<View> steps{tv, target, rows, levels, key, block_size, path_row_keys ? nullptr : children,
                                       path_levels};
  if constexpr (is_host_backend<B>) {
    constexpr index_t tile = all_level_steps_of_tile<View>::tile_rows;
    parallel_for(ex, (rows + tile - 1) / tile, all_level_steps_of_tile<View>{steps});
    if (!by_reduce) {
      plan_host_runs(ex, key, block_size, rows, levels, sigmoid, gather_width, plan);
      return plan;
    }
  } else {  // a thread per row: a warp's stores at one level are consecutive
    parallel_for(ex, rows, steps);
  }
  plan_runs_by_reduce(ex, key, block_size, rows, levels, sigmoid, gather_width, plan);
  return plan;
}

/// The same, planning `planned_levels(..., max_depth)` levels into `children` (resized to fit).
template <class B, class View, class GatherWidth>
run_plan plan_runs(const execution<B>& ex, const View& tv, const index_t* target, index_t rows, int max_depth,
                   bool sigmoid, GatherWidth gather_width, backend_vector<B, index_t>& children) {
  const int levels = planned_levels(ex, tv, target, rows, max_depth);
  children.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(levels));
  return plan_runs(ex, tv, target, rows, levels, sigmoid, gather_width, raw(children));
}

/// The sparse gradient's row ids of `plan` into `out` (plan.grad_rows entries, the execution's
/// memory): each run's child rows (its node's row for sigmoid nodes) from its grad_offset on. Written
/// where they live, a task per run, from the runs' (first id, offset, count): one copy of three
/// values a run. Why: they were laid out on the host and copied whole -- on a GPU, 8.4 MB for the
/// 1M-class two-level tree's 1.05M gradient rows, from pageable memory (at ~10-25 GB/s, 0.3-0.8 ms
/// of the H200's 7.6 ms step, plus the host's 0.3-0.5 ms writing them; bench/RESULTS.md), against
/// 25 KB of run descriptors.
struct run_row_ids {
  const index_t* run;  // 3 a run: first id, gradient offset, count
  index_t* out;
  XSOFTMAX_HD void operator()(index_t r) const {
    const index_t first = run[3 * r], offset = run[3 * r + 1], count = run[3 * r + 2];
    for (index_t j = 0; j < count; ++j) out[offset + j] = first + j;
  }
};

template <class B>
void write_gradient_row_ids(const execution<B>& ex, const run_plan& plan, bool sigmoid, index_t* out) {
  const index_t runs = static_cast<index_t>(plan.runs.size());
  if (runs == 0) return;
  std::vector<index_t> host(3 * static_cast<std::size_t>(runs));
  for (index_t r = 0; r < runs; ++r) {
    const node_run& run = plan.runs[static_cast<std::size_t>(r)];
    index_t* q = host.data() + 3 * r;
    q[0] = sigmoid ? run.block_begin / 2 : run.block_begin;
    q[1] = run.grad_offset;
    q[2] = sigmoid ? 1 : run.block_size;
  }
  const scratch_vector<B, index_t> described = to_scratch(ex, host);
  parallel_for(ex, runs, run_row_ids{described.data(), out});
}

}  // namespace xsoftmax::detail
