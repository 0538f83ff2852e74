// SPDX-License-Identifier: Apache-2.0
// `dot_rows8<N>` and `dot_grid8<R, C>` (detail/primitives/dot_rows.hpp: N dot products in one pass, used by the
// hierarchical softmax's grouped search scoring) bitwise against `dot_row8`, its oracle: the top-k
// log-probabilities must stay bitwise those of `log_distribution`, which scores one row at a time.
// On AVX2 hosts this compares the N-row AVX2 kernel with the one-row one; elsewhere `dot_rows8` is
// the `dot_row8` loop itself (and the test checks that).

#include "support/float_bits.hpp"
#include "support/reference.hpp"

#include <xsoftmax/detail/primitives/dot_rows.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

using xsoftmax_test::bits;

template <int N>
void check_widths() {
  xsoftmax_test::test_rng rng(7 + N);
  for (index_t d = 0; d <= 40; ++d)
    for (const index_t extra : {0, 100, 256}) {
      const index_t n = d + extra;
      // Rows of unrelated lengths' worth of data at unrelated (unaligned) offsets.
      const auto hs = xsoftmax_test::random_floats(rng, N * n + N, 1.0), ws = xsoftmax_test::random_floats(rng, N * n + N, 1.0);
      const float* h[N];
      const float* w[N];
      for (int r = 0; r < N; ++r) {
        h[r] = hs.data() + r * n + r;
        w[r] = ws.data() + (N - 1 - r) * n + (r % 2);
      }
      float out[N];
      xd::dot_rows8<N>(h, w, n, out);
      INFO("N = ", N, ", d = ", n);
      for (int r = 0; r < N; ++r) CHECK(bits(out[r]) == bits(xd::dot_row8(h[r], w[r], n)));
    }
}

TEST_CASE("dot_rows8: each of the N dots is bitwise dot_row8's (N = 1, 2, 4), d = 0..40, +100, +256") {
  check_widths<1>();
  check_widths<2>();
  check_widths<4>();
}

TEST_CASE("dot_rows8: the same row twice gives the same bits (no state shared between the N sums)") {
  xsoftmax_test::test_rng rng(11);
  const auto hv = xsoftmax_test::random_floats(rng, 103, 10.0), wv = xsoftmax_test::random_floats(rng, 103, 10.0);
  const float* h[4] = {hv.data(), hv.data(), hv.data() + 1, hv.data()};
  const float* w[4] = {wv.data(), wv.data(), wv.data(), wv.data() + 1};
  float out[4];
  xd::dot_rows8<4>(h, w, 102, out);
  CHECK(bits(out[0]) == bits(out[1]));
  CHECK(bits(out[0]) == bits(xd::dot_row8(hv.data(), wv.data(), 102)));
  CHECK(bits(out[2]) == bits(xd::dot_row8(hv.data() + 1, wv.data(), 102)));
  CHECK(bits(out[3]) == bits(xd::dot_row8(hv.data(), wv.data() + 1, 102)));
}

template <int R, int C>
void check_grid_widths() {
  xsoftmax_test::test_rng rng(5 + R * C);
  for (index_t d = 0; d <= 40; ++d)
    for (const index_t extra : {0, 100, 256}) {
      const index_t n = d + extra;
      const auto hs = xsoftmax_test::random_floats(rng, R * n + R, 1.0), ws = xsoftmax_test::random_floats(rng, C * n + C, 1.0);
      const float* h[R];
      const float* w[C];
      for (int r = 0; r < R; ++r) h[r] = hs.data() + r * n + r;
      for (int c = 0; c < C; ++c) w[c] = ws.data() + (C - 1 - c) * n + (c % 2);
      float out[R * C];
      xd::dot_grid8<R, C>(h, w, n, out);
      INFO("R = ", R, ", C = ", C, ", d = ", n);
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) CHECK(bits(out[r * C + c]) == bits(xd::dot_row8(h[r], w[c], n)));
    }
}

TEST_CASE("dot_grid8: each of the R x C dots is bitwise dot_row8's (4 x 2: the AVX2 kernel; 3 x 2, 4 x 1), "
          "d = 0..40, +100, +256") {
  check_grid_widths<4, 2>();
  check_grid_widths<3, 2>();
  check_grid_widths<4, 1>();
}

}  // namespace
