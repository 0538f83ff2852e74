// SPDX-License-Identifier: Apache-2.0
#pragma once
// Running one `topk_search_step` (detail/hierarchical/tree_search.hpp) on a host backend with its
// buffers made here: the inputs of a search (`search_in`), its outputs (`search_out`, sentinels
// where the search writes nothing) and `run_search_step`, which hands the step -- of any rows a
// task -- to a runner (the generic loop, the rounds, the level search). For the tests that compare
// the host runners with the generic search.

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/hierarchical/tree_search.hpp>
#include <xsoftmax/types.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace xsoftmax_test {

/// A search's inputs: the tree, rows x d hidden values, the weights (wrows x d) and bias (used when
/// `with_bias`), the widest block, per-row start blocks (or none).
template <class View>
struct search_in {
  View tv;
  std::vector<float> h, w, b;
  xsoftmax::index_t rows, d, wrows, max_block;
  bool with_bias = false;
  const std::vector<xsoftmax::index_t>* start_begin = nullptr;
  const std::vector<xsoftmax::index_t>* start_size = nullptr;
};

/// One search's outputs.
struct search_out {
  std::vector<xsoftmax::index_t> classes, expansions;
  std::vector<float> log_probs;
  std::vector<int> overflow;
  bool taken = true;  ///< what the runner returned (a runner that may decline)
};

/// The search of `in`'s rows for k classes (beam, open lists of `capacity` entries): the outputs
/// and buffers made, then run(step_of, ex), where step_of(std::integral_constant<index_t, G>{}) is
/// the `topk_search_step` of G rows a task over them and ex the backend's execution; run's bool
/// result is the outputs' `taken`.
template <class B, class View, class Run>
search_out run_search_step(const search_in<View>& in, xsoftmax::index_t k, xsoftmax::index_t beam,
                           xsoftmax::index_t capacity, Run run) {
  using xsoftmax::index_t;
  search_out o;
  const index_t rows = in.rows;
  o.classes.assign(static_cast<size_t>(rows * k), -9);
  o.log_probs.assign(o.classes.size(), 7.f);
  o.expansions.assign(static_cast<size_t>(rows), -9);
  o.overflow.assign(static_cast<size_t>(rows), -9);
  std::vector<std::uint64_t> open(static_cast<size_t>(rows * capacity));
  std::vector<float> child(static_cast<size_t>(rows * in.max_block)), leaf(static_cast<size_t>(rows * k));
  xsoftmax::backend_resources<B> res{};
  const xsoftmax::detail::execution<B> ex{res};
  const xsoftmax::matrix_view<const float> wv(in.w.data(), in.wrows, in.d);
  const xsoftmax::matrix_view<index_t> cv(o.classes.data(), rows, k);
  const xsoftmax::matrix_view<float> lv(o.log_probs.data(), rows, k);
  const float* bias = in.with_bias ? in.b.data() : nullptr;
  const index_t* sb = in.start_begin ? in.start_begin->data() : nullptr;
  const index_t* ss = in.start_size ? in.start_size->data() : nullptr;
  const auto step_of = [&](auto g) {
    return xsoftmax::detail::topk_search_step<false, float, View, decltype(g)::value>{
        in.tv, in.h.data(), in.d, wv, bias, k, beam, capacity, in.max_block, 0, rows, open.data(), child.data(),
        leaf.data(), cv, lv, o.overflow.data(), sb, ss, o.expansions.data()};
  };
  o.taken = run(step_of, ex);
  return o;
}

/// `run_search_step`'s runner of the generic search: 16 rows a task, on the execution's threads.
struct generic_search {
  template <class StepOf, class Ex>
  bool operator()(const StepOf& step_of, const Ex& ex) const {
    constexpr xsoftmax::index_t G = 16;
    xsoftmax::detail::parallel_for(ex, (step_of(std::integral_constant<xsoftmax::index_t, G>{}).n + G - 1) / G,
                                   step_of(std::integral_constant<xsoftmax::index_t, G>{}));
    return true;
  }
};

}  // namespace xsoftmax_test
