// SPDX-License-Identifier: Apache-2.0
// The class-sharded full softmax with one rank (solo_communicator) on every backend of the build,
// in both hidden layouts: loss, per-sample losses, grad_hidden, the weight gradient, log_prob and
// top-k equal the unsharded head's on the same weights (the sharded path gathers, combines row
// statistics and returns gradients through the communicator even with one rank). The multi-rank
// tests run under mpiexec (sharded_full_softmax_mpi.cpp).

#include "support/test_memory.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>

#include <doctest/doctest.h>

#include <thrust/host_vector.h>

#include <random>
#include <vector>

namespace {
namespace xs = xsoftmax;
using xs::index_t;
using xsoftmax_test::test_vector;

/// A backend vector's values on the host.
template <class V>
std::vector<typename V::value_type> host_copy(const V& v) {
  const thrust::host_vector<typename V::value_type> h(v);
  return {h.begin(), h.end()};
}
}  // namespace

TEST_CASE_TEMPLATE("class_sharding<solo_communicator> equals the unsharded full softmax", B, XSOFTMAX_TEST_BACKENDS) {
  constexpr index_t n = 300, d = 12, rows = 20;
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 0.7f);
  test_vector<float> w(n * d), bias(n), h(rows * d);
  for (auto& x : w) x = nd(g);
  for (auto& x : bias) x = 0.1f * nd(g);
  for (auto& x : h) x = nd(g);
  test_vector<index_t> t(rows);
  for (index_t i = 0; i < rows; ++i) t[i] = i % 7 == 6 ? -100 : static_cast<index_t>(g() % n);

  using sharding = xs::class_sharding<xs::solo_communicator>;
  xs::full_softmax<xs::fp32, B> reference(xs::matrix_view<float>(w.data(), n, d), bias.data());
  for (auto layout : {xs::hidden_layout::data_parallel, xs::hidden_layout::replicated}) {
    xs::full_softmax<xs::fp32, B, sharding> head(sharding({}, n, layout), xs::matrix_view<float>(w.data(), n, d),
                                                 bias.data());
    CHECK(head.num_classes() == n);
    CHECK(head.local_classes() == n);
    xs::loss_options o;
    o.label_smoothing = 0.05f;
    o.z_loss = 1e-3f;
    o.softcap = 2.5f;  // soft-capped logits too (the unsharded head's against its reference: softcap_class_weight_test)
    test_vector<float> gh(rows * d), ref_gh(rows * d), per(rows), ref_per(rows);
    typename decltype(head)::gradient_type gw, ref_gw;
    const xs::matrix_view<const float> hv(h.data(), rows, d);
    const xs::vector_view<const index_t> tv(t.data(), rows);
    const float loss = head.forward_backward(hv, tv, xs::matrix_view<float>(gh.data(), rows, d), gw, o,
                                             xs::vector_view<float>(per.data(), rows));
    const float ref_loss = reference.forward_backward(hv, tv, xs::matrix_view<float>(ref_gh.data(), rows, d), ref_gw, o,
                                                      xs::vector_view<float>(ref_per.data(), rows));
    // One rank: the same operations in the same order as the unsharded head.
    CHECK(loss == ref_loss);
    CHECK(std::vector<float>(gh.begin(), gh.end()) == std::vector<float>(ref_gh.begin(), ref_gh.end()));
    CHECK(std::vector<float>(per.begin(), per.end()) == std::vector<float>(ref_per.begin(), ref_per.end()));
    CHECK(host_copy(gw.values) == host_copy(ref_gw.values));
    CHECK(host_copy(gw.bias_values) == host_copy(ref_gw.bias_values));
    // Class weights are not taken by the class-sharded heads: refused, naming them.
    test_vector<float> cw(n, 1.f);
    xs::loss_options weighted;
    weighted.class_weight = xs::vector_view<const float>(cw.data(), n);
    CHECK_THROWS_WITH_AS((void)head.forward(hv, tv, weighted), doctest::Contains("class_weight is not supported"),
                         xs::invalid_argument);

    constexpr index_t k = 4;
    test_vector<index_t> c(rows * k), ref_c(rows * k);
    test_vector<float> v(rows * k), ref_v(rows * k);
    head.topk(hv, k, xs::matrix_view<index_t>(c.data(), rows, k), xs::matrix_view<float>(v.data(), rows, k));
    reference.topk(hv, k, xs::matrix_view<index_t>(ref_c.data(), rows, k), xs::matrix_view<float>(ref_v.data(), rows, k));
    CHECK(std::vector<index_t>(c.begin(), c.end()) == std::vector<index_t>(ref_c.begin(), ref_c.end()));
    CHECK(std::vector<float>(v.begin(), v.end()) == std::vector<float>(ref_v.begin(), ref_v.end()));

    // The loss and the top-k in one pass (soft-capped, label smoothing, ignored rows): one rank is
    // the unsharded head's forward_topk, bit for bit.
    const float fused = head.forward_topk(hv, tv, k, xs::matrix_view<index_t>(c.data(), rows, k),
                                          xs::matrix_view<float>(v.data(), rows, k), o,
                                          xs::vector_view<float>(per.data(), rows));
    const float ref_fused = reference.forward_topk(hv, tv, k, xs::matrix_view<index_t>(ref_c.data(), rows, k),
                                                   xs::matrix_view<float>(ref_v.data(), rows, k), o,
                                                   xs::vector_view<float>(ref_per.data(), rows));
    CHECK(fused == ref_fused);
    CHECK(std::vector<float>(per.begin(), per.end()) == std::vector<float>(ref_per.begin(), ref_per.end()));
    CHECK(std::vector<index_t>(c.begin(), c.end()) == std::vector<index_t>(ref_c.begin(), ref_c.end()));
    CHECK(std::vector<float>(v.begin(), v.end()) == std::vector<float>(ref_v.begin(), ref_v.end()));
    CHECK(c[6 * k] == -1);  // row 6's target is ignored
  }
}
