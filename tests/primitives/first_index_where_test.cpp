// SPDX-License-Identifier: Apache-2.0
// `first_index_where` (detail/execution.hpp), the checks' search for their first bad element: on
// every backend the first index in [begin, end) whose predicate holds, or `end`, as std::find_if
// gives it, for hits anywhere (first, last, several, none) and empty ranges.

#include "support/reference.hpp"
#include "support/test_memory.hpp"

#include <xsoftmax/detail/execution.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#if XSOFTMAX_TEST_HOST_BUILD

namespace {

using xsoftmax::index_t;
namespace xd = xsoftmax::detail;

struct is_marked {
  const int* mark;
  XSOFTMAX_HD bool operator()(index_t i) const { return mark[i] != 0; }
};

TEST_CASE_TEMPLATE("first_index_where: the first index whose predicate holds, or end", B, XSOFTMAX_TEST_BACKENDS) {
  xsoftmax_test::test_rng rng(77);
  const xsoftmax::host_resources res;
  const xd::execution<B> ex{res};
  for (int trial = 0; trial < 200; ++trial) {
    const index_t n = rng.integer(0, 5000);
    std::vector<int> mark(static_cast<std::size_t>(n) + 1, 0);
    const int hits = static_cast<int>(rng.integer(0, 3));
    for (int h = 0; h < hits && n > 0; ++h) mark[static_cast<std::size_t>(rng.integer(0, n - 1))] = 1;
    if (trial % 7 == 0 && n > 0) mark[static_cast<std::size_t>(n - 1)] = 1;
    const index_t begin = n > 0 ? rng.integer(0, n - 1) : 0;
    const index_t expected = static_cast<index_t>(
        std::find_if(mark.begin() + begin, mark.begin() + n, [](int m) { return m != 0; }) - mark.begin());
    CHECK(xd::first_index_where(ex, begin, n, is_marked{mark.data()}) == expected);
  }
  CHECK(xd::first_index_where(ex, 5, 5, is_marked{nullptr}) == 5);  // empty: end, no call
  CHECK(xd::first_index_where(ex, 7, 3, is_marked{nullptr}) == 3);
}

}  // namespace

#endif  // XSOFTMAX_TEST_HOST_BUILD
