// SPDX-License-Identifier: Apache-2.0
// sharded_hierarchical_softmax over mpi_communicator, run by ctest under mpirun with 1, 2, 3 and 4
// ranks, against the unsharded hierarchical_softmax that every rank builds from the same seeded
// weights: loss, per-sample losses, grad_hidden of the rank's own rows, the top tree's weight
// gradient (summed over every rank's batch) and each rank's local weight-gradient rows, mapped back
// to the full tree through the plan, log_prob, top-k and apply_sgd (replicas stay equal) — for a
// binary Huffman tree over 1,003 Zipf classes (both node forms; plain cut and hot-subtree splitting)
// and a uniform-ish 3-level tree with classes above the cut; a batch whose targets all sit in one subtree; bitwise-equal repeated runs;
// typed rejections (a rank with no subtree, bad cut depth, frequencies of the wrong size,
// mismatched communicator and weights).
// Also compiled by nvcc for the cuda backend (xsoftmax_cuda_mpi_tests, XSOFTMAX_TEST_ON_CUDA): every
// rank's heads on the one GPU, rows routed through host copies by mpi_communicator (issue 26,
// target 8).

#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>

#include "sharded_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using tree = xs::runtime_tree<>;
using xsoftmax_test::host_values;
using xsoftmax_test::test_vector;

constexpr index_t classes = 1003, dim = 12, ignore = -100;

std::vector<double> zipf(index_t n) {
  std::vector<double> f(static_cast<std::size_t>(n));
  for (index_t c = 0; c < n; ++c) f[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
  return f;
}

/// 1,003 classes: classes 0..2 hang from the root (above any cut), the others 10 to a node, those
/// nodes 10 to a node (depth 3, the last blocks short).
tree uniformish() {
  std::vector<index_t> parent(static_cast<std::size_t>(classes));
  const index_t deep = classes - 3, lower = (deep + 9) / 10, upper = (lower + 9) / 10;
  const index_t lower0 = classes, upper0 = lower0 + lower, root = upper0 + upper;
  parent.resize(static_cast<std::size_t>(root + 1));
  for (index_t c = 0; c < 3; ++c) parent[static_cast<std::size_t>(c)] = root;
  for (index_t c = 3; c < classes; ++c) parent[static_cast<std::size_t>(c)] = lower0 + (c - 3) / 10;
  for (index_t k = 0; k < lower; ++k) parent[static_cast<std::size_t>(lower0 + k)] = upper0 + k / 10;
  for (index_t k = 0; k < upper; ++k) parent[static_cast<std::size_t>(upper0 + k)] = root;
  parent[static_cast<std::size_t>(root)] = -1;
  return tree::from_parents(parent, classes);
}

using xsoftmax_test::check_close;

/// The sharded top-k against the unsharded one: log-probabilities close; classes equal, except a
/// swap between neighbours whose log-probabilities tie to rounding (1e-5).
template <class C, class V>
void check_topk(const C& c, const V& v, const C& ref_c, const V& ref_v, index_t k) {
  check_close(v, ref_v, 1e-6, 1e-3, "topk log_probs");
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] == ref_c[i]) continue;
    const std::size_t e = i % static_cast<std::size_t>(k);
    const auto tie = [&](std::size_t j) { return std::abs(ref_v[i] - ref_v[j]) <= 1e-5f * std::max(1.f, std::abs(ref_v[i])); };
    const bool near_tie = (e > 0 && tie(i - 1)) || (e + 1 < static_cast<std::size_t>(k) && tie(i + 1));
    CHECK_MESSAGE(near_tie, "topk class [", i, "] = ", c[i], " vs unsharded ", ref_c[i]);
  }
}

struct batch {
  test_vector<float> h;
  test_vector<index_t> t;
  index_t rows = 0;
  [[nodiscard]] xs::matrix_view<const float> hidden() const { return {h.data(), rows, dim}; }
  [[nodiscard]] xs::vector_view<const index_t> targets() const { return {t.data(), rows}; }
};

/// Rank q's batch: 7 + 4q rows, Zipf targets (every sixth ignored), or only classes of `only` (a
/// list of classes, e.g. one subtree's) when it is not empty.
batch batch_of(int q, const std::vector<index_t>& only = {}) {
  batch b;
  b.rows = 7 + 4 * q;
  std::mt19937 g(300 + static_cast<unsigned>(q));
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::vector<double> f = zipf(classes);
  std::discrete_distribution<index_t> pick(f.begin(), f.end());
  for (index_t i = 0; i < b.rows * dim; ++i) b.h.push_back(nd(g));
  for (index_t i = 0; i < b.rows; ++i) {
    if (!only.empty()) b.t.push_back(only[g() % only.size()]);
    else b.t.push_back(i % 6 == 5 ? ignore : pick(g));
  }
  return b;
}

/// The rows `rows` of `w` (n x dim) and of `bias`.
template <class W>
test_vector<float> pick_rows(const W& w, const std::vector<index_t>& rows, index_t width) {
  test_vector<float> out;
  for (index_t r : rows) out.insert(out.end(), w.begin() + r * width, w.begin() + (r + 1) * width);
  return out;
}

/// A sparse gradient laid out densely over `rows` (its rows are indices into `rows`' list), and
/// the reference's (full-tree rows) over the same list.
template <class G>
std::vector<float> dense_over(const G& g, index_t n_rows, index_t width, bool bias) {
  std::vector<float> out(static_cast<std::size_t>(n_rows * width), 0.f);
  const std::vector<index_t> rows = host_values(g.rows);
  const std::vector<float> values = host_values(bias ? g.bias_values : g.values);
  for (index_t e = 0; e < g.num_rows(); ++e) {
    const index_t r = rows[static_cast<std::size_t>(e)];
    for (index_t j = 0; j < width; ++j)
      out[static_cast<std::size_t>(r * width + j)] +=
          bias ? values[static_cast<std::size_t>(e)] : values[static_cast<std::size_t>(e * dim + j)];
  }
  return out;
}

template <class B, class F>
void compare(const tree& full, const xs::hs_shard_options& options, const std::vector<index_t>& hot_subtree_only,
             bool with_bias, index_t rows_per_call = 0) {
  using plan_type = xs::hs_shard_plan<64, F>;
  using sharded = xs::sharded_hierarchical_softmax<xs::mpi_communicator, F, xs::fp32, B>;
  using reference_type = xs::hierarchical_softmax<tree, xs::fp32, B, F>;
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  const plan_type plan(full, size, options);
  const index_t w_rows = reference_type::weight_rows(full);
  test_vector<float> w(static_cast<std::size_t>(w_rows * dim)), bias(static_cast<std::size_t>(w_rows));
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 0.4f);
  for (auto& x : w) x = nd(g);
  for (auto& x : bias) x = 0.1f * nd(g);
  const reference_type reference(full, xs::matrix_view<float>(w.data(), w_rows, dim), with_bias ? bias.data() : nullptr);

  const std::vector<index_t>& top_rows = plan.top_rows();
  const std::vector<index_t>& local_rows = plan.local_rows(rank);
  test_vector<float> top_w = pick_rows(w, top_rows, dim), local_w = pick_rows(w, local_rows, dim);
  test_vector<float> top_b = pick_rows(bias, top_rows, 1), local_b = pick_rows(bias, local_rows, 1);
  const index_t n_top = static_cast<index_t>(top_rows.size()), n_local = static_cast<index_t>(local_rows.size());
  sharded head(plan, comm, xs::matrix_view<float>(top_w.data(), n_top, dim),
               xs::matrix_view<float>(local_w.data(), n_local, dim), with_bias ? top_b.data() : nullptr,
               with_bias ? local_b.data() : nullptr);
  if (rows_per_call > 0) head.set_rows_per_call(rows_per_call);  // the subtrees in several calls

  std::vector<batch> all;
  for (int q = 0; q < size; ++q) all.push_back(batch_of(q, hot_subtree_only));
  const batch& own = all[static_cast<std::size_t>(rank)];
  xs::loss_options mean, sum, none;
  sum.reduce = xs::reduction::sum;
  none.reduce = xs::reduction::none;
  for (const xs::loss_options& o : {mean, sum, none}) {
    CAPTURE(static_cast<int>(o.reduce));
    // The unsharded gradient of the sum of every rank's loss, dense over the full tree's rows.
    std::vector<float> ref_w(static_cast<std::size_t>(w_rows * dim), 0.f), ref_b(static_cast<std::size_t>(w_rows), 0.f);
    test_vector<float> ref_gh, ref_per(static_cast<std::size_t>(own.rows));
    float ref_loss = 0;
    for (int q = 0; q < size; ++q) {
      const batch& b = all[static_cast<std::size_t>(q)];
      test_vector<float> gh(b.h.size()), per(static_cast<std::size_t>(b.rows));
      typename reference_type::gradient_type rg;
      const float l = reference.forward_backward(b.hidden(), b.targets(), xs::matrix_view<float>(gh.data(), b.rows, dim),
                                                 rg, o, xs::vector_view<float>(per.data(), b.rows));
      const std::vector<float> dw = dense_over(rg, w_rows, dim, false);
      for (std::size_t i = 0; i < dw.size(); ++i) ref_w[i] += dw[i];
      if (with_bias) {
        const std::vector<float> db = dense_over(rg, w_rows, 1, true);
        for (std::size_t i = 0; i < db.size(); ++i) ref_b[i] += db[i];
      }
      if (q == rank) ref_loss = l, ref_gh = gh, ref_per = per;
    }

    test_vector<float> gh(own.h.size()), per(static_cast<std::size_t>(own.rows));
    typename sharded::gradient_type g_top, g_local;
    const float loss = head.forward_backward(own.hidden(), own.targets(), xs::matrix_view<float>(gh.data(), own.rows, dim),
                                             g_top, g_local, o, xs::vector_view<float>(per.data(), own.rows));
    check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
    check_close(per, ref_per, 1e-6, 1e-3, "per_sample");
    check_close(gh, ref_gh, 1e-6, 1e-5, "grad_hidden");
    test_vector<float> per_f(static_cast<std::size_t>(own.rows));
    const float loss_f = head.forward(own.hidden(), own.targets(), o, xs::vector_view<float>(per_f.data(), own.rows));
    check_close({loss_f}, {ref_loss}, 1e-6, 1e-3, "forward loss");
    check_close(per_f, ref_per, 1e-6, 1e-3, "forward per_sample");

    // Weight gradients mapped back through the plan: every top row, every local row.
    const std::vector<index_t> top_rows_of_g = host_values(g_top.rows);
    CHECK(std::is_sorted(top_rows_of_g.begin(), top_rows_of_g.end()));
    check_close(dense_over(g_top, n_top, dim, false), pick_rows(ref_w, top_rows, dim), 1e-6, 1e-5, "grad_top");
    check_close(dense_over(g_local, n_local, dim, false), pick_rows(ref_w, local_rows, dim), 1e-6, 1e-5, "grad_local");
    if (with_bias) {
      check_close(dense_over(g_top, n_top, 1, true), pick_rows(ref_b, top_rows, 1), 1e-6, 1e-5, "grad_top bias");
      check_close(dense_over(g_local, n_local, 1, true), pick_rows(ref_b, local_rows, 1), 1e-6, 1e-5, "grad_local bias");
    }

    // Bitwise the same on a repeated run.
    test_vector<float> gh2(gh.size()), per2(per.size());
    typename sharded::gradient_type g_top2, g_local2;
    const float loss2 = head.forward_backward(own.hidden(), own.targets(), xs::matrix_view<float>(gh2.data(), own.rows, dim),
                                              g_top2, g_local2, o, xs::vector_view<float>(per2.data(), own.rows));
    CHECK(std::memcmp(&loss, &loss2, sizeof loss) == 0);
    CHECK(gh == gh2);
    CHECK(per == per2);
    CHECK(host_values(g_top.rows) == host_values(g_top2.rows));
    CHECK(host_values(g_top.values) == host_values(g_top2.values));
    CHECK(host_values(g_local.values) == host_values(g_local2.values));
  }

  // apply_sgd: the sharded head's weights move exactly as the full weights do under the mapped
  // gradients (the last reduction's), replicas of the top included.
  {
    test_vector<float> gh(own.h.size());
    typename sharded::gradient_type g_top, g_local;
    head.forward_backward(own.hidden(), own.targets(), xs::matrix_view<float>(gh.data(), own.rows, dim), g_top, g_local);
    test_vector<float> want_top = top_w, want_local = local_w;
    const auto step_by = [](test_vector<float>& want, const typename sharded::gradient_type& g) {
      const std::vector<index_t> rows = host_values(g.rows);
      const std::vector<float> values = host_values(g.values);
      for (index_t e = 0; e < g.num_rows(); ++e)
        for (index_t j = 0; j < dim; ++j)
          want[static_cast<std::size_t>(rows[static_cast<std::size_t>(e)] * dim + j)] -=
              0.5f * values[static_cast<std::size_t>(e * dim + j)];
    };
    step_by(want_top, g_top);
    step_by(want_local, g_local);
    sharded trained = head;
    typename sharded::gradient_type bad = g_local;
    if (bad.num_rows() > 0) {
      bad.rows[0] = n_local;  // out of range: nothing may change
      const test_vector<float> before = top_w;
      CHECK_THROWS_AS(trained.apply_sgd(g_top, bad, 0.5f), xs::out_of_range);
      CHECK(top_w == before);
    }
    trained.apply_sgd(g_top, g_local, 0.5f);
    CHECK(top_w == want_top);
    CHECK(local_w == want_local);
    // Every rank holds the same top weights.
    // (A plain host copy is sent: MPI is not handed managed memory.)
    const std::vector<float> mine(top_w.begin(), top_w.end());
    std::vector<float> rank0 = mine;
    MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(mine == rank0);
    // Back to the shared weights, in place (the heads view these buffers).
    const test_vector<float> top0 = pick_rows(w, top_rows, dim), local0 = pick_rows(w, local_rows, dim);
    std::copy(top0.begin(), top0.end(), top_w.begin());
    std::copy(local0.begin(), local0.end(), local_w.begin());
    const test_vector<float> top_b0 = pick_rows(bias, top_rows, 1), local_b0 = pick_rows(bias, local_rows, 1);
    std::copy(top_b0.begin(), top_b0.end(), top_b.begin());
    std::copy(local_b0.begin(), local_b0.end(), local_b.begin());
  }

  // log_prob ignores nothing.
  batch lp_batch = own;
  for (auto& t : lp_batch.t) t = t == ignore ? 0 : t;
  test_vector<float> lp(static_cast<std::size_t>(own.rows)), ref_lp(lp.size());
  head.log_prob(lp_batch.hidden(), lp_batch.targets(), xs::vector_view<float>(lp.data(), own.rows));
  reference.log_prob(lp_batch.hidden(), lp_batch.targets(), xs::vector_view<float>(ref_lp.data(), own.rows));
  check_close(lp, ref_lp, 1e-6, 1e-3, "log_prob");

  // Exact top-k (k = 60 reaches past the top tree's leaves and into many subtrees).
  for (index_t k : {index_t(1), index_t(7), index_t(60)}) {
    CAPTURE(k);
    test_vector<index_t> c(static_cast<std::size_t>(own.rows * k)), ref_c(c.size());
    test_vector<float> v(c.size()), ref_v(c.size());
    head.topk(own.hidden(), k, xs::matrix_view<index_t>(c.data(), own.rows, k), xs::matrix_view<float>(v.data(), own.rows, k));
    reference.topk(own.hidden(), k, xs::matrix_view<index_t>(ref_c.data(), own.rows, k),
                   xs::matrix_view<float>(ref_v.data(), own.rows, k));
    check_topk(c, v, ref_c, ref_v, k);
  }
}

/// The classes below one subtree of `plan` (for the all-in-one-subtree batch).
template <class Plan>
std::vector<index_t> classes_of_subtree(const Plan& plan, index_t s) {
  std::vector<index_t> out;
  for (index_t c = 0; c < plan.num_classes(); ++c)
    if (plan.subtree_of(c) == s) out.push_back(c);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("sharded hierarchical softmax equals the unsharded head: Huffman tree, both node forms", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const tree huffman = tree::huffman(zipf(classes));
  for (double split : {0.0, 1.0}) {
    xs::hs_shard_options o;
    o.cut_depth = 5;
    o.class_frequency = zipf(classes);
    o.split_above = split;
    CAPTURE(split);
    compare<B, xs::softmax_nodes>(huffman, o, {}, true);
    compare<B, xs::sigmoid_nodes>(huffman, o, {}, false);
    compare<B, xs::sigmoid_nodes>(huffman, o, {}, true);
    compare<B, xs::softmax_nodes>(huffman, o, {}, true, 1);  // one subtree a call
    compare<B, xs::sigmoid_nodes>(huffman, o, {}, true, 3);
  }
}

TEST_CASE_TEMPLATE("sharded hierarchical softmax equals the unsharded head: 3-level tree, classes above the cut", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const tree t = uniformish();
  for (int cut : {1, 2}) {
    CAPTURE(cut);
    xs::hs_shard_options o;
    o.cut_depth = cut;
    compare<B, xs::softmax_nodes>(t, o, {}, true);
    compare<B, xs::softmax_nodes>(t, o, {}, false);
  }
  // Zipf by class id: the first of the 10 upper subtrees holds ~45 % of the mass; on more than one
  // rank splitting replaces it by its 10 children, and the head still equals the unsharded one.
  xs::hs_shard_options skew;
  skew.cut_depth = 1;
  skew.class_frequency = zipf(classes);
  skew.split_above = 1.0;
  xs::mpi_communicator comm;
  const xs::hs_shard_plan<> split(t, comm.size(), skew);
  CHECK(split.num_subtrees() == (comm.size() > 1 ? 19 : 10));
  CHECK(split.expected_imbalance() <= 1.5);
  compare<B, xs::softmax_nodes>(t, skew, {}, true);
}

TEST_CASE("sharded hierarchical softmax: a batch whose targets all sit in one subtree") {
  const tree t = uniformish();
  xs::mpi_communicator comm;
  xs::hs_shard_options o;
  o.cut_depth = 2;
  const xs::hs_shard_plan<> plan(t, comm.size(), o);
  const std::vector<index_t> hot = classes_of_subtree(plan, 3);
  REQUIRE(!hot.empty());
  compare<xsoftmax_test::primary_backend, xs::softmax_nodes>(t, o, hot, true);
  // Every row is routed to one rank: the imbalance is the rank count.
  std::vector<index_t> targets;
  for (int q = 0; q < comm.size(); ++q) {
    const batch b = batch_of(q, hot);
    targets.insert(targets.end(), b.t.begin(), b.t.end());
  }
  CHECK(plan.imbalance(targets) == doctest::Approx(comm.size()));
  // Re-planned from that batch's histogram with splitting: on more than one rank the hot subtree
  // (leaves only) moves into the replicated top tree, nothing of the batch is routed, and the head
  // still equals the unsharded one.
  xs::hs_shard_options adaptive = o;
  adaptive.class_frequency.assign(classes, 0.0);
  for (index_t c : targets) adaptive.class_frequency[static_cast<std::size_t>(c)] += 1.0;
  adaptive.split_above = 1.0;
  const xs::hs_shard_plan<> split(t, comm.size(), adaptive);
  if (comm.size() > 1) {
    CHECK(split.num_subtrees() == plan.num_subtrees() - 1);
    for (index_t c : hot) CHECK(split.subtree_of(c) == -1);
    CHECK(split.imbalance(targets) == 1.0);
  } else {
    CHECK(split.num_subtrees() == plan.num_subtrees());  // one rank: nothing to balance, no split
  }
  compare<xsoftmax_test::primary_backend, xs::softmax_nodes>(t, adaptive, hot, true);
}

TEST_CASE("hs_shard_plan: the row maps cover the full tree once; work and assignment") {
  const tree huffman = tree::huffman(zipf(classes));
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (double split : {0.0, 1.0}) {
      xs::hs_shard_options o;
      o.cut_depth = 4;
      o.class_frequency = zipf(classes);
      o.split_above = split;
      const xs::hs_shard_plan<> plan(huffman, ranks, o);
      CAPTURE(ranks);
      CAPTURE(split);
      // Each full-tree row appears exactly once: in the top tree or on exactly one rank.
      std::vector<int> seen(static_cast<std::size_t>(huffman.num_rows()), 0);
      for (index_t r : plan.top_rows()) ++seen[static_cast<std::size_t>(r)];
      for (int q = 0; q < ranks; ++q) {
        CHECK(!plan.subtrees_of(q).empty());
        for (index_t r : plan.local_rows(q)) ++seen[static_cast<std::size_t>(r)];
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));
      // Every class reaches one top leaf; classes below the cut are in exactly one subtree.
      double work = 0;
      for (index_t s = 0; s < plan.num_subtrees(); ++s) work += plan.subtree_work(s);
      double rank_work = 0;
      for (int q = 0; q < ranks; ++q) rank_work += plan.rank_work(q);
      CHECK(work == doctest::Approx(rank_work));
      CHECK(plan.expected_imbalance() >= 1.0);
      for (index_t c = 0; c < classes; ++c) {
        CHECK(plan.top_class(c) >= 0);
        if (plan.subtree_of(c) < 0) continue;
        CHECK(plan.local_class(c) < plan.subtree(plan.subtree_of(c)).num_classes());
        CHECK(plan.routed_cost(c) == 2 * (huffman.depth(c) - plan.top_tree().depth(plan.top_class(c))));
      }
    }
  }
}

TEST_CASE("hs_shard_plan and sharded_hierarchical_softmax reject bad plans with typed errors") {
  const tree huffman = tree::huffman(zipf(classes));
  xs::hs_shard_options o;
  o.cut_depth = 0;
  CHECK_THROWS_AS(xs::hs_shard_plan<>(huffman, 2, o), xs::invalid_argument);
  o.cut_depth = huffman.height();  // no internal node that deep
  CHECK_THROWS_AS(xs::hs_shard_plan<>(huffman, 2, o), xs::invalid_argument);
  o.cut_depth = 2;  // at most 4 subtrees: a fifth rank would own none
  const xs::hs_shard_plan<> four(huffman, 1, o);
  CHECK_THROWS_AS(xs::hs_shard_plan<>(huffman, static_cast<int>(four.num_subtrees()) + 1, o), xs::invalid_argument);
  o.class_frequency.assign(classes - 1, 1.0);
  CHECK_THROWS_AS(xs::hs_shard_plan<>(huffman, 1, o), xs::shape_error);
  o.class_frequency.assign(classes, 1.0);
  o.class_frequency[7] = -1;
  CHECK_THROWS_AS(xs::hs_shard_plan<>(huffman, 1, o), xs::invalid_argument);
  CHECK_THROWS_AS((xs::hs_shard_plan<64, xs::sigmoid_nodes>(uniformish(), 1)), xs::tree_error);

  xs::mpi_communicator comm;
  xs::hs_shard_options ok;
  ok.cut_depth = 4;
  const xs::hs_shard_plan<> plan(huffman, comm.size(), ok), other(huffman, comm.size() + 1, ok);
  using head = xs::sharded_hierarchical_softmax<xs::mpi_communicator>;
  const index_t n_top = static_cast<index_t>(plan.top_rows().size());
  const index_t n_local = static_cast<index_t>(plan.local_rows(comm.rank()).size());
  std::vector<float> top(static_cast<std::size_t>((n_top + 1) * dim)), local(static_cast<std::size_t>((n_local + 1) * dim));
  const xs::matrix_view<float> tv(top.data(), n_top, dim), lv(local.data(), n_local, dim);
  CHECK_THROWS_AS(head(other, comm, tv, lv), xs::invalid_argument);
  CHECK_THROWS_AS(head(plan, comm, xs::matrix_view<float>(top.data(), n_top + 1, dim), lv), xs::shape_error);
  CHECK_THROWS_AS(head(plan, comm, tv, xs::matrix_view<float>(local.data(), n_local + 1, dim)), xs::shape_error);
  CHECK_THROWS_AS(head(plan, comm, tv, lv, top.data(), nullptr), xs::invalid_argument);
  const head h(plan, comm, tv, lv);
  // A bad target throws before any collective (every rank passes the same bad batch here).
  std::vector<float> hid(static_cast<std::size_t>(2 * dim), 0.5f), gh(hid.size());
  std::vector<index_t> t{1, classes};
  typename head::gradient_type gt, gl;
  CHECK_THROWS_AS(h.forward_backward(xs::matrix_view<const float>(hid.data(), 2, dim), xs::vector_view<const index_t>(t.data(), 2),
                                     xs::matrix_view<float>(gh.data(), 2, dim), gt, gl),
                  xs::out_of_range);
}
