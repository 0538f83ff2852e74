// SPDX-License-Identifier: Apache-2.0
// Re-planning a sharded hierarchical softmax under mpirun (1 to 4 ranks): `reshard_hs_rows` moves
// weights and biases (fp32 and bf16) from one plan's layout to another's bitwise, for plan pairs
// that change the cut, the assignment and the frontier (hot-subtree splitting); a head trained one
// step on the old plan and moved to the new one keeps equalling the unsharded head that took the
// same step; `class_frequency_tracker` decays and sums counts as documented and drives a re-plan
// that removes the imbalance of a drifted batch; `hs_replanner` proposes a plan on check batches
// only and only when it pays; typed rejections before any collective.

#include <xsoftmax/sharding/class_frequency_tracker.hpp>
#include <xsoftmax/sharding/hs_replanner.hpp>
#include <xsoftmax/sharding/hs_reshard.hpp>
#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>

#include "sharded_checks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using tree = xs::runtime_tree<>;
using plan_type = xs::hs_shard_plan<>;

constexpr index_t classes = 1003, dim = 8;

std::vector<double> zipf(index_t n, index_t shift = 0) {
  std::vector<double> f(static_cast<std::size_t>(n));
  for (index_t c = 0; c < n; ++c) f[static_cast<std::size_t>((c + shift) % n)] = 1.0 / static_cast<double>(c + 1);
  return f;
}

/// The rows `rows` of `w` (n x width), as T.
template <class T>
std::vector<T> pick_rows(const std::vector<float>& w, const std::vector<index_t>& rows, index_t width) {
  std::vector<T> out;
  for (index_t r : rows)
    for (index_t j = 0; j < width; ++j) out.push_back(xs::from_float<T>(w[static_cast<std::size_t>(r * width + j)]));
  return out;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// mpi_communicator, counting the elements this rank hands to other ranks.
struct counting_communicator {
  xs::mpi_communicator& comm;
  index_t sent = 0;
  [[nodiscard]] int rank() const { return comm.rank(); }
  [[nodiscard]] int size() const { return comm.size(); }
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    sent += count * (comm.size() - 1);
    comm.all_gather(send, count, recv, counts);
  }
  template <class T>
  void all_to_all(const T* send, const index_t* send_counts, T* recv, const index_t* recv_counts) {
    for (int q = 0; q < comm.size(); ++q)
      if (q != comm.rank()) sent += send_counts[q];
    comm.all_to_all(send, send_counts, recv, recv_counts);
  }
};

/// Moves `w`'s rows (full tree, `width` wide) from `from`'s layout to `to`'s and checks the result
/// is exactly `to`'s rows of `w`.
template <class T>
void check_move(const plan_type& from, const plan_type& to, const std::vector<float>& w, index_t width) {
  xs::mpi_communicator mpi;
  counting_communicator comm{mpi};
  const int rank = comm.rank();
  const std::vector<T> old_top = pick_rows<T>(w, from.top_rows(), width);
  const std::vector<T> old_local = pick_rows<T>(w, from.local_rows(rank), width);
  std::vector<T> new_top(to.top_rows().size() * static_cast<std::size_t>(width));
  std::vector<T> new_local(to.local_rows(rank).size() * static_cast<std::size_t>(width));
  xs::reshard_hs_rows(from, to, comm, xs::matrix_view<const T>(old_top.data(), static_cast<index_t>(from.top_rows().size()), width),
                      xs::matrix_view<const T>(old_local.data(), static_cast<index_t>(from.local_rows(rank).size()), width),
                      xs::matrix_view<T>(new_top.data(), static_cast<index_t>(to.top_rows().size()), width),
                      xs::matrix_view<T>(new_local.data(), static_cast<index_t>(to.local_rows(rank).size()), width));
  CHECK(bitwise_equal(new_top, pick_rows<T>(w, to.top_rows(), width)));
  CHECK(bitwise_equal(new_local, pick_rows<T>(w, to.local_rows(rank), width)));
  // Only the rows that change place cross the transport, as reshard_rows_sent counts them (rows
  // this rank keeps stay put, whatever the transport would do with them).
  CHECK(comm.sent == xs::reshard_rows_sent(from, to)[static_cast<std::size_t>(rank)] * width);
}

/// Plans over `t` for this communicator that differ in cut, frequencies and splitting.
std::vector<plan_type> plans_of(const tree& t, int ranks, int deep_cut) {
  std::vector<plan_type> plans;
  xs::hs_shard_options a;
  a.cut_depth = 3;  // shallower than the others: rows move between the top tree and the subtrees
  plans.emplace_back(t, ranks, a);
  xs::hs_shard_options b;
  b.cut_depth = deep_cut;
  b.class_frequency = zipf(classes);
  plans.emplace_back(t, ranks, b);
  xs::hs_shard_options c = b;
  c.class_frequency = zipf(classes, 500);  // the hot classes elsewhere: another assignment
  c.split_above = 1.0;
  plans.emplace_back(t, ranks, c);
  return plans;
}

}  // namespace

TEST_CASE("reshard_hs_rows moves weights and biases bitwise between plans (fp32, bf16)") {
  xs::mpi_communicator comm;
  const tree huffman = tree::huffman(zipf(classes));
  const index_t rows = plan_type::weight_rows(huffman);
  std::vector<float> w(static_cast<std::size_t>(rows * dim)), bias(static_cast<std::size_t>(rows));
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : w) x = nd(g);
  for (auto& x : bias) x = nd(g);
  const std::vector<plan_type> plans = plans_of(huffman, comm.size(), 5);
  REQUIRE(plans.size() >= 2);
  for (std::size_t i = 0; i < plans.size(); ++i)
    for (std::size_t j = 0; j < plans.size(); ++j) {
      CAPTURE(i);
      CAPTURE(j);
      check_move<float>(plans[i], plans[j], w, dim);
      check_move<float>(plans[i], plans[j], bias, 1);
      check_move<__nv_bfloat16>(plans[i], plans[j], w, dim);
    }
}

TEST_CASE("a head trained on one plan and moved to another still equals the unsharded head") {
  using sharded = xs::sharded_hierarchical_softmax<xs::mpi_communicator>;
  using reference_type = xs::hierarchical_softmax<tree, xs::fp32, xs::serial>;
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  const tree huffman = tree::huffman(zipf(classes));
  const std::vector<plan_type> plans = plans_of(huffman, size, 4);
  const plan_type& from = plans[plans.size() - 2];
  const plan_type& to = plans.back();
  const index_t rows = reference_type::weight_rows(huffman);
  std::vector<float> w(static_cast<std::size_t>(rows * dim));
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (auto& x : w) x = nd(g);

  // Every rank's batch (each rank builds all of them: the reference trains on their union).
  std::vector<std::vector<float>> h(static_cast<std::size_t>(size));
  std::vector<std::vector<index_t>> t(static_cast<std::size_t>(size));
  const std::vector<double> f = zipf(classes, 500);
  std::discrete_distribution<index_t> pick(f.begin(), f.end());
  for (int q = 0; q < size; ++q) {
    const index_t b = 9 + 3 * q;
    for (index_t i = 0; i < b * dim; ++i) h[static_cast<std::size_t>(q)].push_back(nd(g));
    for (index_t i = 0; i < b; ++i) t[static_cast<std::size_t>(q)].push_back(pick(g));
  }
  const auto hidden = [&](int q) {
    const auto& v = h[static_cast<std::size_t>(q)];
    return xs::matrix_view<const float>(v.data(), static_cast<index_t>(v.size()) / dim, dim);
  };
  const auto targets = [&](int q) {
    const auto& v = t[static_cast<std::size_t>(q)];
    return xs::vector_view<const index_t>(v.data(), static_cast<index_t>(v.size()));
  };
  xs::loss_options sum;
  sum.reduce = xs::reduction::sum;

  // The unsharded head: one SGD step on the sum of every rank's loss.
  reference_type reference(huffman, xs::matrix_view<float>(w.data(), rows, dim));
  std::vector<float> w_ref = w;
  reference_type trained_ref(huffman, xs::matrix_view<float>(w_ref.data(), rows, dim));
  for (int q = 0; q < size; ++q) {
    std::vector<float> gh(h[static_cast<std::size_t>(q)].size());
    typename reference_type::gradient_type rg;
    reference.forward_backward(hidden(q), targets(q), xs::matrix_view<float>(gh.data(), hidden(q).rows, dim), rg, sum);
    trained_ref.apply_sgd(rg, 0.25f);
  }

  // The sharded head on `from`: the same step, then the move to `to`.
  std::vector<float> top = pick_rows<float>(w, from.top_rows(), dim), local = pick_rows<float>(w, from.local_rows(rank), dim);
  const index_t n_top = static_cast<index_t>(from.top_rows().size()), n_local = static_cast<index_t>(from.local_rows(rank).size());
  sharded head(from, comm, xs::matrix_view<float>(top.data(), n_top, dim), xs::matrix_view<float>(local.data(), n_local, dim));
  {
    std::vector<float> gh(h[static_cast<std::size_t>(rank)].size());
    typename sharded::gradient_type g_top, g_local;
    head.forward_backward(hidden(rank), targets(rank), xs::matrix_view<float>(gh.data(), hidden(rank).rows, dim), g_top,
                          g_local, sum);
    head.apply_sgd(g_top, g_local, 0.25f);
  }
  std::vector<float> top2(to.top_rows().size() * dim), local2(to.local_rows(rank).size() * dim);
  const index_t m_top = static_cast<index_t>(to.top_rows().size()), m_local = static_cast<index_t>(to.local_rows(rank).size());
  xs::reshard_hs_rows(from, to, comm, xs::matrix_view<const float>(top.data(), n_top, dim),
                      xs::matrix_view<const float>(local.data(), n_local, dim),
                      xs::matrix_view<float>(top2.data(), m_top, dim), xs::matrix_view<float>(local2.data(), m_local, dim));
  // The moved rows are the trained full tree's rows up to the order of the gradient sums.
  xsoftmax_test::check_close(top2, pick_rows<float>(w_ref, to.top_rows(), dim), 1e-6, 1e-3, "moved top rows");
  xsoftmax_test::check_close(local2, pick_rows<float>(w_ref, to.local_rows(rank), dim), 1e-6, 1e-3, "moved local rows");

  // And the head over the new layout computes the trained reference's losses.
  const sharded moved(to, comm, xs::matrix_view<float>(top2.data(), m_top, dim), xs::matrix_view<float>(local2.data(), m_local, dim));
  std::vector<float> per(static_cast<std::size_t>(hidden(rank).rows)), per_ref(per.size());
  xs::loss_options none;
  none.reduce = xs::reduction::none;
  moved.forward(hidden(rank), targets(rank), none, xs::vector_view<float>(per.data(), hidden(rank).rows));
  trained_ref.forward(hidden(rank), targets(rank), none, xs::vector_view<float>(per_ref.data(), hidden(rank).rows));
  xsoftmax_test::check_close(per, per_ref, 1e-6, 1e-3, "losses after the move");
}

TEST_CASE("class_frequency_tracker: decayed counts summed over the ranks drive a re-plan") {
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  xs::class_frequency_tracker tracker(classes, 0.5);
  const std::vector<index_t> first{1, 2, 2, -100, classes}, second{2, 7};  // ignored: -100 and N
  tracker.observe(xs::vector_view<const index_t>(first.data(), 5));
  tracker.observe(xs::vector_view<const index_t>(second.data(), 2));
  CHECK(tracker.batches() == 2);
  const std::vector<double> local = tracker.local_frequency();
  CHECK(local[1] == 0.5);
  CHECK(local[2] == 2 * 0.5 + 1);
  CHECK(local[7] == 1.0);
  CHECK(local[0] == 0.0);
  const std::vector<double> global = tracker.global_frequency(comm);
  CHECK(global[2] == 2.0 * size);
  CHECK(global[7] == 1.0 * size);

  // A long run stays finite (the scale factor is renormalised).
  xs::class_frequency_tracker longrun(classes, 0.5);
  for (int i = 0; i < 2000; ++i) longrun.observe(xs::vector_view<const index_t>(second.data(), 2));
  CHECK(std::isfinite(longrun.local_frequency()[2]));
  CHECK(longrun.local_frequency()[2] == doctest::Approx(2.0));  // 1 + 1/2 + 1/4 + ...

  // Targets drift into one subtree of a plan made for Zipf: the tracker sees it, the old plan's
  // expected imbalance is the rank count, and a plan made from the tracker's counts is balanced.
  const tree huffman = tree::huffman(zipf(classes));
  xs::hs_shard_options o;
  o.cut_depth = 3;
  o.class_frequency = zipf(classes);
  const plan_type plan(huffman, size, o);
  index_t hot = -1;
  for (index_t s = 0; s < plan.num_subtrees() && hot < 0; ++s)
    if (plan.subtree_classes(s).size() > 4) hot = s;
  REQUIRE(hot >= 0);
  xs::class_frequency_tracker drift(classes, 0.9);
  std::mt19937 g(40 + static_cast<unsigned>(rank));
  const std::vector<index_t>& hot_classes = plan.subtree_classes(hot);
  for (int b = 0; b < 5; ++b) {
    std::vector<index_t> batch;
    for (int i = 0; i < 64; ++i) batch.push_back(hot_classes[g() % hot_classes.size()]);
    drift.observe(xs::vector_view<const index_t>(batch.data(), 64));
  }
  const std::vector<double> seen = drift.global_frequency(comm);
  CHECK(xs::plan_imbalance(plan, seen) == doctest::Approx(size));
  xs::hs_shard_options replanned = o;
  replanned.class_frequency = seen;
  replanned.split_above = 1.0;
  const plan_type next(huffman, size, replanned);
  CHECK(xs::plan_imbalance(next, seen) < (size > 1 ? 0.5 * size + 0.5 : 1.0 + 1e-12));
  CHECK(xs::plan_imbalance(plan, o.class_frequency) == doctest::Approx(plan.expected_imbalance()));
}

TEST_CASE("hs_shard_plan with owner hints keeps subtrees where they are, within the slack") {
  xs::mpi_communicator comm;
  const int size = comm.size();
  const tree huffman = tree::huffman(zipf(classes));
  xs::hs_shard_options o;
  o.cut_depth = 5;
  o.class_frequency = zipf(classes);
  const plan_type plan(huffman, size, o);
  // Its own owners as hints: nothing moves (its LPT balance is within the default 5 % slack here).
  REQUIRE(plan.expected_imbalance() <= 1.05);
  xs::hs_shard_options same = o;
  same.class_owner_hint = plan.class_owners();
  const plan_type again(huffman, size, same);
  for (index_t s = 0; s < plan.num_subtrees(); ++s) CHECK(again.owner(s) == plan.owner(s));
  for (index_t rows : xs::reshard_rows_sent(plan, again)) CHECK(rows == 0);
  // Drifted frequencies: hinted re-planning moves fewer rows than planning from scratch, every rank
  // keeps a subtree, and the balance stays within the slack (on more than one rank).
  xs::hs_shard_options drifted = o;
  drifted.class_frequency = zipf(classes, 400);
  const plan_type fresh(huffman, size, drifted);
  drifted.class_owner_hint = plan.class_owners();
  drifted.keep_owner_slack = 0.1;
  const plan_type kept(huffman, size, drifted);
  index_t moved_fresh = 0, moved_kept = 0;
  for (index_t r : xs::reshard_rows_sent(plan, fresh)) moved_fresh += r;
  for (index_t r : xs::reshard_rows_sent(plan, kept)) moved_kept += r;
  CHECK(moved_kept <= moved_fresh);
  if (size > 1) CHECK(moved_kept < moved_fresh);
  for (int q = 0; q < size; ++q) CHECK_FALSE(kept.subtrees_of(q).empty());
  CHECK(kept.expected_imbalance() <= 1.1 * fresh.expected_imbalance() + 1e-9);
  // Bad hints.
  xs::hs_shard_options bad = o;
  bad.class_owner_hint.assign(classes, size);  // not a rank
  CHECK_THROWS_AS(plan_type(huffman, size, bad), xs::invalid_argument);
  bad.class_owner_hint.assign(3, 0);
  CHECK_THROWS_AS(plan_type(huffman, size, bad), xs::shape_error);
  bad = o;
  bad.keep_owner_slack = -1;
  CHECK_THROWS_AS(plan_type(huffman, size, bad), xs::invalid_argument);
}

TEST_CASE("hs_replanner proposes a plan on check batches only, and only when it is worth moving to") {
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  const tree huffman = tree::huffman(zipf(classes));
  xs::hs_shard_options o;
  o.cut_depth = 3;
  o.class_frequency = zipf(classes);
  o.split_above = 1.0;
  const plan_type plan(huffman, size, o);
  xs::hs_replan_options knobs;
  knobs.check_every = 3;
  xs::hs_replanner<> replanner(huffman, o, knobs);
  // Targets that follow the plan's own frequencies: no proposal.
  const std::vector<double> f = zipf(classes);
  std::discrete_distribution<index_t> pick(f.begin(), f.end());
  std::mt19937 g(70 + static_cast<unsigned>(rank));
  const auto draw = [&](const std::vector<index_t>& only) {
    std::vector<index_t> b(256);
    for (index_t& c : b) c = only.empty() ? pick(g) : only[g() % only.size()];
    return b;
  };
  for (int i = 0; i < 6; ++i) {
    const std::vector<index_t> b = draw({});
    replanner.observe(xs::vector_view<const index_t>(b.data(), 256));
    CHECK_FALSE(replanner.propose(plan, comm).has_value());
  }
  CHECK(replanner.last_imbalance() < 1.2);
  // Targets drift into one subtree: a proposal on the next check batch (the 9th), not before,
  // once there is more than one rank; the proposed plan balances the recent targets.
  index_t hot = -1;
  for (index_t s = 0; s < plan.num_subtrees() && hot < 0; ++s)
    if (plan.subtree_classes(s).size() > 4) hot = s;
  REQUIRE(hot >= 0);
  for (int i = 6; i < 9; ++i) {
    const std::vector<index_t> b = draw(plan.subtree_classes(hot));
    replanner.observe(xs::vector_view<const index_t>(b.data(), 256));
    const std::optional<plan_type> next = replanner.propose(plan, comm);
    if (i < 8 || size == 1) {
      CHECK_FALSE(next.has_value());
      continue;
    }
    REQUIRE(next.has_value());
    CHECK(replanner.last_imbalance() > 1.2);
    const std::vector<double> seen = replanner.tracker().global_frequency(comm);
    CHECK(xs::plan_imbalance(*next, seen) * knobs.gain <= replanner.last_imbalance());
  }
  xs::hs_replan_options bad;
  bad.check_every = 0;
  CHECK_THROWS_AS(xs::hs_replanner<>(huffman, o, bad), xs::invalid_argument);
  bad = {};
  bad.gain = 0.5;
  CHECK_THROWS_AS(xs::hs_replanner<>(huffman, o, bad), xs::invalid_argument);
  bad = {};
  bad.prior = 1.0;
  CHECK_THROWS_AS(xs::hs_replanner<>(huffman, o, bad), xs::invalid_argument);
  bad = {};
  bad.decay = 2.0;
  CHECK_THROWS_AS(xs::hs_replanner<>(huffman, o, bad), xs::invalid_argument);
}

TEST_CASE("reshard_hs_rows and class_frequency_tracker reject bad input with typed errors") {
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  const tree huffman = tree::huffman(zipf(classes));
  xs::hs_shard_options o;
  o.cut_depth = 3;
  const plan_type plan(huffman, size, o), other_ranks(huffman, size + 1, o);
  const tree smaller = tree::huffman(zipf(classes - 1));
  const plan_type other_tree(smaller, size, o);
  std::vector<float> top(plan.top_rows().size() * dim), local(plan.local_rows(rank).size() * dim);
  const index_t n_top = static_cast<index_t>(plan.top_rows().size());
  const index_t n_local = static_cast<index_t>(plan.local_rows(rank).size());
  const xs::matrix_view<const float> ct(top.data(), n_top, dim), cl(local.data(), n_local, dim);
  std::vector<float> out_top(top.size()), out_local(local.size());
  const xs::matrix_view<float> ot(out_top.data(), n_top, dim), ol(out_local.data(), n_local, dim);
  CHECK_THROWS_AS(xs::reshard_hs_rows(plan, other_ranks, comm, ct, cl, ot, ol), xs::invalid_argument);
  CHECK_THROWS_AS(xs::reshard_hs_rows(plan, other_tree, comm, ct, cl, ot, ol), xs::invalid_argument);
  const xs::matrix_view<float> short_top(out_top.data(), n_top - 1, dim);
  CHECK_THROWS_AS(xs::reshard_hs_rows(plan, plan, comm, ct, cl, short_top, ol), xs::shape_error);
  const xs::matrix_view<float> narrow(out_local.data(), n_local, dim - 1);
  CHECK_THROWS_AS(xs::reshard_hs_rows(plan, plan, comm, ct, cl, ot, narrow), xs::shape_error);
  CHECK_THROWS_AS(xs::class_frequency_tracker(0), xs::invalid_argument);
  CHECK_THROWS_AS(xs::class_frequency_tracker(10, 0.0), xs::invalid_argument);
  CHECK_THROWS_AS(xs::class_frequency_tracker(10, 1.5), xs::invalid_argument);
  CHECK_THROWS_AS((void)xs::plan_imbalance(plan, std::vector<double>(5, 1.0)), xs::shape_error);
  // After the rejections every rank still agrees (no rank is left inside a collective).
  xs::reshard_hs_rows(plan, plan, comm, ct, cl, ot, ol);
  CHECK(out_top == top);
}
