// SPDX-License-Identifier: Apache-2.0
// The prefetch of a class-sharded full softmax's rows (issue 14), under mpirun with 1 to 4 ranks:
// every verb taking a `gathered_batch` (forward, forward_backward, backward, log_prob, topk,
// forward_topk) gives
// bitwise the results of the verb taking `hidden`, in both layouts, with ignored rows (a rank with
// none kept too), other verbs' collectives run between the start and the use of the gather, also
// through a communicator without `start_all_gather` (the blocking fallback) and through
// solo_communicator; the misuse of a gathered batch is rejected with typed errors;
// mpi_communicator::start_all_gather equals its all_gather.

#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;

constexpr index_t classes = 211, dim = 12, ignore = -100;

/// mpi_communicator without `start_all_gather`: a communicator as the PyTorch package's is.
struct blocking_only {
  xs::mpi_communicator mpi = xs::mpi_communicator(MPI_COMM_WORLD);
  [[nodiscard]] int rank() const { return mpi.rank(); }
  [[nodiscard]] int size() const { return mpi.size(); }
  template <class T>
  void all_reduce(T* d, index_t n, xs::reduce_op op) { mpi.all_reduce(d, n, op); }
  template <class T>
  void all_gather(const T* s, index_t n, T* r, const index_t* c) { mpi.all_gather(s, n, r, c); }
  template <class T>
  void reduce_scatter(const T* s, T* r, const index_t* c) { mpi.reduce_scatter(s, r, c); }
};
static_assert(xs::detail::has_start_all_gather<xs::mpi_communicator, float>);
static_assert(!xs::detail::has_start_all_gather<blocking_only, float>);

/// Rank q's batch `s` of a sequence: 4 + 3q + s rows of H, targets ignored every fourth row, and
/// every row of rank 1 in batch 1 (a rank with no kept row still takes part).
template <class H>
struct batch {
  std::vector<H> h;
  std::vector<index_t> t;
  index_t rows = 0;
  batch(int q, int s) : rows(4 + 3 * q + s) {
    std::mt19937 g(1000 + 17 * static_cast<unsigned>(q) + static_cast<unsigned>(s));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (index_t i = 0; i < rows * dim; ++i) h.push_back(static_cast<H>(nd(g)));
    for (index_t i = 0; i < rows; ++i)
      t.push_back((i % 4 == 3 || (q == 1 && s == 1)) ? ignore : static_cast<index_t>(g() % classes));
  }
  [[nodiscard]] xs::matrix_view<const H> hidden() const { return {h.data(), rows, dim}; }
  [[nodiscard]] xs::vector_view<const index_t> targets() const { return {t.data(), rows}; }
};

template <class B, class Comm>
xs::full_softmax<xs::fp32, B, xs::class_sharding<Comm>> make_head(Comm comm, xs::hidden_layout layout) {
  using sharding = xs::class_sharding<Comm>;
  sharding sh(std::move(comm), classes, layout);
  xs::init_options init;
  init.seed = 5;
  return xs::full_softmax<xs::fp32, B, sharding>(sh, dim, true, init);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
template <class G>
bool same_gradient(const G& a, const G& b) {
  using fv = std::vector<float>;
  return same_bits(std::vector<index_t>(a.rows.begin(), a.rows.end()),
                   std::vector<index_t>(b.rows.begin(), b.rows.end())) &&
         same_bits(fv(a.values.begin(), a.values.end()), fv(b.values.begin(), b.values.end())) &&
         same_bits(std::vector<float>(a.bias_values.begin(), a.bias_values.end()),
                   std::vector<float>(b.bias_values.begin(), b.bias_values.end()));
}

/// A sequence of three micro-batches, each verb run on the prefetched batch s + 1 while batch s
/// still has to be scored (so the gather of s + 1 is pending through batch s's collectives),
/// against the same verbs on `hidden`.
template <class B, class H, class Comm>
void prefetched_equals_blocking(Comm comm, xs::hidden_layout layout) {
  const auto head = make_head<B>(comm, layout);
  using head_t = std::remove_const_t<decltype(head)>;
  const int rank = head.sharding().rank();
  const int me = layout == xs::hidden_layout::replicated ? 0 : rank;  // replicated: rank 0's batches
  std::vector<batch<H>> batches;
  for (int s = 0; s < 3; ++s) batches.emplace_back(me, s);
  xs::loss_options mean, smooth, none;
  smooth.reduce = xs::reduction::sum;
  smooth.label_smoothing = 0.1f;
  smooth.z_loss = 1e-3f;
  none.reduce = xs::reduction::none;
  for (const xs::loss_options& o : {mean, smooth, none}) {
    CAPTURE(static_cast<int>(o.reduce));
    typename head_t::gathered_batch next = head.gather_rows_async(batches[0].hidden());
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const batch<H>& b = batches[static_cast<std::size_t>(s)];
      typename head_t::gathered_batch current = std::move(next);
      CHECK(current.usable());
      CHECK(current.rows() == b.rows);
      if (s + 1 < 3) next = head.gather_rows_async(batches[static_cast<std::size_t>(s) + 1].hidden());
      // The reference runs first: its collectives go while the prefetched gathers are pending.
      const index_t n = b.rows;
      std::vector<float> gh_a(static_cast<std::size_t>(n * dim)), gh_b(gh_a.size()), per_a(n), per_b(n);
      std::vector<float> up(static_cast<std::size_t>(n));
      for (index_t i = 0; i < n; ++i) up[static_cast<std::size_t>(i)] = 0.5f + 0.1f * static_cast<float>(i);
      const xs::vector_view<const float> grad_output =
          o.reduce == xs::reduction::none ? xs::vector_view<const float>(up.data(), n) : xs::vector_view<const float>();
      typename head_t::gradient_type gw_a, gw_b;
      const float la = head.forward_backward(b.hidden(), b.targets(), xs::matrix_view<float>(gh_a.data(), n, dim), gw_a,
                                             o, xs::vector_view<float>(per_a.data(), n), grad_output);
      const float lb = head.forward_backward(current, b.targets(), xs::matrix_view<float>(gh_b.data(), n, dim), gw_b, o,
                                             xs::vector_view<float>(per_b.data(), n), grad_output);
      CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
      CHECK(same_bits(per_a, per_b));
      CHECK(same_bits(gh_a, gh_b));
      CHECK(same_gradient(gw_a, gw_b));
      CHECK_FALSE(current.usable());
      // forward and backward, each on a batch gathered for it.
      auto again = head.gather_rows_async(b.hidden());
      const float fa = head.forward(b.hidden(), b.targets(), o, xs::vector_view<float>(per_a.data(), n));
      const float fb = head.forward(again, b.targets(), o, xs::vector_view<float>(per_b.data(), n));
      CHECK(std::memcmp(&fa, &fb, sizeof fa) == 0);
      CHECK(same_bits(per_a, per_b));
      auto third = head.gather_rows_async(b.hidden());
      head.backward(b.hidden(), b.targets(), xs::matrix_view<float>(gh_a.data(), n, dim), gw_a, o, grad_output);
      head.backward(third, b.targets(), xs::matrix_view<float>(gh_b.data(), n, dim), gw_b, o, grad_output);
      CHECK(same_bits(gh_a, gh_b));
      CHECK(same_gradient(gw_a, gw_b));
    }
  }
  // log_prob and top-k (every target a class; k past a rank's class count too).
  const batch<H>& b = batches[2];
  const index_t n = b.rows;
  std::vector<index_t> t(b.t);
  for (auto& x : t) x = x == ignore ? 7 : x;
  const xs::vector_view<const index_t> tv(t.data(), n);
  auto g = head.gather_rows_async(b.hidden());
  std::vector<float> lp_a(n), lp_b(n);
  head.log_prob(b.hidden(), tv, xs::vector_view<float>(lp_a.data(), n));
  head.log_prob(g, tv, xs::vector_view<float>(lp_b.data(), n));
  CHECK(same_bits(lp_a, lp_b));
  for (index_t k : {index_t(1), index_t(4), index_t(60)}) {  // 60 > the 52 or 53 classes of a rank of 4
    CAPTURE(k);
    auto gk = head.gather_rows_async(b.hidden());
    std::vector<index_t> c_a(static_cast<std::size_t>(n * k)), c_b(c_a.size());
    std::vector<float> v_a(c_a.size()), v_b(c_a.size());
    head.topk(b.hidden(), k, xs::matrix_view<index_t>(c_a.data(), n, k), xs::matrix_view<float>(v_a.data(), n, k));
    head.topk(gk, k, xs::matrix_view<index_t>(c_b.data(), n, k), xs::matrix_view<float>(v_b.data(), n, k));
    CHECK(c_a == c_b);
    CHECK(same_bits(v_a, v_b));
    // The loss and the top-k in one pass (ignored targets: -1 / -inf rows), on a batch gathered for it.
    auto gf = head.gather_rows_async(b.hidden());
    std::vector<float> per_a(n), per_b(n);
    const float la = head.forward_topk(b.hidden(), b.targets(), k, xs::matrix_view<index_t>(c_a.data(), n, k),
                                       xs::matrix_view<float>(v_a.data(), n, k), {}, xs::vector_view<float>(per_a.data(), n));
    const float lb = head.forward_topk(gf, b.targets(), k, xs::matrix_view<index_t>(c_b.data(), n, k),
                                       xs::matrix_view<float>(v_b.data(), n, k), {}, xs::vector_view<float>(per_b.data(), n));
    CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
    CHECK(same_bits(per_a, per_b));
    CHECK(c_a == c_b);
    CHECK(same_bits(v_a, v_b));
    CHECK_FALSE(gf.usable());
  }
}

}  // namespace

TEST_CASE_TEMPLATE("prefetched rows: every verb is bitwise the verb on hidden", B, xs::serial, xs::omp) {
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    CAPTURE(static_cast<int>(layout));
    prefetched_equals_blocking<B, float>(xs::mpi_communicator(), layout);
    prefetched_equals_blocking<B, double>(xs::mpi_communicator(), layout);  // widened to fp32 alike
  }
}

TEST_CASE("prefetched rows through a communicator without start_all_gather (blocking fallback)") {
  prefetched_equals_blocking<xs::serial, float>(blocking_only{}, xs::hidden_layout::data_parallel);
}

TEST_CASE("prefetched rows through solo_communicator (one rank, a copy; each MPI rank on its own)") {
  static_assert(xs::detail::has_start_all_gather<xs::solo_communicator, float>);
  prefetched_equals_blocking<xs::omp, float>(xs::solo_communicator{}, xs::hidden_layout::data_parallel);
}

TEST_CASE("prefetched rows: misuse is rejected with typed errors, and nothing is consumed") {
  const auto head = make_head<xs::serial>(xs::mpi_communicator(), xs::hidden_layout::data_parallel);
  const auto other = make_head<xs::serial>(xs::mpi_communicator(), xs::hidden_layout::data_parallel);
  using head_t = std::remove_const_t<decltype(head)>;
  const batch<float> b(head.sharding().rank(), 0);
  const index_t n = b.rows;
  std::vector<float> gh(static_cast<std::size_t>(n * dim)), small(static_cast<std::size_t>((n - 1) * dim));
  typename head_t::gradient_type gw;
  const xs::matrix_view<float> ghv(gh.data(), n, dim);

  head_t::gathered_batch empty;
  CHECK_FALSE(empty.usable());
  CHECK_THROWS_AS(head.forward(empty, b.targets()), xs::invalid_argument);
  auto g = head.gather_rows_async(b.hidden());
  CHECK_THROWS_AS(other.forward(g, b.targets()), xs::invalid_argument);                       // another head's
  CHECK_THROWS_AS(head.forward(g, xs::vector_view<const index_t>(b.t.data(), n - 1)), xs::shape_error);
  CHECK_THROWS_AS(head.forward_backward(g, b.targets(), xs::matrix_view<float>(small.data(), n - 1, dim), gw),
                  xs::shape_error);
  std::vector<index_t> bad(b.t);
  bad[0] = classes;
  CHECK_THROWS_AS(head.forward(g, xs::vector_view<const index_t>(bad.data(), n)), xs::out_of_range);
  std::vector<index_t> c(static_cast<std::size_t>(n));
  std::vector<float> v(static_cast<std::size_t>(n));
  CHECK_THROWS_AS(head.topk(g, 0, xs::matrix_view<index_t>(c.data(), n, 1), xs::matrix_view<float>(v.data(), n, 1)),
                  xs::invalid_argument);
  // None of those consumed it: the batch still gives the verb's result, once.
  CHECK(g.usable());
  const float want = head.forward_backward(b.hidden(), b.targets(), ghv, gw);
  const float got = head.forward_backward(g, b.targets(), ghv, gw);
  CHECK(std::memcmp(&want, &got, sizeof want) == 0);
  CHECK_THROWS_AS(head.forward_backward(g, b.targets(), ghv, gw), xs::invalid_argument);  // used twice
  auto moved = head.gather_rows_async(b.hidden());
  auto taken = std::move(moved);
  CHECK_THROWS_AS(head.forward(moved, b.targets()), xs::invalid_argument);  // NOLINT: moved from on purpose
  const float fa = head.forward(b.hidden(), b.targets()), fb = head.forward(taken, b.targets());
  CHECK(std::memcmp(&fa, &fb, sizeof fa) == 0);
  // A batch dropped unused: its gather completes on destruction (every rank drops it alike).
  { auto dropped = head.gather_rows_async(b.hidden()); }
  std::vector<float> bad_h(b.h);
  bad_h[3] = NAN;
  CHECK_THROWS_AS(head.gather_rows_async(xs::matrix_view<const float>(bad_h.data(), n, dim)), xs::non_finite_error);
  CHECK_THROWS_AS(head.gather_rows_async(xs::matrix_view<const float>(b.h.data(), n, dim - 1)), xs::shape_error);
}

TEST_CASE("mpi_communicator::start_all_gather equals all_gather (unequal counts, an empty block)") {
  xs::mpi_communicator comm;
  const int rank = comm.rank(), size = comm.size();
  std::vector<index_t> counts(static_cast<std::size_t>(size));
  index_t total = 0;
  for (int q = 0; q < size; ++q) total += counts[static_cast<std::size_t>(q)] = q == 1 ? 0 : 3 * q + 2;
  const index_t mine = counts[static_cast<std::size_t>(rank)];
  std::vector<float> send(static_cast<std::size_t>(mine));
  for (index_t i = 0; i < mine; ++i) send[static_cast<std::size_t>(i)] = 10.f * rank + static_cast<float>(i);
  std::vector<float> a(static_cast<std::size_t>(total) + 1, -1.f), b(a);
  auto r = comm.start_all_gather(send.data(), mine, a.data(), std::vector<index_t>(counts).data());  // counts may go
  comm.all_gather(send.data(), mine, b.data(), counts.data());  // another collective meanwhile
  auto moved = std::move(r);
  moved.wait();
  CHECK(moved.test());
  CHECK(a == b);
  CHECK(a.back() == -1.f);
  CHECK_THROWS_AS([&] { auto bad = comm.start_all_gather(send.data(), mine + 1, a.data(), counts.data()); }(),
                  xs::invalid_argument);
}
