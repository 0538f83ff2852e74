// SPDX-License-Identifier: Apache-2.0
// Smallest possible test: the library's configuration header compiles and says what it promises.
#include <xsoftmax/config.hpp>

#include <doctest/doctest.h>

#include <type_traits>

TEST_CASE("config: index_t is a signed 64-bit integer") {
  static_assert(sizeof(xsoftmax::index_t) == 8, "index_t must be 64 bits");
  CHECK(std::is_signed_v<xsoftmax::index_t>);
}
