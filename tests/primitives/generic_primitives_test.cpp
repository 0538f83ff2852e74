// SPDX-License-Identifier: Apache-2.0
// The backend-generic primitives (detail/execution.hpp, detail/primitives/*) against plain float64
// references, on every backend of the build: the code the heads run everywhere, checked here piece
// by piece. Also: every head instantiates and runs a step on every backend of the build.

#include <doctest/doctest.h>

#include <xsoftmax/detail/execution.hpp>
#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/dense_softmax.hpp>
#include <xsoftmax/detail/primitives/fast_exp.hpp>
#include <xsoftmax/detail/primitives/gemm_batch.hpp>
#include <xsoftmax/detail/primitives/group_by_key.hpp>
#include <xsoftmax/detail/primitives/row_topk.hpp>
#include <xsoftmax/detail/primitives/sparse_accumulate.hpp>
#include <xsoftmax/detail/selection/active_set_checks.hpp>
#include <xsoftmax/detail/selection/row_lists.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include "support/test_memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::test_vector;

namespace {

std::vector<float> random_floats(std::mt19937& g, std::size_t n, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

template <class T>
test_vector<T> to_test(const std::vector<T>& v) {
  return test_vector<T>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("fast_exp: within 2 ulp of exp over its range; 0 below, inf above, NaN for NaN, exact at 0") {
  double worst = 0;
  for (float x = -87.f; x < 88.f; x += 0.00731f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(xs::detail::fast_exp(x) - ref) / ref);
  }
  CHECK(worst < 2.5e-7);  // 2 ulp of fp32 is 2.4e-7 relative
  CHECK(xs::detail::fast_exp(0.f) == 1.f);
  CHECK(xs::detail::fast_exp(-std::numeric_limits<float>::infinity()) == 0.f);
  CHECK(xs::detail::fast_exp(-100.f) == 0.f);
  CHECK(xs::detail::fast_exp(100.f) == std::numeric_limits<float>::infinity());
  CHECK(xs::detail::fast_exp(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(xs::detail::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(xs::detail::fast_exp(-std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE_TEMPLATE("generic primitives: pack_rows, upstream_gradients, scatter and reduce equal plain loops", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::mt19937 g(1);
  const index_t rows = 2500, d = 7, ignore = -100;  // more rows than one reduction block (1024)
  const std::vector<float> h_host = random_floats(g, static_cast<std::size_t>(rows * d));
  std::vector<index_t> t_host(static_cast<std::size_t>(rows));
  for (index_t i = 0; i < rows; ++i) t_host[i] = i % 5 == 0 ? ignore : static_cast<index_t>(g() % 100);
  const test_vector<float> h = to_test(h_host);
  const test_vector<index_t> t = to_test(t_host);
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};

  const auto batch = xs::detail::pack_rows(ex, xs::matrix_view<const float>(h.data(), rows, d),
                                           xs::vector_view<const index_t>(t.data(), rows), ignore);
  std::vector<index_t> kept;
  for (index_t i = 0; i < rows; ++i)
    if (t_host[i] != ignore) kept.push_back(i);
  REQUIRE(batch.rows == static_cast<index_t>(kept.size()));
  const thrust::host_vector<index_t> sample(batch.sample.begin(), batch.sample.end()),
      target(batch.target.begin(), batch.target.end());
  const thrust::host_vector<float> packed(batch.hidden.begin(), batch.hidden.end());
  for (index_t r = 0; r < batch.rows; ++r) {
    CHECK(sample[r] == kept[r]);
    CHECK(target[r] == t_host[kept[r]]);
    for (index_t j = 0; j < d; ++j) CHECK(packed[r * d + j] == h_host[kept[r] * d + j]);
  }

  // Upstream gradients: mean = 1/kept; none with per-sample values = those values, gathered.
  const auto u_mean = xs::detail::upstream_gradients(ex, "t", batch, rows, xs::reduction::mean, {});
  const thrust::host_vector<float> um(u_mean.begin(), u_mean.end());
  for (index_t r = 0; r < batch.rows; ++r) CHECK(um[r] == 1.f / static_cast<float>(batch.rows));
  const test_vector<float> go = to_test(random_floats(g, static_cast<std::size_t>(rows)));
  const auto u_none = xs::detail::upstream_gradients(ex, "t", batch, rows, xs::reduction::none,
                                                     xs::vector_view<const float>(go.data(), rows));
  const thrust::host_vector<float> un(u_none.begin(), u_none.end());
  for (index_t r = 0; r < batch.rows; ++r) CHECK(un[r] == go[kept[r]]);

  // Scatter back: ignored rows are 0; the reduction sums in double.
  test_vector<float> per(static_cast<std::size_t>(rows), 7.f), back(static_cast<std::size_t>(rows * d), 7.f);
  xs::detail::scatter_losses(ex, batch, xs::detail::raw(batch.hidden), xs::vector_view<float>(per.data(), rows));
  xs::detail::scatter_rows(ex, batch, xs::detail::raw(batch.hidden), xs::matrix_view<float>(back.data(), rows, d));
  xs::detail::backend_ops<B>::synchronize(res);
  for (index_t i = 0; i < rows; ++i) {
    const bool ignored = t_host[i] == ignore;
    for (index_t j = 0; j < d; ++j) CHECK(back[i * d + j] == (ignored ? 0.f : h_host[i * d + j]));
  }
  double total = 0;
  for (index_t r = 0; r < batch.rows; ++r) total += packed[r];
  const float* first_values = xs::detail::raw(batch.hidden);
  CHECK(xs::detail::reduce_losses(ex, first_values, batch.rows, xs::reduction::sum) ==
        doctest::Approx(total).epsilon(1e-6));
  CHECK(xs::detail::reduce_losses(ex, first_values, batch.rows, xs::reduction::mean) ==
        doctest::Approx(total / static_cast<double>(batch.rows)).epsilon(1e-6));
  CHECK(xs::detail::reduce_losses(ex, first_values, 0, xs::reduction::mean) == 0.f);
}

namespace {
/// An element of 12 bytes: a list of them ends off an 8-byte boundary.
struct twelve_bytes {
  std::int32_t a, b, c;
};
}  // namespace

TEST_CASE_TEMPLATE("generic primitives: scratch_lists uploads several lists in one copy, each where it says", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  const std::vector<twelve_bytes> odd = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  const std::vector<index_t> empty, ids = {10, -20, 30, 1ll << 40};
  const std::vector<float> values = {0.5f, -1.25f};
  const auto before = xs::detail::call_counters::local();
  xs::detail::scratch_lists<B, twelve_bytes, index_t, index_t, float> lists(ex, odd, empty, ids, values);
  const auto cost = xs::detail::call_counters::since(before);
  CHECK(cost.uploads == 1);  // one upload for the four lists
  CHECK(cost.host_reads == 0);
  CHECK(lists.template list<1>() != nullptr);  // an empty list still has its place (not read)
  const auto back = [&](const auto* p, std::size_t n) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    std::vector<E> out(n);
    xs::detail::backend_ops<B>::copy(res, out.data(), p, static_cast<index_t>(n));
    return out;
  };
  const auto o = back(lists.template list<0>(), odd.size());
  for (std::size_t i = 0; i < odd.size(); ++i) {
    CHECK(o[i].a == odd[i].a);
    CHECK(o[i].c == odd[i].c);
  }
  CHECK(back(lists.template list<2>(), ids.size()) == ids);
  CHECK(back(lists.template list<3>(), values.size()) == values);
  CHECK(reinterpret_cast<std::uintptr_t>(lists.template list<2>()) % 8 == 0);
}

TEST_CASE_TEMPLATE("generic primitives: data checks name the first bad element and its value", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  test_vector<float> h(12, 0.5f);
  h[7] = std::numeric_limits<float>::quiet_NaN();
  h[10] = std::numeric_limits<float>::infinity();
  try {
    xs::detail::check_hidden(ex, "probe", xs::matrix_view<const float>(h.data(), 3, 4), 4);
    FAIL("no throw");
  } catch (const xs::non_finite_error& e) {
    CHECK(std::string(e.what()).find("hidden[1][3] = nan") != std::string::npos);
  }
  test_vector<index_t> t{0, 3, -100, std::numeric_limits<index_t>::max(), -1};
  try {
    xs::detail::check_targets(ex, "probe", xs::vector_view<const index_t>(t.data(), 5), 5, 4, -100);
    FAIL("no throw");
  } catch (const xs::out_of_range& e) {
    CHECK(std::string(e.what()).find("targets[3] = 9223372036854775807") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE("generic primitives: dense_softmax equals a float64 softmax cross-entropy and its gradients", B,
                   XSOFTMAX_TEST_BACKENDS) {
  // Few rows; then enough rows and columns for the host's exponential form of the backward
  // (dense_softmax.hpp: rows >= 64, n >= 4 d), with half the chunks kept and half recomputed, rows
  // sharing targets (their target terms subtract in order) and masked (-inf) columns.
  struct shape {
    index_t rows, n, d, chunk, cache_chunks, distinct_targets;
    bool masked;
  };
  for (const shape& sh : {shape{9, 37, 5, 8, 0, 37, false}, shape{70, 60, 5, 16, 2, 7, true}}) {
  INFO("rows ", sh.rows, ", n ", sh.n, ", d ", sh.d);
  std::mt19937 g(2);
  const index_t rows = sh.rows, n = sh.n, d = sh.d;
  const std::vector<float> h_host = random_floats(g, static_cast<std::size_t>(rows * d));
  const std::vector<float> w_host = random_floats(g, static_cast<std::size_t>(n * d));
  const std::vector<float> b_host = random_floats(g, static_cast<std::size_t>(n));
  std::vector<index_t> t_host(static_cast<std::size_t>(rows));
  for (auto& x : t_host) x = static_cast<index_t>(g() % sh.distinct_targets) * (n / sh.distinct_targets);
  // Masked columns: -inf offsets on every fifth column that is no row's target.
  std::vector<float> offset_host(static_cast<std::size_t>(n), 0.f);
  if (sh.masked)
    for (index_t c = 1; c < n; c += 5)
      if (std::find(t_host.begin(), t_host.end(), c) == t_host.end()) offset_host[c] = -INFINITY;
  std::vector<float> up_host = random_floats(g, static_cast<std::size_t>(rows));
  const test_vector<float> h = to_test(h_host), w = to_test(w_host), b = to_test(b_host), up = to_test(up_host),
                           offset = to_test(offset_host);
  const test_vector<index_t> t = to_test(t_host);
  test_vector<float> loss(static_cast<std::size_t>(rows), 0.f), gh(static_cast<std::size_t>(rows * d), 0.f);
  test_vector<float> gw(static_cast<std::size_t>(n * d)), gb(static_cast<std::size_t>(n));
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  xs::detail::dense_softmax_args a;
  a.h = xs::matrix_view<const float>(h.data(), rows, d);
  a.target = t.data();
  a.n = n;
  a.chunk = sh.chunk;  // several chunks, the last one short
  a.score_cache_bytes = sh.cache_chunks * rows * sh.chunk * index_t(sizeof(float));
  a.loss = loss.data();
  a.upstream = up.data();
  a.grad_h = gh.data();
  a.grad_w = gw.data();
  a.grad_b = gb.data();
  if (sh.masked) a.negative_offset = offset.data();
  xs::detail::dense_softmax(ex, xs::matrix_view<const float>(w.data(), n, d), b.data(), a);
  xs::detail::backend_ops<B>::synchronize(res);

  std::vector<double> ref_gw(static_cast<std::size_t>(n * d), 0.0), ref_gb(static_cast<std::size_t>(n), 0.0);
  for (index_t r = 0; r < rows; ++r) {
    std::vector<double> s(static_cast<std::size_t>(n));
    double m = -1e300;
    for (index_t c = 0; c < n; ++c) {
      double acc = b_host[c] + (c == t_host[r] ? 0.0 : double(offset_host[c]));
      for (index_t p = 0; p < d; ++p) acc += double(h_host[r * d + p]) * w_host[c * d + p];
      s[c] = acc;
      m = std::max(m, acc);
    }
    double z = 0;
    for (double x : s) z += std::exp(x - m);
    const double lse = m + std::log(z);
    CHECK(loss[r] == doctest::Approx(lse - s[t_host[r]]).epsilon(1e-5));
    for (index_t c = 0; c < n; ++c) {
      const double gs = (std::exp(s[c] - lse) - (c == t_host[r] ? 1.0 : 0.0)) * up_host[r];
      ref_gb[c] += gs;
      for (index_t p = 0; p < d; ++p) ref_gw[c * d + p] += gs * h_host[r * d + p];
    }
    for (index_t p = 0; p < d; ++p) {
      double acc = 0;
      for (index_t c = 0; c < n; ++c)
        acc += (std::exp(s[c] - lse) - (c == t_host[r] ? 1.0 : 0.0)) * up_host[r] * w_host[c * d + p];
      CHECK(gh[r * d + p] == doctest::Approx(acc).epsilon(1e-4).scale(1.0));
    }
  }
  for (index_t i = 0; i < n * d; ++i) CHECK(gw[i] == doctest::Approx(ref_gw[i]).epsilon(1e-4).scale(1.0));
  for (index_t c = 0; c < n; ++c) CHECK(gb[c] == doctest::Approx(ref_gb[c]).epsilon(1e-4).scale(1.0));
  }
}

TEST_CASE_TEMPLATE("generic primitives: running row top-k equals a stable sort (ties towards the smaller id)", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::mt19937 g(3);
  const index_t rows = 6, cols = 50, k = 7;
  std::vector<float> s_host(static_cast<std::size_t>(rows * cols));
  for (auto& x : s_host) x = static_cast<float>(g() % 13);  // many ties
  const test_vector<float> s = to_test(s_host);
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  xs::detail::basic_row_topk_state<B> st(rows, k, ex);
  for (index_t c0 = 0; c0 < cols; c0 += 16)  // in chunks, as the heads stream classes
    xs::detail::row_topk_update(ex, s.data() + c0, rows, std::min<index_t>(16, cols - c0), cols, c0, st);
  xs::detail::row_topk_finish(ex, rows, st);
  const thrust::host_vector<float> score(st.score.begin(), st.score.end());
  const thrust::host_vector<index_t> index(st.index.begin(), st.index.end());
  for (index_t r = 0; r < rows; ++r) {
    std::vector<index_t> order(static_cast<std::size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](index_t a, index_t b) { return s_host[r * cols + a] > s_host[r * cols + b]; });
    for (index_t j = 0; j < k; ++j) {
      CHECK(index[r * k + j] == order[j]);
      CHECK(score[r * k + j] == s_host[r * cols + order[j]]);
    }
  }
}

namespace {

/// One forward_backward on a tiny problem; the loss must be finite and positive.
template <class Head>
void one_step(const Head& head, index_t classes, index_t d) {
  std::mt19937 g(4);
  const index_t rows = 6;
  const test_vector<float> h = to_test(random_floats(g, static_cast<std::size_t>(rows * d)));
  test_vector<index_t> t(static_cast<std::size_t>(rows));
  for (auto& x : t) x = static_cast<index_t>(g() % classes);
  test_vector<float> gh(static_cast<std::size_t>(rows * d));
  typename Head::gradient_type grad;
  const float loss = head.forward_backward(xs::matrix_view<float>(const_cast<float*>(h.data()), rows, d),
                                           xs::vector_view<index_t>(t.data(), rows),
                                           xs::matrix_view<float>(gh.data(), rows, d), grad);
  CHECK(std::isfinite(loss));
  CHECK(loss > 0.f);
  CHECK(grad.num_rows() > 0);
}

}  // namespace

TEST_CASE_TEMPLATE("generic primitives: sparse_accumulate, sorted row lists and target lookup equal plain loops", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::mt19937 g(6);
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  // sparse_accumulate: sums per key in input order, keys ascending; float64 reference.
  const index_t n = 3000, dim = 5;
  std::vector<index_t> keys_host(static_cast<std::size_t>(n));
  for (auto& k : keys_host) k = static_cast<index_t>(g() % 97) * 3;
  const std::vector<float> values_host = random_floats(g, static_cast<std::size_t>(n * dim));
  const test_vector<index_t> keys = to_test(keys_host);
  const test_vector<float> values = to_test(values_host);
  xs::backend_vector<B, index_t> out_keys;
  xs::backend_vector<B, float> out_values;
  xs::detail::sparse_accumulate(ex, keys.data(), n, values.data(), dim, out_keys, out_values);
  std::map<index_t, std::vector<double>> want;
  for (index_t i = 0; i < n; ++i) {
    auto& w = want[keys_host[i]];
    w.resize(static_cast<std::size_t>(dim));
    for (index_t j = 0; j < dim; ++j) w[j] += values_host[i * dim + j];
  }
  const thrust::host_vector<index_t> got_keys(out_keys);
  const thrust::host_vector<float> got_values(out_values);
  REQUIRE(got_keys.size() == want.size());
  std::size_t r = 0;
  for (const auto& [key, sum] : want) {
    CHECK(got_keys[r] == key);
    for (index_t j = 0; j < dim; ++j) CHECK(got_values[r * dim + j] == doctest::Approx(sum[j]).epsilon(1e-5));
    ++r;
  }

  // sorted_rows: per-row lists with duplicates and empty slots become ascending unique rows.
  const index_t rows = 40, slots = 6;
  std::vector<index_t> row_host, id_host;
  std::vector<std::vector<index_t>> lists(static_cast<std::size_t>(rows));
  for (index_t i = 0; i < rows * slots; ++i) {
    const index_t row = static_cast<index_t>(g() % rows), id = static_cast<index_t>(g() % 12) - 2;  // -2, -1: empty
    row_host.push_back(row);
    id_host.push_back(id);
    if (id >= 0) lists[row].push_back(id);
  }
  xs::backend_vector<B, index_t> row_of(row_host.begin(), row_host.end()), ids(id_host.begin(), id_host.end());
  xs::active_set_for<B> set;
  set.reset(xs::active_layout::per_sample);
  xs::detail::sorted_rows(ex, rows, row_of, ids, set);
  const thrust::host_vector<index_t> off(set.offsets), flat(set.ids);
  REQUIRE(off.size() == std::size_t(rows + 1));
  for (index_t row = 0; row < rows; ++row) {
    auto& l = lists[row];
    std::sort(l.begin(), l.end());
    l.erase(std::unique(l.begin(), l.end()), l.end());
    CHECK(std::vector<index_t>(flat.begin() + off[row], flat.begin() + off[row + 1]) == l);
  }

  // locate_targets: positions of the targets in a shared set; a missing target names its sample.
  const test_vector<float> h = to_test(random_floats(g, 4 * 3));
  const test_vector<index_t> t = to_test(std::vector<index_t>{7, -100, 2, 9});
  const auto batch = xs::detail::pack_rows(ex, xs::matrix_view<const float>(h.data(), 4, 3),
                                           xs::vector_view<const index_t>(t.data(), 4), -100);
  xs::active_set_for<B> shared;
  const std::vector<index_t> classes{1, 2, 7, 9, 11};
  shared.classes.assign(classes.begin(), classes.end());
  const auto pos = xs::detail::locate_targets(ex, "test", shared, batch, 12);
  CHECK(std::vector<index_t>(pos.begin(), pos.end()) == std::vector<index_t>{2, 1, 3});
  const std::vector<index_t> without_nine{1, 2, 7, 11};
  shared.classes.assign(without_nine.begin(), without_nine.end());
  CHECK_THROWS_WITH_AS(xs::detail::locate_targets(ex, "test", shared, batch, 12),
                       "xsoftmax: test: the active set lacks the target 9 of sample 3", xs::invalid_argument);
  const std::vector<index_t> unsorted{1, 7, 2, 9};
  shared.classes.assign(unsorted.begin(), unsorted.end());
  CHECK_THROWS_WITH_AS(xs::detail::locate_targets(ex, "test", shared, batch, 12),
                       "xsoftmax: test: active set classes are not strictly ascending at [2] (7 then 2)", xs::invalid_argument);
}

TEST_CASE_TEMPLATE("every head instantiates and trains a step on every backend of the build", B,
                   XSOFTMAX_TEST_BACKENDS) {
  const index_t n = 40, d = 6;
  one_step(xs::full_softmax<xs::fp32, B>(n, d, true), n, d);
  one_step(xs::full_softmax<xs::bf16, B>(n, d), n, d);
  using uniform = xs::uniform_tree<2, 7>;
  one_step(xs::hierarchical_softmax<uniform, xs::fp32, B>(uniform(n), d, true), n, d);
  one_step(xs::hierarchical_softmax<uniform, xs::fp16, B>(uniform(n), d), n, d);
  std::vector<double> counts(static_cast<std::size_t>(n));
  for (index_t c = 0; c < n; ++c) counts[c] = 1.0 / static_cast<double>(c + 1);
  const auto huffman = xs::runtime_tree<>::huffman(counts, 2);
  one_step(xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B, xs::sigmoid_nodes>(huffman, d), n, d);
  one_step(xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, B>(xs::runtime_tree<>::huffman(counts, 3), d), n,
           d);
  // The active-set heads, with each selector.
  xs::sampling_options so;
  so.num_sampled = 8;
  one_step(xs::selective_softmax<xs::sampled_negatives, xs::fp32, B>(xs::sampled_negatives::uniform(n, so), n, d), n,
           d);
  one_step(xs::selective_softmax<xs::sampled_negatives, xs::bf16, B>(xs::sampled_negatives::from_counts(counts, so), n,
                                                                     d, true),
           n, d);
  xs::explicit_candidates shared;
  shared.set_shared({0, 3, 4, 5, 17});
  one_step(xs::selective_softmax<xs::explicit_candidates, xs::fp32, B>(shared, n, d), n, d);
  xs::knn_options ko;
  ko.graph.k = 5;
  one_step(xs::knn_softmax<xs::fp32, B>(n, d, ko, true), n, d);
  one_step(xs::selective_softmax<xs::feature_query_selector, xs::fp16, B>(xs::feature_query_selector(4), n, d), n, d);
}

TEST_CASE_TEMPLATE("generic primitives: group_by_key equals a stable sort by key and a count of each key", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::mt19937 g(5);
  const index_t n = 300, num_keys = 17;
  std::vector<index_t> keys_host(static_cast<std::size_t>(n));
  for (auto& x : keys_host) x = static_cast<index_t>(g() % (num_keys - 3));  // keys 14..16 stay empty
  keys_host[7] = num_keys - 1;                                                // but the last has one item
  const test_vector<index_t> keys = to_test(keys_host);
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  xs::backend_vector<B, index_t> sorted, items, offsets;
  xs::detail::group_by_key(ex, keys.data(), n, num_keys, sorted, items, offsets);
  const thrust::host_vector<index_t> s(sorted), it(items), off(offsets);
  // Oracle: a stable sort of 0..n-1 by key, and offsets from counts.
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return keys_host[a] < keys_host[b]; });
  std::vector<index_t> want_off(static_cast<std::size_t>(num_keys + 1), 0);
  for (index_t x : keys_host) ++want_off[x + 1];
  std::partial_sum(want_off.begin(), want_off.end(), want_off.begin());
  REQUIRE(static_cast<index_t>(it.size()) == n);
  REQUIRE(static_cast<index_t>(off.size()) == num_keys + 1);
  for (index_t i = 0; i < n; ++i) {
    CHECK(it[i] == order[i]);
    CHECK(s[i] == keys_host[order[i]]);
  }
  for (index_t j = 0; j <= num_keys; ++j) CHECK(off[j] == want_off[j]);
  CHECK(off[num_keys] == n);
  CHECK(std::vector<index_t>(keys.begin(), keys.end()) == keys_host);  // the keys are not changed
}

namespace {

/// out[r] = the sum of the `len[r]` outputs at c + at[r] (one row of a GEMM's output).
struct sum_output_row {
  const float* c;
  const index_t* at;
  const index_t* len;
  float* out;
  XSOFTMAX_HD void operator()(index_t r) const {
    float s = 0;
    for (index_t j = 0; j < len[r]; ++j) s += c[at[r] + j];
    out[r] = s;
  }
};

}  // namespace

TEST_CASE_TEMPLATE("generic primitives: gemm_batch and gemm_groups_then_rows equal a float64 product per GEMM", B,
                   XSOFTMAX_TEST_BACKENDS) {
  std::mt19937 g(6);
  // Three GEMMs C_i = A_i B_i^T of different shapes over one operand buffer, into disjoint blocks.
  const index_t shapes[3][3] = {{5, 7, 4}, {1, 9, 6}, {8, 3, 5}};  // m, n, k
  std::vector<float> a_host, b_host;
  std::vector<index_t> a_at, b_at, c_at;
  index_t c_size = 0;
  for (const auto& s : shapes) {
    a_at.push_back(static_cast<index_t>(a_host.size()));
    b_at.push_back(static_cast<index_t>(b_host.size()));
    c_at.push_back(c_size);
    for (index_t i = 0; i < s[0] * s[2]; ++i) a_host.push_back(static_cast<float>(static_cast<int>(g() % 7) - 3));
    for (index_t i = 0; i < s[1] * s[2]; ++i) b_host.push_back(static_cast<float>(static_cast<int>(g() % 7) - 3));
    c_size += s[0] * s[1];
  }
  const test_vector<float> a = to_test(a_host), b = to_test(b_host);
  test_vector<float> c(static_cast<std::size_t>(c_size), -1.f);
  std::vector<xs::detail::host::gemm_args> batch;
  for (int i = 0; i < 3; ++i) {
    xs::detail::host::gemm_args ga;
    ga.op_b = xs::detail::host::op::transpose;
    ga.m = shapes[i][0];
    ga.n = shapes[i][1];
    ga.k = shapes[i][2];
    ga.a = a.data() + a_at[i];
    ga.lda = ga.k;
    ga.b = b.data() + b_at[i];
    ga.ldb = ga.k;
    ga.c = c.data() + c_at[i];
    ga.ldc = ga.n;
    batch.push_back(ga);
  }
  const xs::backend_resources<B> res{};
  const xs::detail::execution<B> ex{res};
  xs::detail::gemm_batch(ex, batch.data(), static_cast<index_t>(batch.size()));
  xs::detail::backend_ops<B>::synchronize(res);
  const std::vector<float> got(c.begin(), c.end());
  for (int i = 0; i < 3; ++i)
    for (index_t r = 0; r < shapes[i][0]; ++r)
      for (index_t j = 0; j < shapes[i][1]; ++j) {
        double want = 0;
        for (index_t p = 0; p < shapes[i][2]; ++p)
          want += double(a_host[a_at[i] + r * shapes[i][2] + p]) * b_host[b_at[i] + j * shapes[i][2] + p];
        CHECK(got[c_at[i] + r * shapes[i][1] + j] == want);  // small integers: exact in fp32
      }
  // Groups: GEMM 0 alone, then GEMMs 1 and 2, each group followed by the sums of its output rows.
  std::fill(c.begin(), c.end(), -1.f);
  std::vector<index_t> at_host, len_host;
  for (int i = 0; i < 3; ++i)
    for (index_t r = 0; r < shapes[i][0]; ++r) at_host.push_back(c_at[i] + r * shapes[i][1]), len_host.push_back(shapes[i][1]);
  const test_vector<index_t> at = to_test(at_host), len = to_test(len_host);
  test_vector<float> sums(at_host.size(), -1.f);
  const index_t gemm_at[3] = {0, 1, 3};
  const index_t row_at[3] = {0, shapes[0][0], static_cast<index_t>(at_host.size())};
  xs::detail::gemm_groups_then_rows(ex, batch.data(), gemm_at, row_at, 2,
                                    sum_output_row{c.data(), at.data(), len.data(), sums.data()});
  xs::detail::backend_ops<B>::synchronize(res);
  const std::vector<float> got_sums(sums.begin(), sums.end());
  for (std::size_t r = 0; r < at_host.size(); ++r) {
    double want = 0;
    for (index_t j = 0; j < len_host[r]; ++j) want += got[at_host[r] + j];  // the products checked above
    CHECK(got_sums[r] == want);
  }
}
