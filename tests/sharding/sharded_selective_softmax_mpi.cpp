// SPDX-License-Identifier: Apache-2.0
// selective_softmax and knn_softmax over class_sharding<mpi_communicator>, run by ctest under mpirun
// with 1, 2, 3 and 4 ranks (1003 classes: no rank count divides them). Oracle: the unsharded head on
// the same weights and selector, over the concatenated batch (data-parallel: every rank's rows in
// rank order) or the batch (replicated), with each rank's reduction expressed as a per-sample
// upstream gradient. Every verb is compared — loss, per-sample losses, grad_hidden of the rank's
// rows, the rank's weight-gradient rows (and which rows), log_prob, top-k — for explicit shared
// and per-sample candidates, sampled negatives (two steps) and the KNN graph, with label smoothing,
// z-loss and angular margins; repeated runs are bitwise equal; bad shards are rejected.

#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selective_softmax.hpp>

#include "sharded_checks.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using sharding = xs::class_sharding<xs::mpi_communicator>;
using xsoftmax_test::check_close;

constexpr index_t classes = 1003, dim = 16, ignore = -100;

struct layer : xsoftmax_test::seeded_layer {
  layer() : seeded_layer(classes, dim, 11) {}
};

/// Rank q's batch: 5 + 2q rows, every fourth target ignored, targets in [0, span); rank 1's targets
/// all ignored when `rank1_idle`.
using batch = xsoftmax_test::row_batch;
batch batch_of(int q, bool rank1_idle = false, index_t span = classes) {
  batch b;
  b.rows = 5 + 2 * q;
  std::mt19937 g(200 + static_cast<unsigned>(q));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (index_t i = 0; i < b.rows * dim; ++i) b.h.push_back(nd(g));
  for (index_t i = 0; i < b.rows; ++i)
    b.t.push_back((i % 4 == 3 || (rank1_idle && q == 1)) ? ignore : static_cast<index_t>(g() % span));
  return b;
}
batch concat(const std::vector<batch>& all) {
  batch c;
  for (const batch& b : all) {
    c.h.insert(c.h.end(), b.h.begin(), b.h.end());
    c.t.insert(c.t.end(), b.t.begin(), b.t.end());
    c.rows += b.rows;
  }
  return c;
}
xs::matrix_view<const float> hidden(const batch& b) { return {b.h.data(), b.rows, dim}; }
xs::vector_view<const index_t> targets(const batch& b) { return {b.t.data(), b.rows}; }

/// The batches of a layout: every rank's (data-parallel), or rank 0's on every rank (replicated).
std::vector<batch> batches_of(xs::hidden_layout layout, int size, bool idle = false, index_t span = classes) {
  std::vector<batch> all;
  if (layout == xs::hidden_layout::replicated) return {batch_of(0, false, span)};
  for (int q = 0; q < size; ++q) all.push_back(batch_of(q, idle, span));
  return all;
}

/// Per-sample candidates of the concatenated batch of `rows` samples (3 to 9 classes each).
xs::explicit_candidates per_sample_candidates(index_t rows) {
  std::mt19937 g(5);
  std::vector<index_t> off{0}, ids;
  for (index_t i = 0; i < rows; ++i) {
    const index_t m = 3 + static_cast<index_t>(g() % 7);
    for (index_t j = 0; j < m; ++j) ids.push_back(static_cast<index_t>(g() % classes));
    off.push_back(static_cast<index_t>(ids.size()));
  }
  xs::explicit_candidates c;
  c.set_per_sample(std::move(off), std::move(ids));
  return c;
}
xs::explicit_candidates shared_candidates() {
  std::mt19937 g(6);
  std::vector<index_t> ids;
  for (int j = 0; j < 150; ++j) ids.push_back(static_cast<index_t>(g() % classes));
  xs::explicit_candidates c;
  c.set_shared(std::move(ids));
  return c;
}

std::vector<xs::loss_options> option_sets() { return xsoftmax_test::sharded_option_sets(2e-3f); }

/// The sharded head's verbs against the unsharded `ref` on the concatenated batch. `all`: the
/// batches of the layout; this rank's is all[own] (own = 0 when replicated).
template <class Head, class Ref>
void compare(const Head& head, const Ref& ref, const std::vector<batch>& all, std::size_t own,
             const xs::loss_options& o) {
  const batch c = concat(all), &mine = all[own];
  index_t first = 0;
  for (std::size_t q = 0; q < own; ++q) first += all[q].rows;
  // Each rank's reduction as a per-sample upstream gradient of the reference's per-sample losses.
  std::vector<float> upstream(static_cast<std::size_t>(c.rows), 1.f);
  for (std::size_t q = 0, i0 = 0; q < all.size(); i0 += static_cast<std::size_t>(all[q].rows), ++q) {
    index_t kept = 0;
    for (index_t t : all[q].t) kept += t != ignore ? 1 : 0;
    if (o.reduce == xs::reduction::mean)
      for (index_t i = 0; i < all[q].rows; ++i) upstream[i0 + static_cast<std::size_t>(i)] = kept ? 1.f / kept : 0.f;
  }
  xs::loss_options none = o;
  none.reduce = xs::reduction::none;
  std::vector<float> ref_gh(c.h.size()), ref_per(static_cast<std::size_t>(c.rows));
  typename Ref::gradient_type ref_g;
  ref.forward_backward(hidden(c), targets(c), xs::matrix_view<float>(ref_gh.data(), c.rows, dim), ref_g, none,
                       xs::vector_view<float>(ref_per.data(), c.rows),
                       xs::vector_view<const float>(upstream.data(), c.rows));

  std::vector<float> gh(mine.h.size()), per(static_cast<std::size_t>(mine.rows));
  typename Head::gradient_type g;
  const xs::vector_view<float> per_view(per.data(), mine.rows);
  const float loss =
      head.forward_backward(hidden(mine), targets(mine), xs::matrix_view<float>(gh.data(), mine.rows, dim), g, o, per_view);
  const std::vector<float> ref_mine(ref_per.begin() + first, ref_per.begin() + first + mine.rows);
  check_close(per, ref_mine, 1e-6, 1e-3, "per_sample");
  check_close(gh, std::vector<float>(ref_gh.begin() + first * dim, ref_gh.begin() + (first + mine.rows) * dim), 1e-6,
              1e-5, "grad_hidden");
  if (o.reduce != xs::reduction::none) {
    double sum = 0;
    index_t kept = 0;
    for (index_t i = 0; i < mine.rows; ++i)
      if (mine.t[static_cast<std::size_t>(i)] != ignore) sum += ref_mine[static_cast<std::size_t>(i)], ++kept;
    const float ref_loss = static_cast<float>(o.reduce == xs::reduction::mean ? (kept ? sum / kept : 0.0) : sum);
    check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
    CHECK(head.forward(hidden(mine), targets(mine), o) == doctest::Approx(ref_loss).epsilon(1e-6));
  }

  // The local weight gradient: the reference's rows of this rank's range, as local rows.
  const index_t begin = head.class_begin(), local = head.local_classes();
  std::vector<index_t> ref_rows, rows(g.rows.begin(), g.rows.end());
  std::vector<float> ref_dense(static_cast<std::size_t>(local * (dim + 1)), 0.f), dense(ref_dense.size(), 0.f);
  for (index_t i = 0; i < ref_g.num_rows(); ++i) {
    const index_t cl = ref_g.rows[static_cast<std::size_t>(i)] - begin;
    if (cl < 0 || cl >= local) continue;
    ref_rows.push_back(cl);
    for (index_t j = 0; j < dim; ++j) ref_dense[cl * (dim + 1) + j] = ref_g.values[static_cast<std::size_t>(i * dim + j)];
    if (!ref_g.bias_values.empty()) ref_dense[cl * (dim + 1) + dim] = ref_g.bias_values[static_cast<std::size_t>(i)];
  }
  CHECK(rows == ref_rows);
  for (index_t i = 0; i < g.num_rows(); ++i) {
    const index_t cl = g.rows[static_cast<std::size_t>(i)];
    REQUIRE((cl >= 0 && cl < local));
    for (index_t j = 0; j < dim; ++j) dense[cl * (dim + 1) + j] = g.values[static_cast<std::size_t>(i * dim + j)];
    if (!g.bias_values.empty()) dense[cl * (dim + 1) + dim] = g.bias_values[static_cast<std::size_t>(i)];
  }
  check_close(dense, ref_dense, 1e-6, 1e-5, "grad_weights");

  // Bitwise the same on a repeated run.
  std::vector<float> gh2(gh.size()), per2(per.size());
  typename Head::gradient_type g2;
  const float loss2 = head.forward_backward(hidden(mine), targets(mine), xs::matrix_view<float>(gh2.data(), mine.rows, dim),
                                            g2, o, xs::vector_view<float>(per2.data(), mine.rows));
  CHECK(std::memcmp(&loss, &loss2, sizeof loss) == 0);
  CHECK(gh == gh2);
  CHECK(per == per2);
  CHECK(std::vector<float>(g.values.begin(), g.values.end()) == std::vector<float>(g2.values.begin(), g2.values.end()));
}

/// log_prob (over the active set of the whole batch, as unsharded) and top-k (every class).
template <class Head, class Ref>
void compare_prediction(const Head& head, const Ref& ref, std::vector<batch> all, std::size_t own) {
  for (batch& b : all)
    for (auto& t : b.t) t = t == ignore ? 0 : t;  // log_prob ignores nothing
  const batch c = concat(all), &mine = all[own];
  index_t first = 0;
  for (std::size_t q = 0; q < own; ++q) first += all[q].rows;
  std::vector<float> lp(static_cast<std::size_t>(mine.rows)), ref_lp(static_cast<std::size_t>(c.rows));
  head.log_prob(hidden(mine), targets(mine), xs::vector_view<float>(lp.data(), mine.rows));
  ref.log_prob(hidden(c), targets(c), xs::vector_view<float>(ref_lp.data(), c.rows));
  check_close(lp, std::vector<float>(ref_lp.begin() + first, ref_lp.begin() + first + mine.rows), 1e-6, 1e-3,
              "log_prob");
  for (index_t k : {index_t(1), index_t(7), index_t(300)}) {  // 300 > the 250 classes of a rank of 4
    std::vector<index_t> cl(static_cast<std::size_t>(mine.rows * k)), ref_cl(cl.size());
    std::vector<float> v(cl.size()), ref_v(cl.size());
    head.topk(hidden(mine), k, xs::matrix_view<index_t>(cl.data(), mine.rows, k),
              xs::matrix_view<float>(v.data(), mine.rows, k));
    ref.topk(hidden(mine), k, xs::matrix_view<index_t>(ref_cl.data(), mine.rows, k),
             xs::matrix_view<float>(ref_v.data(), mine.rows, k));
    CAPTURE(k);
    CHECK(cl == ref_cl);
    check_close(v, ref_v, 1e-6, 1e-3, "topk log_probs");
  }
  std::vector<float> out(static_cast<std::size_t>(mine.rows * 2));
  CHECK_THROWS_AS(head.log_distribution(hidden(mine), 0, 2, xs::matrix_view<float>(out.data(), mine.rows, 2)),
                  xs::invalid_argument);
}

template <class B>
struct fixture {
  xs::mpi_communicator comm;
  int rank = comm.rank(), size = comm.size();
  layer full;

  template <class Sel>
  xs::selective_softmax<Sel, xs::fp32, B> reference(Sel sel, bool bias = true) {
    return {std::move(sel), xs::matrix_view<float>(full.w.data(), classes, dim), bias ? full.b.data() : nullptr};
  }
  template <class Sel>
  xs::selective_softmax<Sel, xs::fp32, B, sharding> sharded(Sel sel, xs::hidden_layout layout, bool bias = true) {
    sharding sh(comm, classes, layout);
    const index_t begin = sh.class_begin();
    return {std::move(sel), sh, xs::matrix_view<float>(full.w.data() + begin * dim, sh.local_classes(), dim),
            bias ? full.b.data() + begin : nullptr};
  }
  [[nodiscard]] std::size_t own(xs::hidden_layout layout) const {
    return layout == xs::hidden_layout::replicated ? 0 : static_cast<std::size_t>(rank);
  }
};

constexpr xs::hidden_layout layouts[] = {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated};

}  // namespace

TEST_CASE_TEMPLATE("sharded selective softmax, explicit candidates, equals the unsharded head", B, xs::serial, xs::omp) {
  fixture<B> f;
  for (const auto layout : layouts) {
    for (bool idle : {false, true}) {
      const std::vector<batch> all = batches_of(layout, f.size, idle);
      const index_t total = concat(all).rows;
      for (bool per_sample : {false, true}) {
        const xs::explicit_candidates sel = per_sample ? per_sample_candidates(total) : shared_candidates();
        const auto ref = f.reference(sel);
        const auto head = f.sharded(sel, layout);
        CHECK(head.num_classes() == classes);
        for (const xs::loss_options& o : option_sets()) {
          CAPTURE(static_cast<int>(layout));
          CAPTURE(idle);
          CAPTURE(per_sample);
          CAPTURE(static_cast<int>(o.reduce));
          compare(head, ref, all, f.own(layout), o);
        }
        if (!idle) compare_prediction(head, ref, all, f.own(layout));
      }
    }
  }
}

TEST_CASE_TEMPLATE("sharded selective softmax: a rank with no active class still takes part", B, xs::serial,
                   xs::omp) {
  // Targets only, all in [0, 200): rank 0's range (it holds at least 250 classes), so every other
  // rank scores no class of the shared set, and most rows have no per-sample entry on most ranks.
  fixture<B> f;
  for (const auto layout : layouts) {
    const std::vector<batch> all = batches_of(layout, f.size, false, 200);
    const auto ref = f.reference(xs::explicit_candidates{});
    const auto head = f.sharded(xs::explicit_candidates{}, layout);
    for (const xs::loss_options& o : option_sets()) {
      CAPTURE(static_cast<int>(layout));
      CAPTURE(static_cast<int>(o.reduce));
      compare(head, ref, all, f.own(layout), o);
    }
    xs::loss_options o;
    o.margin = xs::margin_options::arcface(16.f, 0.3f);
    compare(f.sharded(xs::explicit_candidates{}, layout, false), f.reference(xs::explicit_candidates{}, false), all,
            f.own(layout), o);
  }
}

TEST_CASE_TEMPLATE("sharded selective softmax with an angular margin equals the unsharded head", B, xs::serial,
                   xs::omp) {
  fixture<B> f;
  for (const auto layout : layouts) {
    const std::vector<batch> all = batches_of(layout, f.size);
    const index_t total = concat(all).rows;
    for (bool per_sample : {false, true}) {
      const xs::explicit_candidates sel = per_sample ? per_sample_candidates(total) : shared_candidates();
      const auto ref = f.reference(sel, false);  // a margin needs heads without a bias
      const auto head = f.sharded(sel, layout, false);
      for (const xs::margin_options m : {xs::margin_options::arcface(16.f, 0.3f), xs::margin_options::cosface(16.f, 0.2f)}) {
        xs::loss_options o;
        o.margin = m;
        o.label_smoothing = 0.05f;
        CAPTURE(static_cast<int>(layout));
        CAPTURE(per_sample);
        CAPTURE(static_cast<int>(m.kind));
        compare(head, ref, all, f.own(layout), o);
      }
    }
  }
}

TEST_CASE_TEMPLATE("sharded selective softmax, sampled negatives, equals the unsharded head", B, xs::serial, xs::omp) {
  fixture<B> f;
  for (const auto layout : layouts) {
    const std::vector<batch> all = batches_of(layout, f.size);
    for (bool unique : {true, false}) {
      xs::sampling_options so;
      so.num_sampled = 40;
      so.unique = unique;
      so.seed = 9;
      auto ref = f.reference(xs::sampled_negatives::log_uniform(classes, so));
      auto head = f.sharded(xs::sampled_negatives::log_uniform(classes, so), layout);
      for (int step = 0; step < 2; ++step) {  // the same draw on every rank, step after step
        for (const xs::loss_options& o : option_sets()) {
          CAPTURE(static_cast<int>(layout));
          CAPTURE(unique);
          CAPTURE(step);
          CAPTURE(static_cast<int>(o.reduce));
          compare(head, ref, all, f.own(layout), o);
        }
        ref.next_step();
        head.next_step();
        CHECK(head.selector().step() == ref.selector().step());
      }
    }
  }
}

/// The sharded head's graph against the unsharded one: through the ring (`ring`), each rank holds
/// the rows of its own classes only (its share of the graph memory), bitwise the unsharded rows;
/// otherwise (a communicator without `shift`, or the IVF method) every rank holds the whole graph.
template <class Head, class Ref>
void check_graph(const Head& head, const Ref& ref, bool ring) {
  const xs::knn_graph& g = head.graph();
  const xs::knn_graph& r = ref.graph();
  REQUIRE(g.k() == r.k());
  CHECK(g.num_classes() == r.num_classes());
  const index_t first = ring ? head.class_begin() : 0, held = ring ? head.local_classes() : classes, k = g.k();
  CHECK(g.first_row() == first);
  CHECK(g.held_rows() == held);
  CHECK(g.ids().size() == static_cast<std::size_t>(held * k));  // the memory held: this share's rows
  CHECK(g.similarities().size() == static_cast<std::size_t>(held * k));
  CHECK(g.ids() == std::vector<index_t>(r.ids().begin() + first * k, r.ids().begin() + (first + held) * k));
  CHECK(g.similarities() ==
        std::vector<float>(r.similarities().begin() + first * k, r.similarities().begin() + (first + held) * k));
  if (held > 0) CHECK(std::equal(g.neighbors(first + held - 1), g.neighbors(first + held - 1) + k,
                                 r.neighbors(first + held - 1)));
}

/// The sharded KNN head against the unsharded one over two steps (each rebuilding the graph).
template <class B, class Comm>
void compare_knn(fixture<B>& f, const xs::knn_options& ko, bool ring, const xs::knn_options* ref_options = nullptr) {
  using sh_t = xs::class_sharding<Comm>;
  for (const auto layout : layouts) {
    const std::vector<batch> all = batches_of(layout, f.size);
    sh_t sh(Comm(f.comm), classes, layout);
    const index_t begin = sh.class_begin();
    xs::knn_softmax<xs::fp32, B> ref(xs::matrix_view<float>(f.full.w.data(), classes, dim),
                                     ref_options ? *ref_options : ko, f.full.b.data());
    xs::knn_softmax<xs::fp32, B, sh_t> head(
        sh, xs::matrix_view<float>(f.full.w.data() + begin * dim, sh.local_classes(), dim), ko, f.full.b.data() + begin);
    check_graph(head, ref, ring);
    for (int step = 0; step < 2; ++step) {
      for (const xs::loss_options& o : option_sets()) {
        CAPTURE(static_cast<int>(layout));
        CAPTURE(static_cast<int>(o.reduce));
        compare(head, ref, all, f.own(layout), o);
      }
      head.next_step();
      ref.next_step();
      CHECK(head.graph().builds() == ref.graph().builds());
      check_graph(head, ref, ring);
    }
    compare_prediction(head, ref, all, f.own(layout));
  }
}

/// `mpi_communicator` without its ring step (as the PyTorch package's communicator): the sharded
/// KNN head falls back to gathering the weights and the whole graph.
struct no_shift_communicator {
  xs::mpi_communicator c;
  explicit no_shift_communicator(xs::mpi_communicator comm) : c(comm) {}
  [[nodiscard]] int rank() const { return c.rank(); }
  [[nodiscard]] int size() const { return c.size(); }
  template <class T>
  void all_reduce(T* data, index_t n, xs::reduce_op op) { c.all_reduce(data, n, op); }
  template <class T>
  void all_gather(const T* send, index_t count, T* recv, const index_t* counts) {
    c.all_gather(send, count, recv, counts);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, const index_t* counts) { c.reduce_scatter(send, recv, counts); }
  template <class T>
  void all_to_all(const T* send, const index_t* sc, T* recv, const index_t* rc) { c.all_to_all(send, sc, recv, rc); }
};
static_assert(xs::detail::has_shift<xs::mpi_communicator, float>);
static_assert(!xs::detail::has_shift<no_shift_communicator, float>);

TEST_CASE_TEMPLATE("sharded knn softmax equals the unsharded head", B, xs::serial, xs::omp) {
  fixture<B> f;
  xs::knn_options ko;
  ko.graph.k = 6;
  ko.graph.query_tile = 64;  // several query tiles, most cut by a rank's range
  ko.graph.class_tile = 100;  // class tiles cut by the blocks visiting round the ring
  ko.rebuild_every = 1;  // next_step rebuilds: round the ring again
  SUBCASE("exact, ring: each rank keeps its own graph rows") { compare_knn<B, xs::mpi_communicator>(f, ko, true); }
  SUBCASE("exact, no ring step: the gathered weights and graph") {
    compare_knn<B, no_shift_communicator>(f, ko, false);
  }
  SUBCASE("ivf, ring: the weights gathered round the ring, the whole graph") {
    ko.graph.method = xs::knn_build_method::ivf;
    ko.graph.ivf.num_lists = 8;
    ko.graph.nprobe = 3;
    compare_knn<B, xs::mpi_communicator>(f, ko, false);
  }
  SUBCASE("ivf_class_probes, ring: each class probing its own lists over the gathered weights") {
    ko.graph.method = xs::knn_build_method::ivf_class_probes;
    ko.graph.ivf.num_lists = 8;
    ko.graph.nprobe = 3;
    compare_knn<B, xs::mpi_communicator>(f, ko, false);
  }
  // Refreshes between rebuilds (step 1 refreshes, step 2 rebuilds): the whole graph refreshed from
  // the weights gathered round the ring (with the moved classes searched), or gathered at once; a
  // ring's exact share, which holds only its rows, is rebuilt at every update instead.
  ko.refreshes_between_rebuilds = 1;
  ko.graph.refine.reverse = 2;
  SUBCASE("ivf_class_probes, ring, refreshed between rebuilds: the whole graph, from the gathered weights") {
    ko.graph.method = xs::knn_build_method::ivf_class_probes;
    ko.graph.ivf.num_lists = 8;
    ko.graph.nprobe = 3;
    ko.graph.refine.moved = 0.1;
    compare_knn<B, xs::mpi_communicator>(f, ko, false);
  }
  SUBCASE("exact, no ring step, refreshed between rebuilds") { compare_knn<B, no_shift_communicator>(f, ko, false); }
  SUBCASE("exact, ring, refreshes asked for: each rank's own rows, rebuilt (one rank: all rows, refreshed)") {
    xs::knn_options rebuilt = ko;
    rebuilt.refreshes_between_rebuilds = 0;
    compare_knn<B, xs::mpi_communicator>(f, ko, true, f.size > 1 ? &rebuilt : nullptr);
  }
}

TEST_CASE("sharded knn softmax, bf16 weights: the ring's graph rows are the unsharded head's") {
  // The blocks travel as fp32 and come back to bf16 exactly: the rows are bitwise the unsharded ones.
  layer full;
  std::vector<__nv_bfloat16> w(full.w.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = xs::from_float<__nv_bfloat16>(full.w[i]);
  xs::mpi_communicator comm;
  const sharding sh(comm, classes);
  xs::knn_options ko;
  ko.graph.k = 4;
  ko.graph.query_tile = 50;
  ko.graph.class_tile = 70;
  for (const auto metric : {xs::similarity::cosine, xs::similarity::inner_product}) {
    ko.graph.metric = metric;
    const xs::knn_softmax<xs::bf16> ref(xs::matrix_view<__nv_bfloat16>(w.data(), classes, dim), ko);
    const xs::knn_softmax<xs::bf16, xs::serial, sharding> head(
        sh, xs::matrix_view<__nv_bfloat16>(w.data() + sh.class_begin() * dim, sh.local_classes(), dim), ko);
    CAPTURE(static_cast<int>(metric));
    check_graph(head, ref, true);
  }
}

TEST_CASE("sharded selective softmax rejects a rank with no class, a shard of the wrong size, a foreign sampler") {
  xs::mpi_communicator comm;
  CHECK_THROWS_AS(sharding(comm, comm.size() - 1), xs::invalid_argument);
  sharding sh(comm, 100);
  std::vector<float> w(static_cast<std::size_t>((sh.local_classes() + 1) * dim));
  using head = xs::selective_softmax<xs::explicit_candidates, xs::fp32, xs::serial, sharding>;
  CHECK_THROWS_AS(head({}, sh, xs::matrix_view<float>(w.data(), sh.local_classes() + 1, dim)), xs::shape_error);
  head owned({}, sh, dim, true);
  CHECK(owned.local_classes() == sh.local_classes());
  CHECK(owned.class_begin() == sh.class_begin());
  // Every rank throws alike (the selector's check runs on the same request everywhere).
  xs::selective_softmax<xs::sampled_negatives, xs::fp32, xs::serial, sharding> sampled(
      xs::sampled_negatives::uniform(99, {}), sh, dim);
  batch b = batch_of(0);
  for (auto& t : b.t) t = t == ignore ? t : t % 100;
  CHECK_THROWS_AS(sampled.forward(hidden(b), targets(b)), xs::shape_error);
  // A target out of range is rejected before any collective.
  std::vector<index_t> bad(b.t);
  bad[0] = 100;
  CHECK_THROWS_AS(owned.forward(hidden(b), xs::vector_view<const index_t>(bad.data(), b.rows)), xs::out_of_range);
}
