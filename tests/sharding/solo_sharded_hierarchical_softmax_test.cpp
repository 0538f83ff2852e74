// SPDX-License-Identifier: Apache-2.0
// sharded_hierarchical_softmax with one rank (solo_communicator), in the plain test executable (no
// MPI needed) and, compiled by nvcc, on the cuda backend (tests/cuda/CMakeLists.txt): the routed
// path (top head, all_to_all to the only owner, the forest head of its subtrees, the rows' results
// back, the top gradient "summed" over one rank) equals the unsharded head on the same backend and
// weights — loss, per-sample losses, grad_hidden, every weight-gradient row mapped back through
// the plan, log_prob, top-k — for both node forms; the subtrees scored in calls of one subtree or a
// few rows give the same bits as one call; rows routed ahead (route_rows_async) give the bits of
// the blocking verb. The multi-rank tests run under mpiexec (sharded_hierarchical_softmax_mpi.cpp).

#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include "support/test_memory.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <random>
#include <vector>

namespace {
namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::on_host;
using xsoftmax_test::test_vector;
using tree = xs::runtime_tree<>;

/// Dense (rows x d) from a sparse gradient (any backend's) whose row ids are mapped by `to_full`
/// (identity when empty).
template <class G>
std::vector<double> dense(const G& g, index_t rows, index_t d, const std::vector<index_t>& to_full) {
  const auto ids = on_host(g.rows);
  const auto values = on_host(g.values);
  std::vector<double> out(static_cast<std::size_t>(rows * d), 0.0);
  for (index_t e = 0; e < g.num_rows(); ++e) {
    index_t r = ids[static_cast<std::size_t>(e)];
    if (!to_full.empty()) r = to_full[static_cast<std::size_t>(r)];
    for (index_t j = 0; j < d; ++j) out[static_cast<std::size_t>(r * d + j)] += values[static_cast<std::size_t>(e * d + j)];
  }
  return out;
}

template <class F, class B>
void check_solo(const tree& full, int cut) {
  constexpr index_t d = 10, rows = 40;
  using reference_type = xs::hierarchical_softmax<tree, xs::fp32, B, F>;
  using sharded = xs::sharded_hierarchical_softmax<xs::solo_communicator, F, xs::fp32, B>;
  xs::hs_shard_options o;
  o.cut_depth = cut;
  const xs::hs_shard_plan<64, F> plan(full, 1, o);
  const index_t n_rows = reference_type::weight_rows(full);
  std::mt19937 g(21);
  std::normal_distribution<float> nd(0.f, 0.5f);
  test_vector<float> w(static_cast<std::size_t>(n_rows * d)), h(static_cast<std::size_t>(rows * d));
  for (auto& x : w) x = nd(g);
  for (auto& x : h) x = nd(g);
  test_vector<index_t> t(static_cast<std::size_t>(rows));
  for (index_t i = 0; i < rows; ++i) t[static_cast<std::size_t>(i)] = i % 7 == 3 ? -100 : static_cast<index_t>(g() % full.num_classes());
  test_vector<float> top, local;
  for (index_t r : plan.top_rows()) top.insert(top.end(), w.begin() + r * d, w.begin() + (r + 1) * d);
  for (index_t r : plan.local_rows(0)) local.insert(local.end(), w.begin() + r * d, w.begin() + (r + 1) * d);
  const reference_type reference(full, xs::matrix_view<float>(w.data(), n_rows, d));
  const auto make = [&] {
    return sharded(plan, xs::solo_communicator{},
                   xs::matrix_view<float>(top.data(), static_cast<index_t>(plan.top_rows().size()), d),
                   xs::matrix_view<float>(local.data(), static_cast<index_t>(plan.local_rows(0).size()), d));
  };
  const sharded head = make();
  const xs::matrix_view<const float> hv(h.data(), rows, d);
  const xs::vector_view<const index_t> tv(t.data(), rows);

  test_vector<float> gh(h.size()), ref_gh(h.size()), per(static_cast<std::size_t>(rows)), ref_per(per.size());
  typename sharded::gradient_type g_top, g_local, ref_g;
  const float loss = head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), rows, d), g_top, g_local, {},
                                           xs::vector_view<float>(per.data(), rows));
  const float ref_loss = reference.forward_backward(hv, tv, xs::matrix_view<float>(ref_gh.data(), rows, d), ref_g, {},
                                                    xs::vector_view<float>(ref_per.data(), rows));
  CHECK(loss == doctest::Approx(ref_loss).epsilon(1e-6));
  for (std::size_t i = 0; i < per.size(); ++i) CHECK(per[i] == doctest::Approx(ref_per[i]).epsilon(1e-6).scale(1e-3));
  for (std::size_t i = 0; i < gh.size(); ++i) CHECK(gh[i] == doctest::Approx(ref_gh[i]).epsilon(1e-5).scale(1e-2));
  std::vector<double> mine = dense(g_top, n_rows, d, plan.top_rows());
  const std::vector<double> from_local = dense(g_local, n_rows, d, plan.local_rows(0));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] += from_local[i];
  const std::vector<double> ref = dense(ref_g, n_rows, d, {});
  for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == doctest::Approx(ref[i]).epsilon(1e-5).scale(1e-2));

  // The subtrees in calls of few rows (down to one subtree a call): the same bits as one call.
#if XSOFTMAX_TEST_HOST_BUILD
  CHECK(head.rows_per_call() == 8192 / d);
#else
  CHECK(head.rows_per_call() == std::numeric_limits<index_t>::max());  // one call on a GPU
#endif
  for (const index_t per_call : {index_t(1), index_t(5)}) {
    sharded chunked = make();
    chunked.set_rows_per_call(per_call);
    test_vector<float> gh2(h.size()), per2(per.size());
    typename sharded::gradient_type g_top2, g_local2;
    const float loss2 = chunked.forward_backward(hv, tv, xs::matrix_view<float>(gh2.data(), rows, d), g_top2, g_local2,
                                                 {}, xs::vector_view<float>(per2.data(), rows));
    CAPTURE(per_call);
    CHECK(loss2 == loss);
    CHECK(per2 == per);
    CHECK(gh2 == gh);
    CHECK(on_host(g_top2.rows) == on_host(g_top.rows));
    CHECK(on_host(g_top2.values) == on_host(g_top.values));
    CHECK(dense(g_local2, n_rows, d, plan.local_rows(0)) == from_local);
    CHECK(g_local2.num_rows() == g_local.num_rows());
  }
  {
    sharded bad = make();
    CHECK_THROWS_AS(bad.set_rows_per_call(0), xs::invalid_argument);
  }

  // Rows routed ahead of the verb: the blocking verb's bits.
  {
    auto routed = head.route_rows_async(hv, tv);
    test_vector<float> gh3(h.size()), per3(per.size());
    typename sharded::gradient_type g_top3, g_local3;
    const float loss3 = head.forward_backward(routed, xs::matrix_view<float>(gh3.data(), rows, d), g_top3, g_local3,
                                              {}, xs::vector_view<float>(per3.data(), rows));
    CHECK(loss3 == loss);
    CHECK(per3 == per);
    CHECK(gh3 == gh);
    CHECK(on_host(g_top3.values) == on_host(g_top.values));
    CHECK(on_host(g_local3.values) == on_host(g_local.values));
    CHECK_FALSE(routed.usable());
  }

  for (auto& x : t) x = x < 0 ? 0 : x;
  test_vector<float> lp(static_cast<std::size_t>(rows)), ref_lp(lp.size());
  head.log_prob(hv, tv, xs::vector_view<float>(lp.data(), rows));
  reference.log_prob(hv, tv, xs::vector_view<float>(ref_lp.data(), rows));
  for (std::size_t i = 0; i < lp.size(); ++i) CHECK(lp[i] == doctest::Approx(ref_lp[i]).epsilon(1e-6));

  for (index_t k : {index_t(1), index_t(9), index_t(257)}) {  // 257: every class
    test_vector<index_t> c(static_cast<std::size_t>(rows * k)), ref_c(c.size());
    test_vector<float> v(c.size()), ref_v(c.size());
    head.topk(hv, k, xs::matrix_view<index_t>(c.data(), rows, k), xs::matrix_view<float>(v.data(), rows, k));
    reference.topk(hv, k, xs::matrix_view<index_t>(ref_c.data(), rows, k), xs::matrix_view<float>(ref_v.data(), rows, k));
    CAPTURE(k);
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == doctest::Approx(ref_v[i]).epsilon(1e-5).scale(1.0));
    std::size_t same = 0;
    for (std::size_t i = 0; i < c.size(); ++i) same += c[i] == ref_c[i] ? 1 : 0;
    CHECK(same >= c.size() - c.size() / 50);  // a rare swap of neighbours that tie to rounding
  }
}
}  // namespace

TEST_CASE_TEMPLATE("sharded_hierarchical_softmax<solo_communicator> equals the unsharded head", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::vector<double> counts(257);
  for (std::size_t c = 0; c < counts.size(); ++c) counts[c] = 1.0 / static_cast<double>(c + 1);
  const tree huffman = tree::huffman(counts);
  check_solo<xs::softmax_nodes, B>(huffman, 3);
  check_solo<xs::sigmoid_nodes, B>(huffman, 3);
  const tree ternary = tree::huffman(counts, 3);
  check_solo<xs::softmax_nodes, B>(ternary, 1);
  check_solo<xs::softmax_nodes, B>(ternary, 2);
}

TEST_CASE("solo_communicator::all_to_all copies its one block") {
  xs::solo_communicator solo;
  const std::vector<float> send{1.f, 2.f, 3.f};
  std::vector<float> recv(3);
  const index_t three = 3, two = 2;
  solo.all_to_all(send.data(), &three, recv.data(), &three);
  CHECK(recv == send);
  CHECK_THROWS_AS(solo.all_to_all(send.data(), &three, recv.data(), &two), xs::invalid_argument);
}
