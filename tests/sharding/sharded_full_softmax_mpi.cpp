// SPDX-License-Identifier: Apache-2.0
// full_softmax over class_sharding<mpi_communicator>, run by ctest under mpirun with 1, 2, 3 and 4
// ranks (1003 classes: no rank count divides them): every verb equals the unsharded head on the
// same weights — loss, per-sample losses, grad_hidden of the rank's own rows, each rank's weight
// gradient rows, log_prob, top-k, forward_topk — with label smoothing, z-loss and angular margins
// too, in both hidden layouts;
// repeated runs are bitwise equal; a rank with no class and mismatched shards are rejected.
// Also compiled by nvcc for the cuda backend (xsoftmax_cuda_mpi_tests, XSOFTMAX_TEST_ON_CUDA): every
// rank's heads on the one GPU, host staging through mpi_communicator (issue 26, target 8).

// First: this test is the self-containment check of the MPI header (tests/self_contained skips it).
#include <xsoftmax/sharding/mpi_communicator.hpp>

#include <xsoftmax/full_softmax.hpp>

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
using sharding = xs::class_sharding<xs::mpi_communicator>;
using xsoftmax_test::host_values;
using xsoftmax_test::test_vector;

constexpr index_t classes = 1003, dim = 16, ignore = -100;

struct layer : xsoftmax_test::seeded_layer {
  layer() : seeded_layer(classes, dim, 7) {}
};

/// Rank q's batch: 6 + 3q rows, every fifth target ignored; rank 1's targets all ignored when
/// `rank1_idle` (a rank with no row that counts still takes part in every collective).
using batch = xsoftmax_test::row_batch;
batch batch_of(int q, bool rank1_idle = false) {
  batch b;
  b.rows = 6 + 3 * q;
  std::mt19937 g(100 + static_cast<unsigned>(q));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (index_t i = 0; i < b.rows * dim; ++i) b.h.push_back(nd(g));
  for (index_t i = 0; i < b.rows; ++i)
    b.t.push_back((i % 5 == 4 || (rank1_idle && q == 1)) ? ignore : static_cast<index_t>(g() % classes));
  return b;
}

xs::matrix_view<const float> hidden(const batch& b) { return {b.h.data(), b.rows, dim}; }
xs::vector_view<const index_t> targets(const batch& b) { return {b.t.data(), b.rows}; }

using xsoftmax_test::check_close;

template <class B>
struct fixture {
  xs::mpi_communicator comm;
  int rank = comm.rank(), size = comm.size();
  layer full;
  xs::full_softmax<xs::fp32, B> reference{xs::matrix_view<float>(full.w.data(), classes, dim), full.b.data()};

  xs::full_softmax<xs::fp32, B, sharding> sharded(xs::hidden_layout layout) {
    sharding sh(comm, classes, layout);
    const index_t begin = sh.class_begin();
    return xs::full_softmax<xs::fp32, B, sharding>(
        sh, xs::matrix_view<float>(full.w.data() + begin * dim, sh.local_classes(), dim), full.b.data() + begin);
  }

  /// The unsharded weight gradient (dense, classes x dim, and bias) of the given batches' summed losses.
  std::pair<std::vector<float>, std::vector<float>> reference_grad(const std::vector<batch>& batches,
                                                                   const xs::loss_options& o) {
    std::vector<float> gw(static_cast<std::size_t>(classes * dim), 0.f), gb(static_cast<std::size_t>(classes), 0.f);
    for (const batch& b : batches) {
      test_vector<float> gh(b.h.size());
      typename decltype(reference)::gradient_type g;
      reference.forward_backward(hidden(b), targets(b), xs::matrix_view<float>(gh.data(), b.rows, dim), g, o);
      const std::vector<index_t> rows = host_values(g.rows);
      const std::vector<float> values = host_values(g.values), bias_values = host_values(g.bias_values);
      for (index_t i = 0; i < g.num_rows(); ++i) {
        const index_t c = rows[static_cast<std::size_t>(i)];
        for (index_t j = 0; j < dim; ++j) gw[c * dim + j] += values[static_cast<std::size_t>(i * dim + j)];
        gb[c] += bias_values[static_cast<std::size_t>(i)];
      }
    }
    return {gw, gb};
  }
};

std::vector<xs::loss_options> option_sets() { return xsoftmax_test::sharded_option_sets(); }

}  // namespace

TEST_CASE_TEMPLATE("sharded full softmax equals the unsharded head (data-parallel rows)", B, XSOFTMAX_TEST_BACKENDS) {
  fixture<B> f;
  auto head = f.sharded(xs::hidden_layout::data_parallel);
  const index_t begin = head.class_begin(), local = head.local_classes();
  CHECK(head.num_classes() == classes);
  for (bool idle : {false, true}) {
    std::vector<batch> all;
    for (int q = 0; q < f.size; ++q) all.push_back(batch_of(q, idle));
    const batch& own = all[static_cast<std::size_t>(f.rank)];
    for (const xs::loss_options& o : option_sets()) {
      CAPTURE(idle);
      CAPTURE(o.label_smoothing);
      test_vector<float> gh(own.h.size()), ref_gh(own.h.size()), per(static_cast<std::size_t>(own.rows)),
          ref_per(static_cast<std::size_t>(own.rows));
      typename decltype(head)::gradient_type g;
      typename decltype(f.reference)::gradient_type ref_g;
      const xs::vector_view<float> per_view(per.data(), own.rows), ref_per_view(ref_per.data(), own.rows);
      const float loss = head.forward_backward(hidden(own), targets(own), xs::matrix_view<float>(gh.data(), own.rows, dim),
                                               g, o, per_view);
      const float ref_loss = f.reference.forward_backward(
          hidden(own), targets(own), xs::matrix_view<float>(ref_gh.data(), own.rows, dim), ref_g, o, ref_per_view);
      check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
      check_close(per, ref_per, 1e-6, 1e-3, "per_sample");
      check_close(gh, ref_gh, 1e-6, 1e-5, "grad_hidden");
      CHECK(head.forward(hidden(own), targets(own), o, per_view) == doctest::Approx(ref_loss).epsilon(1e-6));

      // The local weight gradient: every local class, that of the sum of every rank's loss.
      const auto [gw, gb] = f.reference_grad(all, o);
      REQUIRE(g.num_rows() == local);
      const std::vector<float> mine = host_values(g.values), ref_rows(gw.begin() + begin * dim,
                                                                      gw.begin() + (begin + local) * dim);
      check_close(mine, ref_rows, 1e-6, 1e-5, "grad_weights");
      check_close(host_values(g.bias_values),
                  std::vector<float>(gb.begin() + begin, gb.begin() + begin + local), 1e-6, 1e-5, "grad_bias");

      // Bitwise the same on a repeated run.
      test_vector<float> gh2(gh.size());
      typename decltype(head)::gradient_type g2;
      const float loss2 = head.forward_backward(hidden(own), targets(own),
                                                xs::matrix_view<float>(gh2.data(), own.rows, dim), g2, o, per_view);
      CHECK(std::memcmp(&loss, &loss2, sizeof loss) == 0);
      CHECK(gh == gh2);
      CHECK(host_values(g.values) == host_values(g2.values));
    }
  }
}

TEST_CASE_TEMPLATE("sharded full softmax with an angular margin equals the unsharded head", B, XSOFTMAX_TEST_BACKENDS) {
  // A margin needs heads without a bias: the same layer's weights, no bias, on both sides.
  fixture<B> f;
  sharding sh(f.comm, classes, xs::hidden_layout::data_parallel);
  const index_t begin = sh.class_begin(), local = sh.local_classes();
  xs::full_softmax<xs::fp32, B, sharding> head(sh, xs::matrix_view<float>(f.full.w.data() + begin * dim, local, dim));
  xs::full_softmax<xs::fp32, B> reference(xs::matrix_view<float>(f.full.w.data(), classes, dim));
  std::vector<batch> all;
  for (int q = 0; q < f.size; ++q) all.push_back(batch_of(q));
  const batch& own = all[static_cast<std::size_t>(f.rank)];
  for (const xs::margin_options m : {xs::margin_options::arcface(16.f, 0.3f), xs::margin_options::cosface(16.f, 0.2f)}) {
    xs::loss_options o;
    o.margin = m;
    o.label_smoothing = 0.05f;
    CAPTURE(static_cast<int>(m.kind));
    test_vector<float> gh(own.h.size()), ref_gh(own.h.size());
    typename decltype(head)::gradient_type g;
    typename decltype(reference)::gradient_type ref_g;
    const float loss =
        head.forward_backward(hidden(own), targets(own), xs::matrix_view<float>(gh.data(), own.rows, dim), g, o);
    const float ref_loss = reference.forward_backward(hidden(own), targets(own),
                                                      xs::matrix_view<float>(ref_gh.data(), own.rows, dim), ref_g, o);
    check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
    check_close(gh, ref_gh, 1e-6, 1e-5, "grad_hidden");
    // The local rows of the gradient of the sum over ranks of each rank's loss.
    std::vector<float> gw(static_cast<std::size_t>(classes * dim), 0.f);
    for (const batch& b : all) {
      test_vector<float> bh(b.h.size());
      typename decltype(reference)::gradient_type bg;
      reference.forward_backward(hidden(b), targets(b), xs::matrix_view<float>(bh.data(), b.rows, dim), bg, o);
      const std::vector<index_t> rows = host_values(bg.rows);
      const std::vector<float> values = host_values(bg.values);
      for (index_t i = 0; i < bg.num_rows(); ++i)
        for (index_t j = 0; j < dim; ++j)
          gw[rows[static_cast<std::size_t>(i)] * dim + j] += values[static_cast<std::size_t>(i * dim + j)];
    }
    REQUIRE(g.num_rows() == local);
    check_close(host_values(g.values),
                std::vector<float>(gw.begin() + begin * dim, gw.begin() + (begin + local) * dim), 1e-6, 1e-5,
                "grad_weights");
  }
}

TEST_CASE_TEMPLATE("sharded full softmax: log_prob and top-k over every class", B, XSOFTMAX_TEST_BACKENDS) {
  fixture<B> f;
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    auto head = f.sharded(layout);
    batch own = batch_of(layout == xs::hidden_layout::replicated ? 0 : f.rank);
    for (auto& t : own.t) t = t == ignore ? 0 : t;  // log_prob ignores nothing
    test_vector<float> lp(static_cast<std::size_t>(own.rows)), ref_lp(static_cast<std::size_t>(own.rows));
    head.log_prob(hidden(own), targets(own), xs::vector_view<float>(lp.data(), own.rows));
    f.reference.log_prob(hidden(own), targets(own), xs::vector_view<float>(ref_lp.data(), own.rows));
    check_close(lp, ref_lp, 1e-6, 1e-3, "log_prob");
    for (index_t k : {index_t(1), index_t(5), index_t(300)}) {  // 300 > the 251 classes of a rank of 4
      test_vector<index_t> c(static_cast<std::size_t>(own.rows * k)), ref_c(c.size());
      test_vector<float> v(c.size()), ref_v(c.size());
      head.topk(hidden(own), k, xs::matrix_view<index_t>(c.data(), own.rows, k), xs::matrix_view<float>(v.data(), own.rows, k));
      f.reference.topk(hidden(own), k, xs::matrix_view<index_t>(ref_c.data(), own.rows, k),
                       xs::matrix_view<float>(ref_v.data(), own.rows, k));
      CAPTURE(k);
      CHECK(c == ref_c);
      check_close(v, ref_v, 1e-6, 1e-3, "topk log_probs");
    }
    test_vector<float> out(static_cast<std::size_t>(own.rows * 2));
    CHECK_THROWS_AS(head.log_distribution(hidden(own), 0, 2, xs::matrix_view<float>(out.data(), own.rows, 2)),
                    xs::invalid_argument);
  }
}

TEST_CASE_TEMPLATE("sharded full softmax: forward_topk equals the unsharded head's (both layouts, ignored rows)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  fixture<B> f;
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    auto head = f.sharded(layout);
    const batch own = batch_of(layout == xs::hidden_layout::replicated ? 0 : f.rank);  // every fifth row ignored
    for (const xs::loss_options& o : option_sets()) {
      if (o.margin.enabled()) continue;  // refused: tests/full/forward_topk_test.cpp
      for (index_t k : {index_t(1), index_t(5), index_t(300)}) {  // 300 > the 251 classes of a rank of 4
        test_vector<index_t> c(static_cast<std::size_t>(own.rows * k)), ref_c(c.size());
        test_vector<float> v(c.size()), ref_v(c.size()), per(static_cast<std::size_t>(own.rows)), ref_per(per.size());
        const float loss = head.forward_topk(hidden(own), targets(own), k, xs::matrix_view<index_t>(c.data(), own.rows, k),
                                             xs::matrix_view<float>(v.data(), own.rows, k), o,
                                             xs::vector_view<float>(per.data(), own.rows));
        const float ref_loss = f.reference.forward_topk(hidden(own), targets(own), k,
                                                        xs::matrix_view<index_t>(ref_c.data(), own.rows, k),
                                                        xs::matrix_view<float>(ref_v.data(), own.rows, k), o,
                                                        xs::vector_view<float>(ref_per.data(), own.rows));
        CAPTURE(k);
        check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
        check_close(per, ref_per, 1e-6, 1e-3, "per-sample losses");
        CHECK(c == ref_c);  // ignored rows: -1 on both
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (std::isinf(ref_v[i])) {
            CHECK(v[i] == ref_v[i]);  // an ignored row's -inf
          } else {
            CHECK(v[i] == doctest::Approx(ref_v[i]).epsilon(1e-5));
          }
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("sharded full softmax equals the unsharded head (replicated rows)", B, XSOFTMAX_TEST_BACKENDS) {
  fixture<B> f;
  auto head = f.sharded(xs::hidden_layout::replicated);
  const batch b = batch_of(0);  // every rank passes the same batch
  for (const xs::loss_options& o : option_sets()) {
    test_vector<float> gh(b.h.size()), ref_gh(b.h.size()), per(static_cast<std::size_t>(b.rows));
    typename decltype(head)::gradient_type g;
    typename decltype(f.reference)::gradient_type ref_g;
    const xs::vector_view<float> per_view(per.data(), b.rows);
    const float loss = head.forward_backward(hidden(b), targets(b), xs::matrix_view<float>(gh.data(), b.rows, dim), g, o, per_view);
    const float ref_loss = f.reference.forward_backward(hidden(b), targets(b), xs::matrix_view<float>(ref_gh.data(), b.rows, dim),
                                                        ref_g, o, per_view);
    check_close({loss}, {ref_loss}, 1e-6, 1e-3, "loss");
    check_close(gh, ref_gh, 1e-6, 1e-5, "grad_hidden");
    const auto [gw, gb] = f.reference_grad({b}, o);
    const index_t begin = head.class_begin(), local = head.local_classes();
    check_close(host_values(g.values),
                std::vector<float>(gw.begin() + begin * dim, gw.begin() + (begin + local) * dim), 1e-6, 1e-5, "grad_weights");
  }
}

TEST_CASE_TEMPLATE("sharded full softmax: the score cache changes no bit (none, some, all chunks kept)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  fixture<B> f;
  auto head = f.sharded(xs::hidden_layout::data_parallel);
  head.set_chunk_size(64);  // several chunks per rank, so that a budget can keep some of them
  const batch b = batch_of(f.rank);
  index_t gathered_rows = 0;  // every rank scores every rank's rows
  for (int q = 0; q < f.size; ++q) gathered_rows += batch_of(q).rows;
  const index_t chunk_bytes = gathered_rows * 64 * static_cast<index_t>(sizeof(float));
  for (const xs::loss_options& o : option_sets()) {
    std::vector<std::vector<float>> outputs;
    for (index_t budget : {index_t(0), 2 * chunk_bytes, index_t(1) << 30}) {
      head.set_score_cache_bytes(budget);
      test_vector<float> gh(b.h.size()), per(static_cast<std::size_t>(b.rows));
      typename decltype(head)::gradient_type g;
      const float loss = head.forward_backward(hidden(b), targets(b), xs::matrix_view<float>(gh.data(), b.rows, dim), g,
                                               o, xs::vector_view<float>(per.data(), b.rows));
      std::vector<float> all{loss};
      all.insert(all.end(), gh.begin(), gh.end());
      all.insert(all.end(), per.begin(), per.end());
      const std::vector<float> values = host_values(g.values), bias_values = host_values(g.bias_values);
      all.insert(all.end(), values.begin(), values.end());
      all.insert(all.end(), bias_values.begin(), bias_values.end());
      outputs.push_back(std::move(all));
    }
    CHECK(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(outputs[0].data(), outputs[2].data(), outputs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("class_sharding rejects a rank with no class and a shard of the wrong size") {
  xs::mpi_communicator comm;
  CHECK_THROWS_AS(sharding(comm, comm.size() - 1), xs::invalid_argument);
  CHECK_THROWS_AS(sharding(comm, 100, static_cast<xs::hidden_layout>(7)), xs::invalid_argument);
  sharding sh(comm, 100);
  CHECK(sh.shard_begin(0) == 0);
  CHECK(sh.shard_begin(comm.size()) == 100);
  std::vector<float> w(static_cast<std::size_t>((sh.local_classes() + 1) * dim));
  using head = xs::full_softmax<xs::fp32, xs::serial, sharding>;
  CHECK_THROWS_AS(head(sh, xs::matrix_view<float>(w.data(), sh.local_classes() + 1, dim)), xs::shape_error);
  head owned(sh, dim, true);
  CHECK(owned.local_classes() == sh.local_classes());
  CHECK(owned.weights().rows == sh.local_classes());
}
