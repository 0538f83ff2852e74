// SPDX-License-Identifier: Apache-2.0
// The index builders on every backend of the build (serial and omp here; cuda in the nvcc-built
// executable, where they run on the device): the exact and IVF KNN graphs, the IVF index and its
// search, the refine passes after a build and a refresh equal the serial ones bit for bit on
// integer data (every dot product exact, so the comparison does not depend on the summation
// order), and k-means centroids with fractional means agree with the serial ones to fp32 rounding.

#include "selective/selection_support.hpp"

#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/knn_graph.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::knn_build_method;
using xsoftmax::knn_build_options;
using xsoftmax::knn_graph;
using xsoftmax::similarity;

test_vector<float> small_integers(test_rng& rng, index_t count, index_t lo, index_t hi) {
  test_vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = static_cast<float>(rng.integer(lo, hi));
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE("knn graph builds on every backend equal the serial build on integer weights", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(311);
  const index_t n = 300, d = 8, k = 7;
  const auto w = small_integers(rng, n * d, -3, 3);
  knn_build_options o;
  o.k = k;
  o.metric = similarity::inner_product;
  o.query_tile = 128;
  o.class_tile = 100;
  o.ivf.num_lists = 10;
  o.ivf.iterations = 0;  // centroids stay integer rows: the list assignment is exact everywhere
  o.nprobe = 3;
  for (knn_build_method method :
       {knn_build_method::exact, knn_build_method::ivf, knn_build_method::ivf_class_probes}) {
    o.method = method;
    const knn_graph want = xsoftmax::build_knn_graph<xsoftmax::serial>(cview(w, n, d), o);
    const knn_graph got = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
    INFO("method ", static_cast<int>(method));
    CHECK(got.ids() == want.ids());
    CHECK(got.similarities() == want.similarities());
  }
}

TEST_CASE_TEMPLATE("knn graph refine passes and refreshes on every backend equal the serial ones on integer weights", B,
                   XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(313);
  const index_t n = 300, d = 8, k = 7;
  auto w = small_integers(rng, n * d, -3, 3);
  knn_build_options o;
  o.k = k;
  o.metric = similarity::inner_product;
  o.method = knn_build_method::ivf;
  o.ivf.num_lists = 10;
  o.ivf.iterations = 0;
  o.nprobe = 2;
  o.refine = {2, 2, 4, 3, 5, 0.1};  // build passes, refresh passes, fanout, sample, reverse, moved
  const knn_graph want = xsoftmax::build_knn_graph<xsoftmax::serial>(cview(w, n, d), o);
  knn_graph got = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  CHECK(got.ids() == want.ids());
  CHECK(got.similarities() == want.similarities());
  knn_graph want_refreshed;
  xsoftmax::knn_graph_builder serial_builder(o), builder(o);  // builds keep the rows for the moved search
  serial_builder.build<xsoftmax::serial>(cview(w, n, d), want_refreshed);
  builder.build<B>(cview(w, n, d), got);
  for (auto& x : w) x = x + static_cast<float>(rng.integer(-1, 1));  // the weights move
  serial_builder.refresh<xsoftmax::serial>(cview(w, n, d), want_refreshed);
  builder.refresh<B>(cview(w, n, d), got);
  CHECK(got.ids() == want_refreshed.ids());
  CHECK(got.similarities() == want_refreshed.similarities());
  CHECK(got.ids() != want.ids());
}

TEST_CASE_TEMPLATE("ivf index built and searched on every backend equals the serial one", B, XSOFTMAX_TEST_BACKENDS) {
  test_rng rng(312);
  const index_t n = 250, d = 6, rows = 9, k = 8, lists = 9, nprobe = 3;
  const auto w = small_integers(rng, n * d, -3, 3);
  const auto bias = small_integers(rng, n, -2, 2);
  const auto q = small_integers(rng, rows * d, -2, 2);
  xsoftmax::ivf_options o;
  o.num_lists = lists;
  o.metric = similarity::inner_product;
  o.iterations = 0;
  xsoftmax::ivf_index want, got;
  want.build<xsoftmax::serial>(cview(w, n, d), o);
  got.build<B>(cview(w, n, d), o);
  CHECK(got.list_offsets() == want.list_offsets());
  CHECK(got.list_ids() == want.list_ids());
  const auto gv = got.list_vectors(), wv = want.list_vectors();
  CHECK(bitwise_equal(gv.data, wv.data, static_cast<size_t>(gv.size())));
  test_vector<index_t> ids_want(static_cast<size_t>(rows * k)), ids_got(ids_want.size());
  test_vector<float> s_want(ids_want.size()), s_got(ids_want.size());
  want.search<xsoftmax::serial>(cview(q, rows, d), k, nprobe, mview(ids_want, rows, k), mview(s_want, rows, k),
                                bias.data());
  got.search<B>(cview(q, rows, d), k, nprobe, mview(ids_got, rows, k), mview(s_got, rows, k), bias.data());
  CHECK(std::vector<index_t>(ids_got.begin(), ids_got.end()) == std::vector<index_t>(ids_want.begin(), ids_want.end()));
  CHECK(bitwise_equal(s_got.data(), s_want.data(), s_got.size()));
  // The serial-built index searched on B (its data copied to B's memory once) gives the same.
  want.search<B>(cview(q, rows, d), k, nprobe, mview(ids_got, rows, k), mview(s_got, rows, k), bias.data());
  CHECK(std::vector<index_t>(ids_got.begin(), ids_got.end()) == std::vector<index_t>(ids_want.begin(), ids_want.end()));

  // Lloyd iterations (fractional centroids): equal to fp32 rounding.
  o.iterations = 4;
  o.metric = similarity::cosine;
  want.build<xsoftmax::serial>(cview(w, n, d), o);
  got.build<B>(cview(w, n, d), o);
  const auto gc = got.centroids(), wc = want.centroids();
  REQUIRE(gc.size() == wc.size());
  double worst = 0;
  for (index_t i = 0; i < gc.size(); ++i) worst = std::max(worst, std::abs(double(gc.data[i]) - wc.data[i]));
  CHECK(worst <= 1e-5);
}
