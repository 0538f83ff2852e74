// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: hidden rows of int. The verb's static_assert names the supported types.
#include <xsoftmax/full_softmax.hpp>

#include <vector>

int main() {
  xsoftmax::full_softmax<> head(10, 4);
  std::vector<int> h(8);
  std::vector<xsoftmax::index_t> t(2);
  (void)head.forward(xsoftmax::matrix_view<int>(h.data(), 2, 4), xsoftmax::vector_view<const xsoftmax::index_t>(t.data(), 2));
}
