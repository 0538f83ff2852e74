// SPDX-License-Identifier: Apache-2.0
// scratch_vector (a call's working memory: sized, movable, never value-initialised, from the
// execution's allocator on a device) and the tree-shaped loss reduction, on the host backends; the
// cuda backend runs the same code through every head's GPU test.

#include <xsoftmax/detail/primitives/batch_rows.hpp>
#include <xsoftmax/detail/primitives/scratch_buffer.hpp>
#include <xsoftmax/xsoftmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace {

using namespace xsoftmax;
using detail::scratch_vector;

template <class B>
void check_vector_semantics() {
  const host_resources res{};
  const detail::execution<B> ex{res};

  scratch_vector<B, float> filled(5, ex, 2.5f);
  REQUIRE(filled.size() == 5);
  for (std::size_t i = 0; i < filled.size(); ++i) CHECK(filled.data()[i] == 2.5f);

  // Growing keeps the elements there, shrinking keeps the memory, growing within it again too.
  filled.data()[4] = 7.f;
  filled.resize(9);
  CHECK(filled.size() == 9);
  CHECK(filled.data()[0] == 2.5f);
  CHECK(filled.data()[4] == 7.f);
  const float* memory = filled.data();
  filled.resize(3);
  CHECK(filled.size() == 3);
  CHECK(filled.data() == memory);
  filled.resize(8);
  CHECK(filled.data() == memory);
  CHECK(filled.end() - filled.begin() == 8);

  // A copy is deep; a move leaves the source empty.
  scratch_vector<B, float> copy = filled;
  copy.data()[0] = -1.f;
  CHECK(filled.data()[0] == 2.5f);
  scratch_vector<B, float> moved = std::move(copy);
  CHECK(moved.data()[0] == -1.f);
  CHECK(copy.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified

  // Unbound: assignable, resizable with the execution, but not grown alone (a device vector could
  // not allocate: the host refuses too, so host tests find the mistake).
  scratch_vector<B, index_t> unbound;
  CHECK_THROWS_AS(unbound.resize(4), std::logic_error);
  unbound.resize(0);  // no memory needed: fine
  unbound.resize(4, ex);
  CHECK(unbound.size() == 4);
  unbound.fill(3);
  CHECK(unbound[3] == 3);
  unbound = scratch_vector<B, index_t>(2, ex, 1);
  CHECK(unbound.size() == 2);
  CHECK(unbound[1] == 1);

  // Host-only construction needs no execution.
  scratch_vector<B, double> host_only(4, 0.5);
  host_only.resize(6);
  CHECK(host_only[0] == 0.5);
}

TEST_CASE("scratch_vector: sized, filled on request, grown and copied like a vector (host backends)") {
  check_vector_semantics<serial>();
  check_vector_semantics<omp>();
}

template <class B>
void check_reduction(index_t n) {
  const host_resources res{};
  const detail::execution<B> ex{res};
  std::vector<float> losses(static_cast<std::size_t>(n));
  double sum = 0;
  for (index_t i = 0; i < n; ++i) {
    losses[static_cast<std::size_t>(i)] = 0.25f + static_cast<float>((i * 7919) % 1000) * 1e-3f;
    sum += losses[static_cast<std::size_t>(i)];
  }
  const float total = detail::reduce_losses(ex, losses.data(), n, reduction::sum);
  const float mean = detail::reduce_losses(ex, losses.data(), n, reduction::mean);
  CHECK(total == doctest::Approx(sum).epsilon(1e-6));
  CHECK(mean == doctest::Approx(n > 0 ? sum / static_cast<double>(n) : 0.0).epsilon(1e-6));
}

TEST_CASE("reduce_losses: the block tree sums every loss once, at every level count (1, 2 and 3 levels)") {
  for (const index_t n : {0, 1, 63, 64, 65, 4096, 4097, 262144, 300001}) {
    CAPTURE(n);
    check_reduction<serial>(n);
    check_reduction<omp>(n);
  }
}

TEST_CASE("reduce_losses: the same sum on every host backend, bit for bit (fixed order)") {
  const host_resources res{};
  const index_t n = 100003;
  std::vector<float> losses(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) losses[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i)) + 1.5f;
  const float a = detail::reduce_losses(detail::execution<serial>{res}, losses.data(), n, reduction::sum);
  const float b = detail::reduce_losses(detail::execution<omp>{res}, losses.data(), n, reduction::sum);
  CHECK(a == b);
}

}  // namespace
