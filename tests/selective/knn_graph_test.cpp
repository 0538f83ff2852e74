// SPDX-License-Identifier: Apache-2.0
// The KNN graph over class weight vectors: the exact tiled build equals a float64 brute-force
// reference (and does not depend on the tile sizes); the IVF builds (list probes, each class's
// own probes) with nprobe = num_lists equal the exact graph, and their recall falls with fewer
// probes, the class probes' never below the list probes'; a warm start begins k-means at the last
// centroids, and a refreshed graph keeps a rebuild's recall; rebuilds reuse the graph's buffers;
// the IVF index lists partition the classes and its search with every list probed is exact; bad
// sizes raise typed errors naming the value; serial and omp builds (graph, index, k-means) are
// bitwise equal; one k-means round equals a float64 assignment and mean.

#include "selective/knn_test_vectors.hpp"
#include "selective/selection_support.hpp"

#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/knn_graph.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace xsoftmax_test;
using xsoftmax::index_t;
using xsoftmax::knn_build_method;
using xsoftmax::knn_build_options;
using xsoftmax::knn_graph;
using xsoftmax::similarity;

double ref_similarity(const std::vector<float>& w, index_t d, index_t a, index_t b, similarity m) {
  double dot = 0, na = 0, nb = 0;
  for (index_t p = 0; p < d; ++p) {
    const double x = w[static_cast<size_t>(a * d + p)], y = w[static_cast<size_t>(b * d + p)];
    dot += x * y, na += x * x, nb += y * y;
  }
  if (m == similarity::inner_product) return dot;
  return na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : 0.0;
}

/// Brute force in double: each class's k best (similarity desc, id asc).
std::vector<index_t> reference_graph(const std::vector<float>& w, index_t n, index_t d, index_t k, similarity m) {
  std::vector<index_t> out;
  std::vector<index_t> order(static_cast<size_t>(n));
  std::vector<double> s(static_cast<size_t>(n));
  for (index_t c = 0; c < n; ++c) {
    for (index_t j = 0; j < n; ++j) s[static_cast<size_t>(j)] = ref_similarity(w, d, c, j, m);
    std::iota(order.begin(), order.end(), index_t(0));
    std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return s[size_t(a)] > s[size_t(b)]; });
    out.insert(out.end(), order.begin(), order.begin() + k);
  }
  return out;
}

/// Graph ids equal to the reference wherever the reference has no near-tie at that position
/// (float rounding may swap two neighbours whose similarities differ by < tol); the similarity of
/// every listed neighbour must match the reference's at that position within tol.
void check_graph_matches(const knn_graph& g, const std::vector<index_t>& ref, const std::vector<float>& w, index_t d,
                         similarity m, double tol, const std::string& what) {
  const index_t n = g.num_classes(), k = g.k();
  REQUIRE(static_cast<index_t>(g.ids().size()) == n * k);
  index_t swapped = 0, bad = 0;
  for (index_t c = 0; c < n; ++c)
    for (index_t j = 0; j < k; ++j) {
      const index_t got = g.neighbors(c)[j], want = ref[static_cast<size_t>(c * k + j)];
      if (got == want) continue;
      ++swapped;
      const double sg = ref_similarity(w, d, c, got, m), sw = ref_similarity(w, d, c, want, m);
      if (std::abs(sg - sw) > tol) ++bad;
    }
  INFO(what, ": ", swapped, " positions differ from the reference, ", bad, " of them not near-ties");
  CHECK(bad == 0);
  CHECK(swapped <= n * k / 100);
}

}  // namespace

TEST_CASE_TEMPLATE("knn graph: exact tiled build equals the brute-force reference", B, xsoftmax::serial,
                   xsoftmax::omp) {
  test_rng rng(301);
  const index_t n = 150, d = 5, k = 12;
  SUBCASE("inner product, integer weights: identical ids with ties broken by id") {
    const auto w = integer_weights(rng, n, d);
    const auto ref = reference_graph(w, n, d, k, similarity::inner_product);
    knn_build_options o;
    o.k = k;
    o.metric = similarity::inner_product;
    std::vector<index_t> first;
    for (index_t tile : {index_t(37), index_t(64), index_t(1000)}) {
      o.query_tile = tile;
      o.class_tile = tile + 9;
      const knn_graph g = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
      CHECK(g.ids() == ref);
      CHECK(g.num_classes() == n);
      CHECK(g.dim() == d);
      CHECK(g.k() == k);
      CHECK(std::string(g.element()) == "fp32");
      for (index_t c = 0; c < n; ++c)
        for (index_t j = 0; j < k; ++j)
          CHECK(g.similarities()[size_t(c * k + j)] == ref_similarity(w, d, c, g.neighbors(c)[j], o.metric));
    }
  }
  SUBCASE("cosine, random weights, fp32 and bf16 storage") {
    auto w = random_floats(rng, n * d, 1.0);
    for (index_t i = 0; i < d; ++i) w[size_t(17 * d + i)] = 0.f;  // a zero vector: similarity 0 to all
    knn_build_options o;
    o.k = k;
    o.query_tile = 40;
    o.class_tile = 33;
    const knn_graph g = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
    check_graph_matches(g, reference_graph(w, n, d, k, similarity::cosine), w, d, similarity::cosine, 1e-6, "fp32");
    CHECK(g.neighbors(0)[0] == 0);  // a class is its own nearest neighbour under cosine
    const auto w16 = convert<__nv_bfloat16>(w);
    const knn_graph g16 = xsoftmax::build_knn_graph<B>(cview(w16, n, d), o);
    const auto wr = rounded_through<__nv_bfloat16>(w);
    check_graph_matches(g16, reference_graph(wr, n, d, k, similarity::cosine), wr, d, similarity::cosine, 1e-6, "bf16");
    CHECK(std::string(g16.element()) == "bf16");
  }
}

namespace {

/// An IVF build probing every one of `lists` lists, by inner product on integer weights (every
/// sum exact): bit-identical to the exact graph.
template <class B>
void check_every_list_is_exact(test_rng& rng, index_t n, index_t d, index_t k, knn_build_method method, index_t lists) {
  const auto w = integer_weights(rng, n, d);
  knn_build_options o;
  o.k = k;
  o.metric = similarity::inner_product;
  const knn_graph exact = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  o.method = method;
  o.ivf.num_lists = lists;
  o.nprobe = lists;
  const knn_graph all = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  INFO("method ", static_cast<int>(method));
  CHECK(all.ids() == exact.ids());
  CHECK(all.similarities() == exact.similarities());
  CHECK(xsoftmax::knn_graph_recall(all, exact) == 1.0);
}

}  // namespace

TEST_CASE_TEMPLATE("knn graph: IVF with nprobe = num_lists equals the exact graph; recall falls with fewer probes", B,
                   xsoftmax::serial, xsoftmax::omp) {
  test_rng rng(302);
  const index_t n = 400, d = 8, k = 10;
  check_every_list_is_exact<B>(rng, n, d, k, knn_build_method::ivf, 9);
  // cosine on clustered weights: equal up to near-ties with every list; recall reported otherwise.
  const auto w = clustered_weights(rng, n, d, 12, 0.3);
  knn_build_options o;
  o.k = k;
  const knn_graph exact = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  o.method = knn_build_method::ivf;
  o.ivf.num_lists = 16;
  std::vector<double> recall;
  for (index_t nprobe : {index_t(1), index_t(3), index_t(16)}) {
    o.nprobe = nprobe;
    const knn_graph g = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
    recall.push_back(xsoftmax::knn_graph_recall(g, exact));
    if (nprobe == 16) check_graph_matches(g, exact.ids(), w, d, similarity::cosine, 1e-6, "IVF, every list");
  }
  INFO("recall at nprobe 1, 3, 16: ", recall[0], " ", recall[1], " ", recall[2]);
  CHECK(recall[0] <= recall[1]);
  CHECK(recall[1] <= recall[2]);
  CHECK(recall[2] >= 0.999);
  CHECK(recall[0] > 0.3);  // clustered data: the own list alone finds a good part of the neighbours
}

TEST_CASE_TEMPLATE("knn graph: IVF with each class's own probes is exact with every list, beats the list's probes, "
                   "and splits its score blocks into any number of batches", B, xsoftmax::serial, xsoftmax::omp) {
  test_rng rng(304);
  const index_t n = 500, d = 8, k = 10;
  check_every_list_is_exact<B>(rng, n, d, k, knn_build_method::ivf_class_probes, 11);
  // Cosine on clustered weights: recall rises with nprobe, is at least the list-probe method's at
  // every nprobe, and a class near a list border finds its neighbours in the next list.
  const auto w = clustered_weights(rng, n, d, 25, 1.0);
  knn_build_options o;
  o.k = k;
  const knn_graph exact = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  o.ivf.num_lists = 20;
  double last = 0;
  for (index_t nprobe : {index_t(1), index_t(2), index_t(4), index_t(20)}) {
    o.nprobe = nprobe;
    o.method = knn_build_method::ivf;
    const double by_list = xsoftmax::knn_graph_recall(xsoftmax::build_knn_graph<B>(cview(w, n, d), o), exact);
    o.method = knn_build_method::ivf_class_probes;
    const knn_graph g = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
    const double by_class = xsoftmax::knn_graph_recall(g, exact);
    INFO("nprobe ", nprobe, ": recall ", by_class, " (list probes: ", by_list, ")");
    CHECK(by_class >= last);
    CHECK(by_class >= by_list - 0.01);  // (not a theorem per class: a near-tie may fall either way)
    if (nprobe == 2 || nprobe == 4) CHECK(by_class >= by_list + 0.05);  // 0.76 vs 0.66, 0.92 vs 0.76 here
    if (nprobe == 4) CHECK(by_class >= 0.88);
    if (nprobe == 20) check_graph_matches(g, exact.ids(), w, d, similarity::cosine, 1e-6, "class probes, every list");
    last = by_class;
  }
  // The score buffer's batches (one list each, or all lists at once) do not change the graph.
  xsoftmax::ivf_index index;
  xsoftmax::ivf_options io;
  io.num_lists = 20;
  index.build<B>(cview(w, n, d), io);
  const index_t np = 3;
  std::vector<index_t> probes(static_cast<size_t>(n * np));
  const auto lv = index.list_vectors();
  const xsoftmax::backend_resources<B> res{};
  const xsoftmax::detail::execution<B> ex{res};
  index.probe_on(ex, lv, np, probes.data());
  std::vector<index_t> ids_one(static_cast<size_t>(n * k)), ids_all(ids_one.size());
  std::vector<float> sims_one(ids_one.size()), sims_all(ids_one.size());
  xsoftmax::detail::ivf_class_probe_topk(ex, lv, index.list_offsets().data(), index.list_offsets(),
                                         index.list_ids().data(), probes.data(), np, k, ids_one.data(),
                                         sims_one.data(), 1);
  xsoftmax::detail::ivf_class_probe_topk(ex, lv, index.list_offsets().data(), index.list_offsets(),
                                         index.list_ids().data(), probes.data(), np, k, ids_all.data(),
                                         sims_all.data(), n * n);
  CHECK(ids_one == ids_all);
  CHECK(sims_one == sims_all);
}

TEST_CASE_TEMPLATE("ivf index and knn graph: a warm start begins k-means at the last build's centroids", B,
                   xsoftmax::serial, xsoftmax::omp) {
  test_rng rng(307);
  const index_t n = 600, d = 8;
  auto w = clustered_weights(rng, n, d, 30, 0.3);
  xsoftmax::ivf_options io;
  io.num_lists = 24;
  xsoftmax::ivf_index index;
  index.build<B>(cview(w, n, d), io);
  const std::vector<float> first(index.centroids().data, index.centroids().data + 24 * d);
  // Zero rounds from the last centroids keep them, though the seed would pick other rows.
  io.warm_start = true;
  io.iterations = 0;
  io.seed = 99;
  index.build<B>(cview(w, n, d), io);
  CHECK(std::vector<float>(index.centroids().data, index.centroids().data + 24 * d) == first);
  // A cold start with that seed does move them; so does a change of list count (then a cold start).
  io.warm_start = false;
  index.build<B>(cview(w, n, d), io);
  CHECK(std::vector<float>(index.centroids().data, index.centroids().data + 24 * d) != first);
  io.warm_start = true;
  io.num_lists = 20;
  index.build<B>(cview(w, n, d), io);
  CHECK(index.num_lists() == 20);

  // A builder refreshing its graph after the weights moved a little keeps the recall of a rebuild.
  knn_build_options o;
  o.k = 10;
  o.method = knn_build_method::ivf_class_probes;
  o.ivf.num_lists = 24;
  o.nprobe = 3;
  o.refresh_iterations = 1;
  xsoftmax::knn_graph_builder refreshing(o);
  knn_graph g;
  refreshing.build<B>(cview(w, n, d), g);
  for (auto& x : w) x += static_cast<float>(rng.uniform(-0.03, 0.03));
  refreshing.build<B>(cview(w, n, d), g);
  o.refresh_iterations = -1;
  const knn_graph rebuilt = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  o.method = knn_build_method::exact;
  const knn_graph exact = xsoftmax::build_knn_graph<B>(cview(w, n, d), o);
  const double refreshed_recall = xsoftmax::knn_graph_recall(g, exact), rebuilt_recall =
                                                                            xsoftmax::knn_graph_recall(rebuilt, exact);
  INFO("recall: refreshed ", refreshed_recall, ", rebuilt ", rebuilt_recall);
  CHECK(g.builds() == 2);
  CHECK(refreshed_recall >= rebuilt_recall - 0.02);
  CHECK(refreshed_recall >= 0.9);
  // The builder's refresh does start from its last centroids: with 0 rounds it keeps them.
  o.method = knn_build_method::ivf_class_probes;
  o.refresh_iterations = 0;
  xsoftmax::knn_graph_builder keeping(o);
  keeping.build<B>(cview(w, n, d), g);
  const auto c0 = keeping.index().centroids();
  const std::vector<float> before(c0.data, c0.data + c0.rows * d);
  for (auto& x : w) x += static_cast<float>(rng.uniform(-0.03, 0.03));
  keeping.build<B>(cview(w, n, d), g);
  const auto c1 = keeping.index().centroids();
  CHECK(std::vector<float>(c1.data, c1.data + c1.rows * d) == before);
}

TEST_CASE("knn graph: rebuilding reuses the graph's buffers and follows the weights") {
  test_rng rng(303);
  const index_t n = 90, d = 6;
  auto w = random_floats(rng, n * d, 1.0);
  knn_build_options o;
  o.k = 5;
  xsoftmax::knn_graph_builder builder(o);
  knn_graph g;
  builder.build(cview(w, n, d), g);
  CHECK(g.builds() == 1);
  const index_t* ids_before = g.ids().data();
  const float* sims_before = g.similarities().data();
  // Move class 3 onto class 40: after a rebuild, 40 is 3's nearest neighbour besides itself.
  for (index_t p = 0; p < d; ++p) w[size_t(3 * d + p)] = w[size_t(40 * d + p)] * 1.01f;
  builder.build(cview(w, n, d), g);
  CHECK(g.builds() == 2);
  CHECK(g.ids().data() == ids_before);
  CHECK(g.similarities().data() == sims_before);
  CHECK((g.neighbors(3)[0] == 40 || g.neighbors(3)[1] == 40));
  CHECK(g.ids() == xsoftmax::build_knn_graph(cview(w, n, d), o).ids());
}

TEST_CASE_TEMPLATE("ivf index: lists partition the vectors; search probing every list is exact", B, xsoftmax::serial,
                   xsoftmax::omp) {
  test_rng rng(304);
  const index_t n = 300, d = 6, rows = 7, k = 9;
  const auto w = integer_weights(rng, n, d);
  std::vector<float> bias(static_cast<size_t>(n));
  for (auto& b : bias) b = static_cast<float>(rng.integer(-2, 2));
  xsoftmax::ivf_index index;
  xsoftmax::ivf_options o;
  o.num_lists = 11;
  o.metric = similarity::inner_product;
  index.build<B>(cview(w, n, d), o);
  CHECK(index.num_lists() == 11);
  CHECK(index.num_vectors() == n);
  std::vector<index_t> ids = index.list_ids();
  for (index_t l = 0; l < index.num_lists(); ++l)
    CHECK(std::is_sorted(ids.begin() + index.list_offsets()[size_t(l)], ids.begin() + index.list_offsets()[size_t(l + 1)]));
  std::sort(ids.begin(), ids.end());
  std::vector<index_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), index_t(0));
  CHECK(ids == all);
  // Queries: integer hidden vectors; scores h . w + b exactly.
  std::vector<float> q(static_cast<size_t>(rows * d));
  for (auto& x : q) x = static_cast<float>(rng.integer(-2, 2));
  std::vector<index_t> got(static_cast<size_t>(rows * k));
  std::vector<float> sc(got.size());
  index.search<B>(cview(q, rows, d), k, 11, mview(got, rows, k), mview(sc, rows, k), bias.data());
  for (index_t r = 0; r < rows; ++r) {
    std::vector<std::pair<double, index_t>> s;
    for (index_t c = 0; c < n; ++c) {
      double v = bias[size_t(c)];
      for (index_t p = 0; p < d; ++p) v += double(q[size_t(r * d + p)]) * w[size_t(c * d + p)];
      s.push_back({-v, c});
    }
    std::sort(s.begin(), s.end());
    for (index_t j = 0; j < k; ++j) {
      CHECK(got[size_t(r * k + j)] == s[size_t(j)].second);
      CHECK(sc[size_t(r * k + j)] == -s[size_t(j)].first);
    }
  }
  // One probe: fewer candidates, still valid ids or -1.
  index.search<B>(cview(q, rows, d), k, 1, mview(got, rows, k), mview(sc, rows, k), bias.data());
  for (index_t x : got) CHECK((x >= -1 && x < n));
}

TEST_CASE("knn graph and ivf index: bad sizes raise typed errors naming the value") {
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  test_rng rng(305);
  const index_t n = 10, d = 3;
  const auto w = random_floats(rng, n * d, 1.0);
  knn_build_options o;
  o.k = 0;
  CHECK_THROWS_AS(xsoftmax::knn_graph_builder{o}, xsoftmax::invalid_argument);
  CHECK(message_of([&] { xsoftmax::knn_graph_builder b(o); }).find("k = 0") != std::string::npos);
  o.k = -3;
  CHECK(message_of([&] { xsoftmax::knn_graph_builder b(o); }).find("k = -3") != std::string::npos);
  o.k = 11;
  CHECK_THROWS_AS((void)xsoftmax::build_knn_graph(cview(w, n, d), o), xsoftmax::invalid_argument);
  CHECK(message_of([&] { (void)xsoftmax::build_knn_graph(cview(w, n, d), o); })
            .find("k = 11 must be in [1, num_classes = 10]") != std::string::npos);
  o.k = 3;
  o.method = knn_build_method::ivf;
  o.ivf.num_lists = 4;
  o.nprobe = 5;
  CHECK(message_of([&] { (void)xsoftmax::build_knn_graph(cview(w, n, d), o); }).find("nprobe = 5") != std::string::npos);
  o.ivf.num_lists = 11;
  CHECK(message_of([&] { (void)xsoftmax::build_knn_graph(cview(w, n, d), o); }).find("num_lists = 11") !=
        std::string::npos);
  o.method = knn_build_method::ivf_class_probes;
  o.ivf.num_lists = 4;
  CHECK(message_of([&] { (void)xsoftmax::build_knn_graph(cview(w, n, d), o); }).find("nprobe = 5") != std::string::npos);
  o.nprobe = 2;
  o.refresh_iterations = -2;
  CHECK(message_of([&] { xsoftmax::knn_graph_builder b(o); }).find("refresh_iterations = -2") != std::string::npos);
  o.refresh_iterations = -1;
  CHECK_THROWS_AS((void)knn_graph::from_lists(n, d, 2, std::vector<index_t>(19, 0)), xsoftmax::shape_error);
  CHECK_THROWS_AS((void)knn_graph::from_lists(n, d, 2, std::vector<index_t>(20, 10)), xsoftmax::out_of_range);
  CHECK_THROWS_AS((void)knn_graph::from_lists(n, d, 0, {}), xsoftmax::invalid_argument);
  const knn_graph a = knn_graph::from_lists(n, d, 2, std::vector<index_t>(20, 1));
  const knn_graph b = knn_graph::from_lists(n + 1, d, 2, std::vector<index_t>(22, 1));
  CHECK_THROWS_AS((void)xsoftmax::knn_graph_recall(a, b), xsoftmax::shape_error);
  xsoftmax::ivf_index index;
  std::vector<index_t> ids(3);
  std::vector<float> sc(3);
  CHECK_THROWS_AS(index.search(cview(w, 1, d), 3, 1, mview(ids, 1, 3), mview(sc, 1, 3)), xsoftmax::invalid_argument);
  index.build(cview(w, n, d));
  CHECK_THROWS_AS(index.search(cview(w, 1, d - 1), 3, 1, mview(ids, 1, 3), mview(sc, 1, 3)), xsoftmax::shape_error);
  CHECK(message_of([&] { index.search(cview(w, 1, d), 3, 0, mview(ids, 1, 3), mview(sc, 1, 3)); }).find("nprobe = 0") !=
        std::string::npos);
}

TEST_CASE("knn graph, ivf index and k-means: serial and omp builds are bitwise equal") {
  test_rng rng(306);
  const index_t n = 700, d = 12, k = 9;
  const auto w = clustered_weights(rng, n, d, 15, 0.4);
  // Exact builds and IVF indexes: the same GEMM calls on both backends, random weights.
  for (similarity m : {similarity::cosine, similarity::inner_product}) {
    knn_build_options o;
    o.k = k;
    o.metric = m;
    o.query_tile = 250;
    o.class_tile = 300;
    const knn_graph a = xsoftmax::build_knn_graph<xsoftmax::serial>(cview(w, n, d), o);
    const knn_graph b = xsoftmax::build_knn_graph<xsoftmax::omp>(cview(w, n, d), o);
    INFO("metric ", static_cast<int>(m));
    CHECK(a.ids() == b.ids());
    CHECK(a.similarities() == b.similarities());
  }
  // IVF graphs: the list-pair GEMMs run one per thread on omp, and a threaded BLAS may sum a GEMM
  // called from the main thread (serial) in another order; on integer weights every sum is exact,
  // so the lists, probes, heaps and tie-breaks must agree bit for bit.
  const auto wi = integer_weights(rng, n, d);
  knn_build_options o;
  o.k = k;
  o.metric = similarity::inner_product;
  o.ivf.num_lists = 20;
  o.nprobe = 4;
  for (knn_build_method method : {knn_build_method::ivf, knn_build_method::ivf_class_probes}) {
    o.method = method;
    const knn_graph a = xsoftmax::build_knn_graph<xsoftmax::serial>(cview(wi, n, d), o);
    const knn_graph b = xsoftmax::build_knn_graph<xsoftmax::omp>(cview(wi, n, d), o);
    INFO("method ", static_cast<int>(method));
    CHECK(a.ids() == b.ids());
    CHECK(a.similarities() == b.similarities());
  }
  // k-means with empty clusters to re-seed: 200 points on 6 distinct positions, 25 centroids.
  std::vector<float> dup(static_cast<size_t>(200 * d));
  for (index_t i = 0; i < 200; ++i)
    for (index_t p = 0; p < d; ++p) dup[size_t(i * d + p)] = w[size_t((i % 6) * d + p)];
  for (similarity m : {similarity::cosine, similarity::inner_product}) {
    xsoftmax::ivf_options io;
    io.num_lists = 25;
    io.metric = m;
    io.seed = 7;
    xsoftmax::ivf_index s, p;
    s.build<xsoftmax::serial>(cview(dup, 200, d), io);
    p.build<xsoftmax::omp>(cview(dup, 200, d), io);
    const auto cs = s.centroids(), cp = p.centroids();
    CHECK(std::vector<float>(cs.data, cs.data + cs.size()) == std::vector<float>(cp.data, cp.data + cp.size()));
    CHECK(s.list_ids() == p.list_ids());
    CHECK(s.list_offsets() == p.list_offsets());
    index_t empty_lists = 0;
    for (index_t l = 0; l < s.num_lists(); ++l) empty_lists += s.list_offsets()[size_t(l)] == s.list_offsets()[size_t(l + 1)];
    CHECK(empty_lists >= 1);  // 25 clusters over 6 distinct points: some stay empty, so re-seeds ran
  }
}

TEST_CASE("k-means: one Lloyd round equals a float64 assignment and mean from the same start") {
  test_rng rng(307);
  const index_t n = 500, d = 7, lists = 6;
  const auto w = clustered_weights(rng, n, d, 6, 0.2);
  const xsoftmax::host_resources res{};
  const xsoftmax::detail::execution<xsoftmax::serial> ex{res};
  for (bool spherical : {false, true}) {
    std::vector<float> x = w;
    if (spherical)
      for (index_t i = 0; i < n; ++i) {
        double s = 0;
        for (index_t p = 0; p < d; ++p) s += double(x[size_t(i * d + p)]) * x[size_t(i * d + p)];
        for (index_t p = 0; p < d; ++p) x[size_t(i * d + p)] = float(x[size_t(i * d + p)] / std::sqrt(s));
      }
    std::vector<float> c0(static_cast<size_t>(lists * d)), c1(c0.size());
    xsoftmax::detail::kmeans(ex, cview(x, n, d), lists, 0, spherical, 11, c0.data());  // the seeded start
    xsoftmax::detail::kmeans(ex, cview(x, n, d), lists, 1, spherical, 11, c1.data());
    std::vector<double> sum(c0.size(), 0.0), count(static_cast<size_t>(lists), 0.0);
    for (index_t i = 0; i < n; ++i) {
      index_t best = 0;
      double best_s = -1e300;
      for (index_t j = 0; j < lists; ++j) {
        double dot = 0, nn = 0;
        for (index_t p = 0; p < d; ++p)
          dot += double(x[size_t(i * d + p)]) * c0[size_t(j * d + p)], nn += double(c0[size_t(j * d + p)]) * c0[size_t(j * d + p)];
        const double s = spherical ? dot : dot - nn / 2;
        if (s > best_s) best_s = s, best = j;
      }
      count[size_t(best)] += 1;
      for (index_t p = 0; p < d; ++p) sum[size_t(best * d + p)] += x[size_t(i * d + p)];
    }
    INFO("spherical ", spherical);
    for (index_t j = 0; j < lists; ++j) {
      REQUIRE(count[size_t(j)] > 0);  // no re-seed on this data
      double norm = 0;
      for (index_t p = 0; p < d; ++p) norm += (sum[size_t(j * d + p)] / count[size_t(j)]) * (sum[size_t(j * d + p)] / count[size_t(j)]);
      const double scale = spherical ? 1 / std::sqrt(norm) : 1.0;
      for (index_t p = 0; p < d; ++p)
        CHECK(std::abs(c1[size_t(j * d + p)] - sum[size_t(j * d + p)] / count[size_t(j)] * scale) <= 1e-6);
    }
  }
}
