// SPDX-License-Identifier: Apache-2.0
// The class-sharded selective and KNN softmax with one rank (solo_communicator) on every backend of
// the build, in both hidden layouts: with one rank the sharded path (gather, selector on the gathered
// batch, slice of the active set, combined row statistics, returned gradients) performs the
// unsharded head's operations in the same order, so every output is bitwise the unsharded head's.
// The multi-rank tests run under mpiexec (sharded_selective_softmax_mpi.cpp).

#include "support/test_memory.hpp"

#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <thrust/host_vector.h>

#include <random>
#include <vector>

namespace {
namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::test_vector;
using solo = xs::class_sharding<xs::solo_communicator>;

template <class V>
std::vector<typename V::value_type> host_copy(const V& v) {
  const thrust::host_vector<typename V::value_type> h(v);
  return {h.begin(), h.end()};
}

constexpr index_t n = 211, d = 8, rows = 17;

struct problem {
  test_vector<float> w, b, h;
  test_vector<index_t> t;
  problem() : w(n * d), b(n), h(rows * d), t(rows) {
    std::mt19937 g(4);
    std::normal_distribution<float> nd(0.f, 0.7f);
    for (auto& x : w) x = nd(g);
    for (auto& x : b) x = 0.1f * nd(g);
    for (auto& x : h) x = nd(g);
    for (index_t i = 0; i < rows; ++i) t[i] = i % 6 == 5 ? -100 : static_cast<index_t>(g() % n);
  }
};

/// Every loss verb's outputs of `head` equal `ref`'s bitwise; `o` as given.
template <class Head, class Ref>
void same_outputs(const Head& head, const Ref& ref, const problem& p, const xs::loss_options& o) {
  test_vector<float> gh(rows * d), ref_gh(rows * d), per(rows), ref_per(rows);
  typename Head::gradient_type g;
  typename Ref::gradient_type ref_g;
  const xs::matrix_view<const float> hv(p.h.data(), rows, d);
  const xs::vector_view<const index_t> tv(p.t.data(), rows);
  const float loss = head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), rows, d), g, o,
                                           xs::vector_view<float>(per.data(), rows));
  const float ref_loss = ref.forward_backward(hv, tv, xs::matrix_view<float>(ref_gh.data(), rows, d), ref_g, o,
                                              xs::vector_view<float>(ref_per.data(), rows));
  CHECK(loss == ref_loss);
  CHECK(std::vector<float>(gh.begin(), gh.end()) == std::vector<float>(ref_gh.begin(), ref_gh.end()));
  CHECK(std::vector<float>(per.begin(), per.end()) == std::vector<float>(ref_per.begin(), ref_per.end()));
  CHECK(host_copy(g.rows) == host_copy(ref_g.rows));
  CHECK(host_copy(g.values) == host_copy(ref_g.values));
  CHECK(host_copy(g.bias_values) == host_copy(ref_g.bias_values));
  constexpr index_t k = 3;
  test_vector<index_t> c(rows * k), ref_c(rows * k);
  test_vector<float> v(rows * k), ref_v(rows * k);
  head.topk(hv, k, xs::matrix_view<index_t>(c.data(), rows, k), xs::matrix_view<float>(v.data(), rows, k));
  ref.topk(hv, k, xs::matrix_view<index_t>(ref_c.data(), rows, k), xs::matrix_view<float>(ref_v.data(), rows, k));
  CHECK(std::vector<index_t>(c.begin(), c.end()) == std::vector<index_t>(ref_c.begin(), ref_c.end()));
  CHECK(std::vector<float>(v.begin(), v.end()) == std::vector<float>(ref_v.begin(), ref_v.end()));
}

std::vector<xs::loss_options> option_sets() {
  xs::loss_options plain, terms;
  terms.reduce = xs::reduction::sum;
  terms.label_smoothing = 0.1f;
  terms.z_loss = 1e-3f;
  return {plain, terms};
}
}  // namespace

TEST_CASE_TEMPLATE("class_sharding<solo_communicator> equals the unsharded selective softmax", B,
                   XSOFTMAX_TEST_BACKENDS) {
  problem p;
  std::vector<index_t> off{0}, ids;
  std::mt19937 g(8);
  for (index_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 5; ++j) ids.push_back(static_cast<index_t>(g() % n));
    off.push_back(static_cast<index_t>(ids.size()));
  }
  xs::explicit_candidates per_sample, shared;
  per_sample.set_per_sample(off, ids);
  shared.set_shared(ids);
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    for (const xs::explicit_candidates& sel : {shared, per_sample}) {
      xs::selective_softmax<xs::explicit_candidates, xs::fp32, B> ref(sel, xs::matrix_view<float>(p.w.data(), n, d),
                                                                      p.b.data());
      xs::selective_softmax<xs::explicit_candidates, xs::fp32, B, solo> head(
          sel, solo({}, n, layout), xs::matrix_view<float>(p.w.data(), n, d), p.b.data());
      CHECK(head.num_classes() == n);
      CHECK(head.local_classes() == n);
      for (const xs::loss_options& o : option_sets()) same_outputs(head, ref, p, o);
    }
    xs::sampling_options so;
    so.num_sampled = 30;
    xs::selective_softmax<xs::sampled_negatives, xs::fp32, B> ref(xs::sampled_negatives::uniform(n, so),
                                                                  xs::matrix_view<float>(p.w.data(), n, d), p.b.data());
    xs::selective_softmax<xs::sampled_negatives, xs::fp32, B, solo> head(
        xs::sampled_negatives::uniform(n, so), solo({}, n, layout), xs::matrix_view<float>(p.w.data(), n, d),
        p.b.data());
    for (const xs::loss_options& o : option_sets()) same_outputs(head, ref, p, o);
  }
}

TEST_CASE_TEMPLATE("class_sharding<solo_communicator> equals the unsharded knn softmax", B, XSOFTMAX_TEST_BACKENDS) {
  problem p;
  xs::knn_options ko;
  ko.graph.k = 5;
  ko.rebuild_every = 1;
  xs::knn_softmax<xs::fp32, B> ref(xs::matrix_view<float>(p.w.data(), n, d), ko, p.b.data());
  xs::knn_softmax<xs::fp32, B, solo> head(solo({}, n), xs::matrix_view<float>(p.w.data(), n, d), ko, p.b.data());
  CHECK(head.graph().ids() == ref.graph().ids());
  for (const xs::loss_options& o : option_sets()) same_outputs(head, ref, p, o);
  head.next_step();
  ref.next_step();
  CHECK(head.graph().builds() == ref.graph().builds());
  CHECK(head.graph().ids() == ref.graph().ids());
}

TEST_CASE("knn_graph_builder: a share of the exact build's rows, assembled, is the whole build") {
  problem p;
  xs::knn_build_options bo;
  bo.k = 4;
  bo.query_tile = 7;  // tiles that do not line up with the shares
  const xs::matrix_view<const float> w(p.w.data(), n, d);
  const xs::knn_graph whole = xs::build_knn_graph<xs::serial>(w, bo);
  // Two shares, [0, 90) and [90, n): each builds its rows; the gather takes the other's from `whole`.
  for (const index_t first : {index_t(0), index_t(90)}) {
    const index_t count = first == 0 ? 90 : n - 90;
    int gathers = 0;
    xs::knn_build_share share;
    share.first = first;
    share.count = count;
    share.all_gather = [&](const index_t* ids, const float* sims, index_t k, index_t* all_ids, float* all_sims) {
      ++gathers;
      for (index_t i = 0; i < n * k; ++i) {
        const bool mine = i >= first * k && i < (first + count) * k;
        all_ids[i] = mine ? ids[i - first * k] : whole.ids()[static_cast<std::size_t>(i)];
        all_sims[i] = mine ? sims[i - first * k] : whole.similarities()[static_cast<std::size_t>(i)];
      }
    };
    xs::knn_graph part;
    const xs::backend_resources<xs::serial> res;
    xs::knn_graph_builder(bo).build_on(xs::detail::execution<xs::serial>{res}, w, part, &share);
    CHECK(gathers == 1);
    CHECK(part.ids() == whole.ids());
    CHECK(part.similarities() == whole.similarities());
  }
  // The sharded head's step hands its share to the KNN selector.
  static_assert(xs::detail::has_shared_build<xs::knn_selector, xs::detail::execution<xs::serial>, float>::value);
}
