// SPDX-License-Identifier: Apache-2.0
// The hierarchical softmax's tuned CUDA paths against their oracles, the generic primitives on the
// same backend and the same planned runs: the warp-per-sample gather path (block-per-sample for wide
// blocks; detail/cuda/hs_gather_tuned.cuh) against gather_runs_generic (softmax nodes) and
// sigmoid_levels_generic called one level at a time (sigmoid nodes); the grouped GEMM
// path (detail/cuda/hs_grouped_tuned.cuh) against dense_runs_generic. Every level of the tree:
// loss, grad_h, the weight and bias gradient rows, within the storage type's tolerance.

#include "support.cuh"

#include <xsoftmax/detail/hierarchical/run_plan.hpp>
#include <xsoftmax/detail/hierarchical/sigmoid_levels.hpp>

#include <algorithm>

namespace xs = xsoftmax;

namespace {

using namespace xsoftmax_cuda_test;

enum class path { gather, dense };

/// Plans a random batch over `Tree` as the head does, then solves every level both ways.
template <class Tree, class T, bool Sigmoid>
void tuned_equals_generic(path which, index_t rows, index_t d, bool with_bias, unsigned seed, bool skewed = true) {
  // Every class of the shape (a default-constructed uniform_tree has none: `g() % n_cls` below was
  // a division by zero, which the compiler turned into a trap, SIGILL on the first GPU run).
  index_t capacity = 1;
  for (int l = 0; l < Tree::max_depth; ++l) capacity *= Tree::branching;
  const Tree tree(capacity);
  const index_t n_cls = tree.num_classes(), w_rows = Sigmoid ? tree.num_rows() / 2 : tree.num_rows();
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> h(static_cast<std::size_t>(rows * d)), up(static_cast<std::size_t>(rows));
  std::vector<T> w(static_cast<std::size_t>(w_rows * d)), b(static_cast<std::size_t>(w_rows));
  std::vector<index_t> t(static_cast<std::size_t>(rows)), sample(static_cast<std::size_t>(rows));
  for (auto& x : h) x = nd(g);
  for (auto& x : w) x = xs::from_float<T>(0.3f * nd(g));
  for (auto& x : b) x = xs::from_float<T>(0.1f * nd(g));
  for (auto& x : up) x = 1.f + 0.5f * nd(g);
  for (index_t r = 0; r < rows; ++r) {
    // A skewed target mix: long runs at the top levels, short ones below (else uniform targets).
    t[r] = skewed && r % 3 == 0 ? index_t(g() % 4) : static_cast<index_t>(g() % n_cls);
    sample[r] = r;
  }
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};
  xs::detail::batch_rows<xs::cuda> packed;
  packed.dim = d;
  packed.rows = rows;
  packed.sample = to_scratch(ex, sample);
  packed.target = to_scratch(ex, t);
  packed.hidden = to_scratch(ex, h);
  auto upstream = to_scratch(ex, up);
  const auto batch = xs::detail::sort_by_leaf_rank(ex, tree.view(), packed, upstream);
  const auto width = [&](const xs::detail::node_run& run) -> index_t {
    return which == path::dense ? 0 : Sigmoid ? 1 : run.block_size;
  };
  xs::backend_vector<xs::cuda, xs::index_t> children;  // each level's child per row (unused here)
  const xs::detail::run_plan plan =
      xs::detail::plan_runs(ex, tree.view(), raw(batch.target), rows, Tree::max_depth, Sigmoid, width, children);
  REQUIRE(plan.levels() >= 2);
  const auto dw = to_device(w), db = to_device(b);
  thrust::device_vector<index_t> key(static_cast<std::size_t>(rows)), bsz(key.size()), child(key.size());

  for (std::size_t lv = 0; lv < plan.levels(); ++lv) {
    const std::vector<xs::detail::node_run> runs(plan.runs.begin() + plan.level_first[lv],
                                                 plan.runs.begin() + plan.level_first[lv + 1]);
    xs::detail::level_steps(ex, tree.view(), raw(batch.target), rows, static_cast<int>(lv), raw(key),
                            raw(bsz), raw(child));
    struct outputs {
      std::vector<float> loss, gh, gw, gb;
    };
    const auto solve = [&](bool tuned) {
      thrust::device_vector<float> loss(static_cast<std::size_t>(rows), 0.f), gh(static_cast<std::size_t>(rows * d), 0.f);
      thrust::device_vector<float> gw(static_cast<std::size_t>(plan.grad_rows * d), 0.f),
          gb(static_cast<std::size_t>(plan.grad_rows), 0.f),
          scratch(static_cast<std::size_t>(std::max(plan.gather_values, 2 * rows)) + 1);
      xs::detail::node_run_data<T> a;
      a.h = raw(batch.hidden);
      a.dim = d;
      a.w = matrix_view<const T>(raw(dw), w_rows, d);
      a.bias = with_bias ? raw(db) : nullptr;
      a.child = raw(child);
      a.upstream = raw(upstream);
      a.loss = raw(loss);
      a.grad_h = raw(gh);
      a.grad_w = raw(gw);
      a.grad_b = with_bias ? raw(gb) : nullptr;
      a.scratch = raw(scratch);
      if (which == path::gather) {
        if (tuned) xs::detail::gather_runs_tuning<xs::cuda, T, Sigmoid>::run(ex, a, runs);
        else if constexpr (Sigmoid)  // the host backends' all-level path, one level at a time
          xs::detail::sigmoid_levels_generic(ex, a, runs, xs::detail::level_entries{rows, static_cast<int>(lv), 1, raw(key)});
        else xs::detail::gather_runs_generic<false>(ex, a, runs);
      } else {
        if (tuned) xs::detail::dense_runs_tuning<xs::cuda, T>::run(ex, a, runs, xs::dense_grouping::grouped);
        else xs::detail::dense_runs_generic(ex, a, runs);
      }
      res.synchronize();
      return outputs{to_host(loss), to_host(gh), to_host(gw), to_host(gb)};
    };
    const outputs tuned = solve(true), generic = solve(false);
    const double tol = tolerance_for<T>();
    INFO("level " << lv << ", " << runs.size() << " runs");
    CHECK(relative_gap(tuned.loss, generic.loss) < tol);
    CHECK(relative_gap(tuned.gh, generic.gh) < tol);
    CHECK(relative_gap(tuned.gw, generic.gw) < tol);
    if (with_bias) CHECK(relative_gap(tuned.gb, generic.gb) < tol);
  }
}

}  // namespace

TEST_CASE("cuda hierarchical_softmax: the warp-per-sample gather path equals the generic one (its oracle)") {
  static_assert(xs::detail::gather_runs_tuning<xs::cuda, float, false>::available);
  tuned_equals_generic<xs::uniform_tree<3, 8>, float, false>(path::gather, 300, 40, true, 1);
  tuned_equals_generic<xs::uniform_tree<3, 8>, __nv_bfloat16, false>(path::gather, 200, 33, false, 2);
  tuned_equals_generic<xs::uniform_tree<9, 2>, float, true>(path::gather, 700, 24, true, 3);  // long root run
  tuned_equals_generic<xs::uniform_tree<9, 2>, __half, true>(path::gather, 90, 130, false, 4);
  // Blocks of at least gather_wide_block children: a node at a time, 16 samples a block (runs of 8
  // or more on average, rows of up to 640 values), 4 (runs of 2 or more, rows of up to 2944), else a
  // block per sample. The skewed targets give node 0 runs of several pieces.
  static_assert(100 >= xs::detail::gpu::gather_wide_block);
  static_assert(xs::detail::gpu::run_wide_shared_bytes<16>(640) <= 48 * 1024 &&
                xs::detail::gpu::run_wide_shared_bytes<16>(641) > 48 * 1024);
  static_assert(xs::detail::gpu::run_wide_shared_bytes<4>(2944) <= 48 * 1024 &&
                xs::detail::gpu::run_wide_shared_bytes<4>(2945) > 48 * 1024);
  tuned_equals_generic<xs::uniform_tree<2, 100>, float, false>(path::gather, 300, 40, true, 9);            // 4
  tuned_equals_generic<xs::uniform_tree<2, 100>, __nv_bfloat16, false>(path::gather, 1600, 72, false, 10);  // 16
  tuned_equals_generic<xs::uniform_tree<2, 100>, __nv_bfloat16, false>(path::gather, 1600, 640, true, 11);  // 16
  tuned_equals_generic<xs::uniform_tree<2, 70>, float, false>(path::gather, 300, 700, true, 12);            // 4
  tuned_equals_generic<xs::uniform_tree<2, 64>, __half, false>(path::gather, 40, 3000, false, 13);  // a sample
  tuned_equals_generic<xs::uniform_tree<2, 100>, float, false>(path::gather, 60, 48, true, 14);     // a sample
  // Uniform targets: every level-2 run (5 samples on average) is one piece, so the node-at-a-time
  // kernel writes the weight gradient itself (the root's run of many pieces leaves it to
  // gather_weight_grad_kernel).
  tuned_equals_generic<xs::uniform_tree<2, 100>, __nv_bfloat16, false>(path::gather, 500, 72, true, 15, false);
  tuned_equals_generic<xs::uniform_tree<2, 100>, float, false>(path::gather, 500, 600, false, 16, false);
}

TEST_CASE("cuda hierarchical_softmax: the grouped GEMM path equals the generic dense runs (its oracle)") {
  static_assert(xs::detail::dense_runs_tuning<xs::cuda, float>::available);
  tuned_equals_generic<xs::uniform_tree<2, 32>, float, false>(path::dense, 600, 40, true, 5);
  tuned_equals_generic<xs::uniform_tree<3, 8>, float, false>(path::dense, 400, 17, false, 6);
  tuned_equals_generic<xs::uniform_tree<3, 8>, __nv_bfloat16, false>(path::dense, 400, 64, true, 7);
  tuned_equals_generic<xs::uniform_tree<2, 32>, __half, false>(path::dense, 300, 48, true, 8);
}

namespace {

/// The block-per-row search (detail/cuda/hs_search_tuned.cuh: 8 lanes a child's dot, a warp's
/// log-sum-exp; an exact search's pushes and pops by the block) against the generic thread-per-row
/// one on the same device: classes, log-probabilities and overflow flags bit for bit, exact and
/// beam, with and without a bias, at widths with every kind of dot_row8 tail, with open lists that
/// overflow.
template <class Tree, class T>
void tuned_search_equals_generic(index_t rows, index_t d, index_t k, index_t beam, bool with_bias, unsigned seed,
                                 index_t capacity_override = 0, bool expect_overflow = false, float w_scale = 0.4f) {
  const Tree tree(Tree::branching * Tree::branching * (Tree::max_depth > 2 ? Tree::branching : 1) - 3);
  const auto tv = tree.view();
  const index_t w_rows = tree.num_rows();
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> h(static_cast<std::size_t>(rows * d));
  std::vector<T> w(static_cast<std::size_t>(w_rows * d)), b(static_cast<std::size_t>(w_rows));
  for (auto& x : h) x = nd(g);
  for (auto& x : w) x = xs::from_float<T>(w_scale * nd(g));
  for (auto& x : b) x = xs::from_float<T>(0.2f * nd(g));
  const auto dh = to_device(h);
  const auto dw = to_device(w), db = to_device(b);
  const index_t max_block = xs::detail::widest_block(tv);
  const index_t capacity =
      capacity_override > 0 ? capacity_override : beam > 0 ? beam + max_block : 1024 + 4 * (k + 1) * max_block;
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};
  struct outputs {
    std::vector<index_t> classes;
    std::vector<float> log_probs;
    std::vector<int> overflow;
  };
  const auto search = [&](bool tuned) {
    thrust::device_vector<std::uint64_t> open_key(static_cast<std::size_t>(rows * capacity));
    thrust::device_vector<float> child_lp(static_cast<std::size_t>(rows * max_block)),
        leaf_lp(static_cast<std::size_t>(rows * k)), lp(static_cast<std::size_t>(rows * k));
    thrust::device_vector<index_t> cls(static_cast<std::size_t>(rows * k));
    thrust::device_vector<int> overflow(static_cast<std::size_t>(rows), 7);
    const xs::detail::topk_search_step<false, T, decltype(tv), 1> step{
        tv, raw(dh), d, matrix_view<const T>(raw(dw), w_rows, d), with_bias ? raw(db) : nullptr, k, beam, capacity,
        max_block, 0, rows, raw(open_key), raw(child_lp), raw(leaf_lp), matrix_view<index_t>(raw(cls), rows, k),
        matrix_view<float>(raw(lp), rows, k), raw(overflow)};
    if (tuned) xs::detail::tree_search_tuning<xs::cuda>::run(ex, step);
    else xs::detail::parallel_for(ex, rows, step);
    res.synchronize();
    return outputs{to_host(cls), to_host(lp), to_host(overflow)};
  };
  const outputs tuned = search(true), generic = search(false);
  INFO("rows " << rows << ", k " << k << ", beam " << beam);
  CHECK(tuned.classes == generic.classes);
  CHECK(bitwise_equal(tuned.log_probs, generic.log_probs));
  CHECK(tuned.overflow == generic.overflow);
  CHECK((std::count(generic.overflow.begin(), generic.overflow.end(), 1) > 0) == expect_overflow);
  if (!expect_overflow)
    CHECK(std::count(generic.classes.begin(), generic.classes.end(), index_t(-1)) <
          static_cast<std::ptrdiff_t>(generic.classes.size()));
}

}  // namespace

TEST_CASE("cuda hierarchical_softmax: the block-per-row top-k search equals the generic one (its oracle)") {
  static_assert(xs::detail::tree_search_tuning<xs::cuda>::available);
  tuned_search_equals_generic<xs::uniform_tree<2, 300>, float>(70, 40, 10, 0, true, 11);  // blocks wider than a block of threads
  tuned_search_equals_generic<xs::uniform_tree<3, 9>, __nv_bfloat16>(90, 33, 5, 0, false, 12);
  tuned_search_equals_generic<xs::uniform_tree<3, 9>, float>(50, 24, 7, 4, true, 13);  // beam
  tuned_search_equals_generic<xs::uniform_tree<2, 64>, __half>(40, 64, 1, 0, true, 14);
  // Widths whose dot_row8 has a 4-wide tail and 1-3 more (47 = 5 x 8 + 4 + 3; 38 = 4 x 8 + 4 + 2),
  // blocks of 40 children (five 8-lane passes of a 256-thread block, the last one partly idle).
  tuned_search_equals_generic<xs::uniform_tree<2, 40>, float>(33, 47, 3, 0, true, 15);
  tuned_search_equals_generic<xs::uniform_tree<3, 9>, __nv_bfloat16>(20, 38, 4, 0, true, 16);
  // Exact searches whose open list overflows (the same rows as the generic heap's), and blocks of
  // 300 children (two chunks of the block's threads) with ties everywhere (zero weights, no bias).
  tuned_search_equals_generic<xs::uniform_tree<2, 64>, float>(40, 24, 10, 0, true, 17, 70, true);
  tuned_search_equals_generic<xs::uniform_tree<3, 9>, float>(40, 16, 40, 0, false, 18, 30, true);
  tuned_search_equals_generic<xs::uniform_tree<2, 300>, float>(10, 16, 10, 0, false, 19, 100000, false, 0.f);
}
