// SPDX-License-Identifier: Apache-2.0
// The hierarchical softmax's tuned CUDA paths against their oracles, the generic primitives on the
// same backend and the same planned runs: the warp-per-sample gather path
// (detail/cuda/hs_gather_tuned.cuh) against gather_runs_generic, both node forms; the grouped GEMM
// path (detail/cuda/hs_grouped_tuned.cuh) against dense_runs_generic. Every level of the tree:
// loss, grad_h, the weight and bias gradient rows, within the storage type's tolerance.

#include "support.cuh"

#include <xsoftmax/detail/hierarchical/run_plan.hpp>

namespace xs = xsoftmax;

namespace {

using namespace xsoftmax_cuda_test;

enum class path { gather, dense };

/// Plans a random batch over `Tree` as the head does, then solves every level both ways.
template <class Tree, class T, bool Sigmoid>
void tuned_equals_generic(path which, index_t rows, index_t d, bool with_bias, unsigned seed) {
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
    // A skewed target mix: long runs at the top levels, short ones below.
    t[r] = r % 3 == 0 ? index_t(g() % 4) : static_cast<index_t>(g() % n_cls);
    sample[r] = r;
  }
  const xs::cuda_resources res;
  const xs::detail::execution<xs::cuda> ex{res};
  xs::detail::batch_rows<xs::cuda> packed;
  packed.dim = d;
  packed.rows = rows;
  packed.sample = to_device(sample);
  packed.target = to_device(t);
  packed.hidden = to_device(h);
  thrust::device_vector<float> upstream = to_device(up);
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
          gb(static_cast<std::size_t>(plan.grad_rows), 0.f), scratch(static_cast<std::size_t>(plan.gather_values) + 1);
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
        else xs::detail::gather_runs_generic<Sigmoid>(ex, a, runs);
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
}

TEST_CASE("cuda hierarchical_softmax: the grouped GEMM path equals the generic dense runs (its oracle)") {
  static_assert(xs::detail::dense_runs_tuning<xs::cuda, float>::available);
  tuned_equals_generic<xs::uniform_tree<2, 32>, float, false>(path::dense, 600, 40, true, 5);
  tuned_equals_generic<xs::uniform_tree<3, 8>, float, false>(path::dense, 400, 17, false, 6);
  tuned_equals_generic<xs::uniform_tree<3, 8>, __nv_bfloat16, false>(path::dense, 400, 64, true, 7);
  tuned_equals_generic<xs::uniform_tree<2, 32>, __half, false>(path::dense, 300, 48, true, 8);
}
