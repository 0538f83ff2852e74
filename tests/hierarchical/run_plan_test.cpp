// SPDX-License-Identifier: Apache-2.0
// The hierarchical softmax's run plan (detail/hierarchical/run_plan.hpp): on a host backend the
// runs come from a scan of each level's entries, levels in parallel (`plan_host_runs`); the device
// form, one reduce_by_key over every entry (`plan_runs_by_reduce`), is its oracle. Both must give
// the same plan, run for run, with the same gradient and scratch offsets, on trees whose paths end
// at different depths (Huffman trees of several arities) and batches of one row to many; and on
// binary trees the one-value layout (path-row keys) too.

#include "support/reference.hpp"
#include "support/test_memory.hpp"

#include <xsoftmax/detail/hierarchical/run_plan.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>  // the host backends' backend_ops
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#if XSOFTMAX_TEST_HOST_BUILD

namespace {

using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

void check_same_run(const xd::node_run& a, const xd::node_run& b) {
  CHECK(a.level == b.level);
  CHECK(a.begin == b.begin);
  CHECK(a.end == b.end);
  CHECK(a.block_begin == b.block_begin);
  CHECK(a.block_size == b.block_size);
  CHECK(a.grad_offset == b.grad_offset);
  CHECK(a.scratch_offset == b.scratch_offset);
}

TEST_CASE_TEMPLATE("run plan: the host scan equals the reduce_by_key plan, run for run", B, XSOFTMAX_TEST_BACKENDS) {
  xsoftmax_test::test_rng rng(43);
  const xsoftmax::host_resources res;
  const xd::execution<B> ex{res};
  for (const int arity : {2, 3, 5}) {
    const auto counts = xsoftmax_test::zipf_counts(rng, 400);
    const auto tree = xsoftmax::runtime_tree<>::huffman(counts, arity);
    const auto tv = tree.view();
    const bool sigmoid = arity == 2;
    for (const index_t rows : {index_t(1), index_t(2), index_t(9), index_t(700)}) {
      std::vector<index_t> target(static_cast<std::size_t>(rows));
      for (index_t r = 0; r < rows; ++r)  // skewed: many rows share the first classes' paths
        target[static_cast<std::size_t>(r)] = r % 3 == 0 ? rng.integer(0, 3) : rng.integer(0, tree.num_classes() - 1);
      std::sort(target.begin(), target.end(), [&](index_t x, index_t y) { return tv.leaf_rank(x) < tv.leaf_rank(y); });
      const int levels = xd::planned_levels(ex, tv, target.data(), rows, tree.max_depth);
      // A width that differs from run to run (0 for some), so that the scratch offsets are tested.
      const auto width = [](const xd::node_run& run) -> index_t {
        return run.end - run.begin >= 5 ? 0 : run.block_size + run.level;
      };
      const std::size_t entries = static_cast<std::size_t>(rows) * static_cast<std::size_t>(levels);
      std::vector<index_t> children_scan(entries, -7), keys_scan(entries, -7), children_reduce(entries, -9),
          keys_reduce(entries, -9);
      const xd::run_plan scan =
          xd::plan_runs(ex, tv, target.data(), rows, levels, sigmoid, width, children_scan.data(), keys_scan.data());
      const xd::run_plan reduce = xd::plan_runs(ex, tv, target.data(), rows, levels, sigmoid, width,
                                                children_reduce.data(), keys_reduce.data(), true);
      INFO("arity ", arity, ", rows ", rows, ", levels ", levels);
      REQUIRE(levels > 0);
      CHECK(children_scan == children_reduce);
      CHECK(keys_scan == keys_reduce);
      CHECK(scan.level_first == reduce.level_first);
      CHECK(scan.levels() == static_cast<std::size_t>(levels));
      CHECK(scan.grad_rows == reduce.grad_rows);
      CHECK(scan.gather_values == reduce.gather_values);
      REQUIRE(scan.runs.size() == reduce.runs.size());
      for (std::size_t i = 0; i < scan.runs.size(); ++i) check_same_run(scan.runs[i], reduce.runs[i]);
      if (sigmoid) {  // path-row keys (one value an entry): the same plan, keys = block + child
        std::vector<index_t> path_keys(entries, -5);
        const xd::run_plan one = xd::plan_runs(ex, tv, target.data(), rows, levels, true, width, nullptr,
                                               path_keys.data(), false, true);
        CHECK(one.level_first == reduce.level_first);
        CHECK(one.grad_rows == reduce.grad_rows);
        CHECK(one.gather_values == reduce.gather_values);
        REQUIRE(one.runs.size() == reduce.runs.size());
        for (std::size_t i = 0; i < one.runs.size(); ++i) check_same_run(one.runs[i], reduce.runs[i]);
        for (std::size_t e = 0; e < entries; ++e) {
          if (keys_reduce[e] >= 0) {
            CHECK(path_keys[e] == keys_reduce[e] + children_reduce[e]);
            CHECK(xd::path_rows::block(path_keys[e]) == keys_reduce[e]);
            CHECK(xd::path_rows::child(path_keys[e]) == children_reduce[e]);
          } else {
            CHECK(path_keys[e] == keys_reduce[e]);
          }
        }
        // Not for a device or the reduce form: an internal error, before any work.
        CHECK_THROWS_AS(xd::plan_runs(ex, tv, target.data(), rows, levels, true, width, nullptr, path_keys.data(), true,
                                      true),
                        std::invalid_argument);
      }
      // The plan is not trivial: every row has a level-0 run and some paths end above the deepest.
      CHECK(scan.runs.front().begin == 0);
      if (rows >= 9) CHECK(std::count_if(keys_scan.begin(), keys_scan.end(), [](index_t k) { return k < 0; }) > 0);
      // Its runs cover each level's rows on a path exactly once, in row order.
      for (int l = 0; l < levels; ++l) {
        index_t covered = 0, on_path = 0, last_end = 0;
        for (std::size_t i = scan.level_first[static_cast<std::size_t>(l)]; i < scan.level_first[static_cast<std::size_t>(l) + 1]; ++i) {
          const xd::node_run& run = scan.runs[i];
          CHECK(run.level == l);
          CHECK(run.begin >= last_end);
          CHECK(run.end > run.begin);
          covered += run.end - run.begin;
          last_end = run.end;
        }
        for (index_t r = 0; r < rows; ++r) on_path += keys_scan[static_cast<std::size_t>(l * rows + r)] >= 0 ? 1 : 0;
        CHECK(covered == on_path);
      }
    }
  }
}

/// What `sort_by_leaf_rank` reads of a tree view, for any class count: a scrambled leaf order.
struct scrambled_leaves {
  index_t classes;
  [[nodiscard]] index_t num_classes() const { return classes; }
  [[nodiscard]] index_t leaf_rank(index_t c) const {
    return static_cast<index_t>(static_cast<unsigned long long>(c) * 2654435761ull %
                                static_cast<unsigned long long>(classes));
  }
};

// On a host the rank and the row are packed into one 32- or 64-bit word and sorted alone; too wide
// for 64 bits, the ranks are sorted with the rows as values. Every width: a stable sort.
TEST_CASE_TEMPLATE("run plan: rows sorted by leaf rank, stably, at every key width", B, XSOFTMAX_TEST_BACKENDS) {
  xsoftmax_test::test_rng rng(45);
  const xsoftmax::host_resources res;
  const xd::execution<B> ex{res};
  for (const index_t classes : {index_t(1), index_t(2), index_t(300), index_t(1) << 20, index_t(1) << 40, index_t(1) << 62})
    for (const index_t rows : {index_t(1), index_t(5), index_t(1000), index_t(5000)}) {
      INFO("classes " << classes << ", rows " << rows);
      const scrambled_leaves view{classes};
      xd::batch_rows<B> packed;
      packed.dim = 2;
      packed.rows = rows;
      packed.sample = xd::scratch_vector<B, index_t>(static_cast<std::size_t>(rows), ex);
      packed.target = xd::scratch_vector<B, index_t>(static_cast<std::size_t>(rows), ex);
      packed.hidden = xd::scratch_vector<B, float>(static_cast<std::size_t>(2 * rows), ex);
      xd::scratch_vector<B, float> upstream(static_cast<std::size_t>(rows), ex);
      const index_t distinct = classes < 37 ? classes : 37;  // many equal ranks: stability shows
      for (index_t r = 0; r < rows; ++r) {
        packed.sample.data()[r] = 3 * r + 1;
        packed.target.data()[r] = rng.integer(0, distinct - 1);
        packed.hidden.data()[2 * r] = static_cast<float>(r);
        packed.hidden.data()[2 * r + 1] = -static_cast<float>(r);
        upstream.data()[r] = 0.5f * static_cast<float>(r);
      }
      std::vector<index_t> expected(static_cast<std::size_t>(rows));
      for (index_t r = 0; r < rows; ++r) expected[static_cast<std::size_t>(r)] = r;
      std::stable_sort(expected.begin(), expected.end(), [&](index_t x, index_t y) {
        return view.leaf_rank(packed.target.data()[x]) < view.leaf_rank(packed.target.data()[y]);
      });
      const xd::batch_rows<B> sorted = xd::sort_by_leaf_rank(ex, view, packed, upstream);
      REQUIRE(sorted.rows == rows);
      bool same = true;
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = expected[static_cast<std::size_t>(r)];
        same = same && sorted.sample.data()[r] == 3 * i + 1 && sorted.target.data()[r] == packed.target.data()[i] &&
               upstream.data()[r] == 0.5f * static_cast<float>(i) && sorted.hidden.data()[2 * r] == static_cast<float>(i) &&
               sorted.hidden.data()[2 * r + 1] == -static_cast<float>(i);
      }
      CHECK(same);
    }
}

}  // namespace

#endif  // XSOFTMAX_TEST_HOST_BUILD
