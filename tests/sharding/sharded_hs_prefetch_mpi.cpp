// SPDX-License-Identifier: Apache-2.0
// The sharded hierarchical softmax's prefetch over mpi_communicator (1 to 4 ranks): a sequence of
// micro-batches routed ahead (`route_rows_async` of batch s+1 before batch s's verb, as a training
// loop does) gives bitwise the results of the verbs taking `hidden` and `targets` — loss,
// per-sample values, grad_hidden, both weight gradients, log_prob — for reductions mean, sum and
// none (with per-row upstream gradients), with ignored rows (the default ignore_index, and an
// ignore_index that is a class: rows that were routed but must be dropped), a rank whose rows are
// all ignored, and a rank with an empty routing; and misuse is rejected with typed errors.

#include <xsoftmax/sharding/mpi_communicator.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using tree = xs::runtime_tree<>;

constexpr index_t classes = 517, dim = 10, ignore = -100;
constexpr index_t deep = classes - 1;  ///< the rarest class: below the frontier (checked), routed

std::vector<double> zipf(index_t n) {
  std::vector<double> f(static_cast<std::size_t>(n));
  for (index_t c = 0; c < n; ++c) f[static_cast<std::size_t>(c)] = 1.0 / static_cast<double>(c + 1);
  return f;
}

struct batch {
  std::vector<float> h;
  std::vector<index_t> t;
  index_t rows = 0;
  [[nodiscard]] xs::matrix_view<const float> hidden() const { return {h.data(), rows, dim}; }
  [[nodiscard]] xs::vector_view<const index_t> targets() const { return {t.data(), rows}; }
};

/// Rank q's batch s: 3 + 2q + s rows; every fifth target ignored (ignore_index: -100 on even
/// steps, class `deep` on odd ones, which a prefetch routes and the verb drops), every seventh `deep`;
/// rank 1's batch 1 wholly ignored.
batch batch_of(int q, int s) {
  batch b;
  b.rows = 3 + 2 * q + s;
  std::mt19937 g(700 + 31 * static_cast<unsigned>(q) + static_cast<unsigned>(s));
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::vector<double> f = zipf(classes);
  std::discrete_distribution<index_t> pick(f.begin(), f.end());
  for (index_t i = 0; i < b.rows * dim; ++i) b.h.push_back(nd(g));
  for (index_t i = 0; i < b.rows; ++i)
    b.t.push_back((i % 5 == 4 || (q == 1 && s == 1)) ? (s % 2 ? deep : ignore) : i % 7 == 6 ? deep : pick(g));
  return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// What one step gives: loss, per-sample values, grad_hidden, both gradients (rows and values).
struct outcome {
  float loss = 0.f;
  std::vector<float> per_sample, grad_hidden, top_values, local_values;
  std::vector<index_t> top_rows, local_rows;
  void check_equal(const outcome& o) const {
    CHECK(std::memcmp(&loss, &o.loss, sizeof loss) == 0);
    CHECK(same_bits(per_sample, o.per_sample));
    CHECK(same_bits(grad_hidden, o.grad_hidden));
    CHECK(same_bits(top_values, o.top_values));
    CHECK(same_bits(local_values, o.local_values));
    CHECK(top_rows == o.top_rows);
    CHECK(local_rows == o.local_rows);
  }
};

template <class Comm, class B>
void compare_prefetch(Comm comm, int steps) {
  using head_type = xs::sharded_hierarchical_softmax<Comm, xs::softmax_nodes, xs::fp32, B>;
  const int rank = comm.rank();
  xs::hs_shard_options o;
  o.cut_depth = 4;
  const typename head_type::plan_type plan(tree::huffman(zipf(classes)), comm.size(), o);
  REQUIRE(plan.subtree_of(deep) >= 0);
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 0.4f);
  const index_t n_top = static_cast<index_t>(plan.top_rows().size()),
                n_local = static_cast<index_t>(plan.local_rows(rank).size());
  std::vector<float> top_w(static_cast<std::size_t>(n_top * dim)), local_w(static_cast<std::size_t>(n_local * dim)),
      top_b(static_cast<std::size_t>(n_top)), local_b(static_cast<std::size_t>(n_local));
  for (auto* v : {&top_w, &top_b}) for (auto& x : *v) x = nd(g);
  std::mt19937 gl(50 + static_cast<unsigned>(rank));
  for (auto* v : {&local_w, &local_b}) for (auto& x : *v) x = nd(gl);
  const head_type head(plan, comm, xs::matrix_view<float>(top_w.data(), n_top, dim),
                       xs::matrix_view<float>(local_w.data(), n_local, dim), top_b.data(), local_b.data());
  std::vector<batch> data;
  for (int s = 0; s < steps; ++s) data.push_back(batch_of(rank, s));

  // Step s's options: mean, sum (scaled upstream), none (per-row upstream); `deep` ignored on odd steps.
  const auto options_of = [](int s) {
    xs::loss_options opt;
    opt.reduce = s % 3 == 0 ? xs::reduction::mean : s % 3 == 1 ? xs::reduction::sum : xs::reduction::none;
    opt.ignore_index = s % 2 == 1 ? deep : ignore;
    return opt;
  };
  const auto run = [&](int s, typename head_type::routed_batch* routed) {
    const batch& b = data[static_cast<std::size_t>(s)];
    const xs::loss_options opt = options_of(s);
    outcome out;
    out.per_sample.assign(static_cast<std::size_t>(b.rows), -1.f);
    out.grad_hidden.assign(static_cast<std::size_t>(b.rows * dim), -1.f);
    std::vector<float> up(static_cast<std::size_t>(b.rows));
    for (index_t i = 0; i < b.rows; ++i) up[static_cast<std::size_t>(i)] = 0.5f + 0.25f * static_cast<float>(i % 3);
    const xs::vector_view<const float> grad_output =
        opt.reduce == xs::reduction::none ? xs::vector_view<const float>(up.data(), b.rows)
        : opt.reduce == xs::reduction::sum ? xs::vector_view<const float>(up.data(), 1)
                                           : xs::vector_view<const float>();
    typename head_type::gradient_type gt, gl;
    const xs::matrix_view<float> gh(out.grad_hidden.data(), b.rows, dim);
    const xs::vector_view<float> ps(out.per_sample.data(), b.rows);
    out.loss = routed ? head.forward_backward(*routed, gh, gt, gl, opt, ps, grad_output)
                      : head.forward_backward(b.hidden(), b.targets(), gh, gt, gl, opt, ps, grad_output);
    out.top_values.assign(gt.values.begin(), gt.values.end());
    out.top_values.insert(out.top_values.end(), gt.bias_values.begin(), gt.bias_values.end());
    out.local_values.assign(gl.values.begin(), gl.values.end());
    out.local_values.insert(out.local_values.end(), gl.bias_values.begin(), gl.bias_values.end());
    out.top_rows.assign(gt.rows.begin(), gt.rows.end());
    out.local_rows.assign(gl.rows.begin(), gl.rows.end());
    return out;
  };

  // Training: batch s+1 routed before batch s's verb.
  auto next = head.route_rows_async(data[0].hidden(), data[0].targets());
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    auto current = std::move(next);
    CHECK(!next.usable());
    if (s + 1 < steps) next = head.route_rows_async(data[s + 1].hidden(), data[s + 1].targets());
    REQUIRE(current.usable());
    CHECK(current.rows() == data[static_cast<std::size_t>(s)].rows);
    const outcome prefetched = run(s, &current);
    CHECK(!current.usable());
    run(s, nullptr).check_equal(prefetched);
  }
  // forward and log_prob (`deep` is a class to log_prob, whatever a loss ignores).
  for (int s = 0; s < steps; ++s) {
    batch b = data[static_cast<std::size_t>(s)];
    const xs::loss_options opt = options_of(s);
    std::vector<float> a(static_cast<std::size_t>(b.rows)), c(a.size());
    auto r = head.route_rows_async(b.hidden(), b.targets());
    const float fa = head.forward(r, opt, {a.data(), b.rows});
    const float fc = head.forward(b.hidden(), b.targets(), opt, {c.data(), b.rows});
    CHECK(std::memcmp(&fa, &fc, sizeof fa) == 0);
    CHECK(same_bits(a, c));
    for (auto& t : b.t) t = t == ignore ? 3 : t;
    auto l = head.route_rows_async(b.hidden(), b.targets());
    head.log_prob(l, {a.data(), b.rows});
    head.log_prob(b.hidden(), b.targets(), {c.data(), b.rows});
    CHECK(same_bits(a, c));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("sharded HS prefetch: routed batches give bitwise the verbs on hidden", B, xs::serial, xs::omp) {
  compare_prefetch<xs::mpi_communicator, B>(xs::mpi_communicator(), 5);
}

TEST_CASE("sharded HS prefetch through solo_communicator (one rank, a copy; each MPI rank on its own)") {
  compare_prefetch<xs::solo_communicator, xs::serial>(xs::solo_communicator(), 4);
}

TEST_CASE("sharded HS prefetch: misuse is rejected with typed errors, and nothing is consumed") {
  using head_type = xs::sharded_hierarchical_softmax<xs::mpi_communicator>;
  xs::mpi_communicator comm;
  xs::hs_shard_options o;
  o.cut_depth = 3;
  const head_type::plan_type plan(tree::huffman(zipf(classes)), comm.size(), o);
  const index_t n_top = static_cast<index_t>(plan.top_rows().size()),
                n_local = static_cast<index_t>(plan.local_rows(comm.rank()).size());
  std::vector<float> top_w(static_cast<std::size_t>(n_top * dim), 0.1f), local_w(static_cast<std::size_t>(n_local * dim), 0.1f);
  const head_type a(plan, comm, {top_w.data(), n_top, dim}, {local_w.data(), n_local, dim});
  const head_type other(plan, comm, {top_w.data(), n_top, dim}, {local_w.data(), n_local, dim});
  batch b = batch_of(comm.rank(), 0);
  b.t[0] = ignore;
  std::vector<float> out(static_cast<std::size_t>(b.rows));
  // Checked before the routing (every rank throws alike: no collective is entered).
  std::vector<float> bad = b.h;
  bad[1] = NAN;
  CHECK_THROWS_AS((void)a.route_rows_async({bad.data(), b.rows, dim}, b.targets()), xs::non_finite_error);
  CHECK_THROWS_AS((void)a.route_rows_async(b.hidden(), {b.t.data(), b.rows - 1}), xs::shape_error);
  CHECK_THROWS_AS((void)a.route_rows_async({b.h.data(), b.rows, dim - 1}, b.targets()), xs::shape_error);
  head_type::routed_batch empty;
  CHECK(!empty.usable());
  CHECK_THROWS_AS(a.forward(empty), xs::invalid_argument);
  auto r = a.route_rows_async(b.hidden(), b.targets());
  CHECK_THROWS_AS(other.forward(r), xs::invalid_argument);                          // another head's
  CHECK_THROWS_AS(a.log_prob(r, {out.data(), b.rows - 1}), xs::shape_error);        // wrong output
  CHECK_THROWS_AS(a.log_prob(r, {out.data(), b.rows}), xs::out_of_range);           // ignored rows: not classes
  CHECK(r.usable());                                                                // nothing consumed
  const float loss = a.forward(r);
  CHECK(std::isfinite(loss));
  CHECK_THROWS_AS(a.forward(r), xs::invalid_argument);                              // used once
  auto moved = std::move(r);
  CHECK_THROWS_AS(a.forward(r), xs::invalid_argument);                              // moved from
}
