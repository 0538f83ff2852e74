// SPDX-License-Identifier: Apache-2.0
// Issue 28: `runtime_tree::from_parents` checks num_classes against the parent array before it
// allocates anything: a num_classes that no tree of those nodes can hold is a `tree_error` naming
// the value, never `std::bad_alloc` or `std::length_error`.

#include <xsoftmax/error.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <string>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using tree64 = xs::runtime_tree<>;

template <class F>
void check_tree_error(F&& f, const std::string& text) {
  std::string what;
  bool caught = false;
  try {
    f();
  } catch (const xs::tree_error& e) {
    caught = true;
    what = e.what();
  } catch (const std::exception& e) {  // std::bad_alloc, std::length_error before the fix
    what = std::string("wrong exception type: ") + e.what();
  }
  INFO("message: ", what);
  CHECK(caught);
  CHECK(what.find(text) != std::string::npos);
}

}  // namespace

TEST_CASE("tree size: a class count larger than the parent array is a tree_error, before any allocation") {
  check_tree_error([] { (void)tree64::from_parents({2, 2, -1}, {0, 1, -1}, index_t(1) << 40); },
                   "num_classes = 1099511627776");
  check_tree_error(
      [] { (void)tree64::from_parents({2, 2, -1}, {0, 1, -1}, std::numeric_limits<index_t>::max()); },
      "num_classes = 9223372036854775807");
  check_tree_error([] { (void)tree64::from_parents({2, 2, -1}, {0, 1, -1}, 4); }, "exceeds the 3 nodes");
  check_tree_error([] { (void)xs::runtime_tree<8>::from_parents({-1, 0}, {-1, 0}, index_t(1) << 50); },
                   "num_classes = 1125899906842624");
  // The largest count the nodes could hold is still checked by the class rules, as before.
  check_tree_error([] { (void)tree64::from_parents({2, 2, -1}, {0, 1, -1}, 3); }, "class 2 is missing");
  // Boundaries unchanged: an empty parent array has no root; the class-parents form keeps its
  // shape_error; a well-formed tree still builds.
  check_tree_error([] { (void)tree64::from_parents({}, {}, index_t(1) << 40); }, "no root");
  CHECK_THROWS_AS((void)tree64::from_parents({2, 2, -1}, index_t(1) << 40), xs::shape_error);
  const auto t = tree64::from_parents({2, 2, -1}, {0, 1, -1}, 2);
  CHECK(t.num_classes() == 2);
  CHECK(t.num_rows() == 2);
}
