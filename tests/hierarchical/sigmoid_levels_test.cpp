// SPDX-License-Identifier: Apache-2.0
// The sigmoid hierarchical softmax's all-level step (detail/hierarchical/sigmoid_levels.hpp): its
// task list covers every (run, row) pair once, slicing exactly the long runs; and the step over
// every level at once gives the same bits as the same function called one level at a time (how the
// cuda backend's level-by-level tuned path is checked against it), with and without gradients.

#include "support/float_bits.hpp"
#include "support/reference.hpp"
#include "support/test_memory.hpp"

#include <xsoftmax/detail/hierarchical/sigmoid_levels.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>  // the host backends' backend_ops
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if XSOFTMAX_TEST_HOST_BUILD

namespace {

using xsoftmax::index_t;
namespace xd = xsoftmax::detail;
using xsoftmax_test::bits;

TEST_CASE("sigmoid levels: the task list covers every run's rows once and slices the long runs") {
  xsoftmax_test::test_rng rng(41);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<xd::node_run> runs;
    index_t row = 0;
    const index_t count = rng.integer(0, 60);
    for (index_t k = 0; k < count; ++k) {
      const index_t len = rng.coin(0.1) ? rng.integer(xd::run_parallel_inside, 3 * xd::run_parallel_inside)
                                        : rng.integer(1, 40);
      runs.push_back(xd::node_run{0, row, row + len, 2 * k, 2, k, 0});
      row += len;
    }
    const index_t pairs = rng.integer(1, 300);
    std::vector<xd::node_run> long_runs;
    const auto tasks = xd::sigmoid_tasks(runs, pairs, long_runs);
    std::vector<int> seen(static_cast<std::size_t>(row), 0);
    std::vector<index_t> sliced;
    for (const xd::sigmoid_task& t : tasks) {
      REQUIRE(t.run_begin < t.run_end);
      if (t.row_end > t.row_begin) {  // a slice of one long run, at most `pairs` rows
        REQUIRE(t.run_end == t.run_begin + 1);
        const xd::node_run& run = runs[static_cast<std::size_t>(t.run_begin)];
        CHECK(run.end - run.begin >= xd::run_parallel_inside);
        CHECK(t.row_begin >= run.begin);
        CHECK(t.row_end <= run.end);
        CHECK(t.row_end - t.row_begin <= pairs);
        for (index_t r = t.row_begin; r < t.row_end; ++r) ++seen[static_cast<std::size_t>(r)];
        if (sliced.empty() || sliced.back() != t.run_begin) sliced.push_back(t.run_begin);
      } else {
        index_t task_pairs = 0;
        for (index_t k = t.run_begin; k < t.run_end; ++k) {
          const xd::node_run& run = runs[static_cast<std::size_t>(k)];
          CHECK(run.end - run.begin < xd::run_parallel_inside);
          task_pairs += run.end - run.begin;
          for (index_t r = run.begin; r < run.end; ++r) ++seen[static_cast<std::size_t>(r)];
        }
        CHECK(task_pairs - (runs[static_cast<std::size_t>(t.run_end - 1)].end - runs[static_cast<std::size_t>(t.run_end - 1)].begin) < pairs);
      }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    REQUIRE(sliced.size() == long_runs.size());
    for (std::size_t i = 0; i < sliced.size(); ++i) CHECK(long_runs[i].begin == runs[static_cast<std::size_t>(sliced[i])].begin);
  }
}

TEST_CASE("sigmoid levels: row ranges cover the rows in order, and the runs across their bounds are found once each") {
  xsoftmax_test::test_rng rng(44);
  for (int trial = 0; trial < 200; ++trial) {
    // Runs of 1-3 levels over `rows` rows; a level's runs in row order, rows without a run between.
    const index_t rows = rng.integer(1, 300), levels = rng.integer(1, 4);
    std::vector<xd::node_run> runs;
    std::vector<std::size_t> level_first{0};
    for (index_t l = 0; l < levels; ++l) {
      for (index_t r = 0; r < rows;) {
        const index_t len = rng.integer(1, l == 0 ? rows : 40), end = r + len < rows ? r + len : rows;
        if (!rng.coin(0.2)) runs.push_back(xd::node_run{static_cast<int>(l), r, end, 2 * r, 2, 0, 0});
        r = end;
      }
      level_first.push_back(runs.size());
    }
    const index_t ranges = rng.integer(1, 12);
    const std::vector<index_t> first = xd::sigmoid_row_ranges(runs, rows, ranges);
    std::vector<index_t> pairs_per_row(static_cast<std::size_t>(rows), 0);  // the same from per-row counts
    for (const xd::node_run& run : runs)
      for (index_t r = run.begin; r < run.end; ++r) ++pairs_per_row[static_cast<std::size_t>(r)];
    CHECK(xd::sigmoid_row_ranges_by_pairs(pairs_per_row.data(), rows, ranges) == first);
    REQUIRE(first.size() >= 2);
    CHECK(first.front() == 0);
    CHECK(first.back() == rows);
    CHECK(static_cast<index_t>(first.size()) - 1 <= ranges);
    for (std::size_t j = 0; j + 1 < first.size(); ++j) CHECK(first[j] < first[j + 1]);
    const std::vector<xd::node_run> across = xd::runs_across(runs, level_first, first);
    std::vector<xd::node_run> expected;
    for (const xd::node_run& run : runs)
      if (std::any_of(first.begin(), first.end(), [&](index_t b) { return run.begin < b && b < run.end; }))
        expected.push_back(run);
    REQUIRE(across.size() == expected.size());
    for (std::size_t i = 0; i < across.size(); ++i) {
      CHECK(across[i].level == expected[i].level);
      CHECK(across[i].begin == expected[i].begin);
    }
  }
}

std::vector<std::uint32_t> all_bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](float x) { return bits(x); });
  return out;
}

struct step_outputs {
  std::vector<float> loss, grad_h, grad_w, grad_b;
};

TEST_CASE_TEMPLATE("sigmoid levels: every level at once equals one level at a time, bitwise", B, XSOFTMAX_TEST_BACKENDS) {
  xsoftmax_test::test_rng rng(42);
  const auto counts = xsoftmax_test::zipf_counts(rng, 300);
  const auto tree = xsoftmax::runtime_tree<>::huffman(counts, 2);
  const auto tv = tree.view();
  const xsoftmax::host_resources res;
  const xd::execution<B> ex{res};
  for (const index_t rows : {index_t(3), index_t(700)}) {  // 700: a root run long enough to be sliced
    const index_t d = 19, w_rows = tree.num_rows() / 2;
    std::vector<index_t> target(static_cast<std::size_t>(rows));
    for (index_t r = 0; r < rows; ++r)  // skewed: many samples share the first classes' paths
      target[static_cast<std::size_t>(r)] = r % 3 == 0 ? rng.integer(0, 3) : rng.integer(0, tree.num_classes() - 1);
    std::sort(target.begin(), target.end(), [&](index_t x, index_t y) { return tv.leaf_rank(x) < tv.leaf_rank(y); });
    const auto h = xsoftmax_test::random_floats(rng, rows * d, 1.0), w = xsoftmax_test::random_floats(rng, w_rows * d, 0.5),
               bias = xsoftmax_test::random_floats(rng, w_rows, 0.3), upstream = xsoftmax_test::random_floats(rng, rows, 1.0);
    const int levels = xd::planned_levels(ex, tv, target.data(), rows, tree.max_depth);
    std::vector<index_t> children(static_cast<std::size_t>(rows * levels)), keys(children.size());
    const xd::run_plan plan = xd::plan_runs(
        ex, tv, target.data(), rows, levels, true, [](const xd::node_run&) -> index_t { return 1; }, children.data(),
        keys.data());
    REQUIRE(plan.levels() == static_cast<std::size_t>(levels));
    // The head's host layout: one value an entry, and each row's path length (its pair count).
    std::vector<index_t> path_keys(children.size()), path_levels(static_cast<std::size_t>(rows), -1);
    const xd::run_plan path_plan = xd::plan_runs(
        ex, tv, target.data(), rows, levels, true, [](const xd::node_run&) -> index_t { return 1; }, nullptr,
        path_keys.data(), false, xsoftmax::is_host_backend<B>, path_levels.data());
    for (index_t r = 0; r < rows; ++r) {
      index_t on_path = 0;
      for (int l = 0; l < levels; ++l) on_path += keys[static_cast<std::size_t>(l * rows + r)] >= 0 ? 1 : 0;
      CHECK(path_levels[static_cast<std::size_t>(r)] == on_path);
    }
    for (const bool backward : {true, false}) {
      // unset_grad_h: every level at once into hidden gradients holding NaN, flagged unset (the
      // head's layout: each row's first level writes its term, no zero-fill).
      // copies (host): the caller's rows in reverse order and strided, copied in and out by the row
      // ranges themselves (`range_row_copies`) -- the sorted rows start as NaN, and the hidden
      // gradients come back from the caller's matrix.
      const auto solve = [&](bool all_levels, bool unset_grad_h = false, index_t ranges = 0, bool path_rows = false,
                             bool copies = false) {
        step_outputs out{std::vector<float>(static_cast<std::size_t>(rows), 0.f),
                         std::vector<float>(static_cast<std::size_t>(rows * d),
                                            unset_grad_h ? std::numeric_limits<float>::quiet_NaN() : 0.f),
                         std::vector<float>(static_cast<std::size_t>(plan.grad_rows * d), -1.f),
                         std::vector<float>(static_cast<std::size_t>(plan.grad_rows), -1.f)};
        xd::node_run_data<float> a;
        a.h = h.data();
        a.dim = d;
        a.w = xsoftmax::matrix_view<const float>(w.data(), w_rows, d);
        a.bias = bias.data();
        a.loss = out.loss.data();
        if (backward) {
          a.upstream = upstream.data();
          a.grad_h = out.grad_h.data();
          a.grad_w = out.grad_w.data();
          a.grad_b = out.grad_b.data();
        }
        std::vector<float> scratch;
        if (all_levels) {
          const bool path_layout = path_rows && xsoftmax::is_host_backend<B>;
          const xd::level_entries at{rows, 0, levels, path_layout ? path_keys.data() : keys.data(), unset_grad_h,
                                     path_layout, path_layout ? path_levels.data() : nullptr};
          scratch.resize(static_cast<std::size_t>(xd::sigmoid_levels_scratch(at, backward)));
          a.child = path_layout ? nullptr : children.data();
          a.scratch = scratch.data();
          if constexpr (xsoftmax::is_host_backend<B>) {
            if (copies) {
              const index_t h_stride = d + 2, g_stride = d + 3;
              std::vector<index_t> source(static_cast<std::size_t>(rows));
              std::vector<float> caller_h(static_cast<std::size_t>(rows * h_stride), 0.f),
                  sorted(static_cast<std::size_t>(rows * d), std::numeric_limits<float>::quiet_NaN()),
                  caller_grad(static_cast<std::size_t>(rows * g_stride), std::numeric_limits<float>::quiet_NaN());
              for (index_t r = 0; r < rows; ++r) {
                source[static_cast<std::size_t>(r)] = rows - 1 - r;
                std::copy_n(h.begin() + r * d, d, caller_h.begin() + (rows - 1 - r) * h_stride);
              }
              a.h = sorted.data();
              const xd::range_row_copies<float> io{
                  xsoftmax::matrix_view<const float>(caller_h.data(), rows, d, h_stride), source.data(), sorted.data(),
                  backward ? xsoftmax::matrix_view<float>(caller_grad.data(), rows, d, g_stride)
                           : xsoftmax::matrix_view<float>(),
                  out.grad_h.data()};
              xd::sigmoid_levels_generic(ex, a, path_layout ? path_plan.runs : plan.runs, at, ranges, io);
              if (backward)
                for (index_t r = 0; r < rows; ++r)
                  std::copy_n(caller_grad.begin() + (rows - 1 - r) * g_stride, d, out.grad_h.begin() + r * d);
              return out;
            }
          }
          xd::sigmoid_levels_generic(ex, a, path_layout ? path_plan.runs : plan.runs, at, ranges);
        } else {
          for (int lv = 0; lv < levels; ++lv) {
            const std::vector<xd::node_run> runs(plan.runs.begin() + static_cast<std::ptrdiff_t>(plan.level_first[lv]),
                                                 plan.runs.begin() + static_cast<std::ptrdiff_t>(plan.level_first[lv + 1]));
            const xd::level_entries at{rows, lv, 1, keys.data() + lv * rows};
            scratch.assign(static_cast<std::size_t>(xd::sigmoid_levels_scratch(at, backward)), 0.f);
            a.child = children.data() + lv * rows;
            a.scratch = scratch.data();
            xd::sigmoid_levels_generic(ex, a, runs, at);
          }
        }
        return out;
      };
      const step_outputs all = solve(true), one_by_one = solve(false), unset = solve(true, true);
      INFO("rows " << rows << ", backward " << backward);
      CHECK(all_bits(unset.loss) == all_bits(all.loss));
      if (backward) CHECK(all_bits(unset.grad_h) == all_bits(all.grad_h));
      CHECK(all_bits(unset.grad_w) == all_bits(all.grad_w));
      // A host backend's row ranges: one (every run inside it), or many (runs crossing one bound or
      // several, their node rows summed in pass 2): the same bits.
      for (const index_t ranges : {index_t(1), index_t(2), index_t(7), index_t(64)})
        for (const bool path_rows : {false, true}) {  // path_rows: one value an entry (host)
          INFO("ranges " << ranges << ", path-row keys " << path_rows);
          const step_outputs ranged = solve(true, true, ranges, path_rows);
          CHECK(all_bits(ranged.loss) == all_bits(all.loss));
          if (backward) CHECK(all_bits(ranged.grad_h) == all_bits(all.grad_h));
          CHECK(all_bits(ranged.grad_w) == all_bits(all.grad_w));
          CHECK(all_bits(ranged.grad_b) == all_bits(all.grad_b));
          if (xsoftmax::is_host_backend<B> && path_rows) {  // the head's host form: ranges copy their rows
            const step_outputs copied = solve(true, true, ranges, path_rows, true);
            CHECK(all_bits(copied.loss) == all_bits(all.loss));
            if (backward) CHECK(all_bits(copied.grad_h) == all_bits(all.grad_h));
            CHECK(all_bits(copied.grad_w) == all_bits(all.grad_w));
            CHECK(all_bits(copied.grad_b) == all_bits(all.grad_b));
          }
        }
#if defined(_OPENMP)
      if constexpr (std::is_same_v<B, xsoftmax::omp>) {  // one thread: the tasks in order, one pass
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        REQUIRE(xd::runs_tasks_in_order(ex));
        const step_outputs in_order = solve(true, true);
        omp_set_num_threads(threads);
        CHECK(all_bits(in_order.loss) == all_bits(all.loss));
        if (backward) CHECK(all_bits(in_order.grad_h) == all_bits(all.grad_h));
        CHECK(all_bits(in_order.grad_w) == all_bits(all.grad_w));
        CHECK(all_bits(in_order.grad_b) == all_bits(all.grad_b));
      }
#endif
      CHECK(all_bits(all.loss) == all_bits(one_by_one.loss));
      CHECK(all_bits(all.grad_h) == all_bits(one_by_one.grad_h));
      CHECK(all_bits(all.grad_w) == all_bits(one_by_one.grad_w));
      CHECK(all_bits(all.grad_b) == all_bits(one_by_one.grad_b));
      CHECK(std::all_of(all.loss.begin(), all.loss.end(), [](float x) { return x > 0.f; }));
      if (backward) CHECK(std::none_of(all.grad_b.begin(), all.grad_b.end(), [](float x) { return x == -1.f; }));
    }
  }
}

}  // namespace

#endif  // XSOFTMAX_TEST_HOST_BUILD
