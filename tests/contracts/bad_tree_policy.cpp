// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: `int` is not a tree shape. tests/contracts/CMakeLists.txt checks that the
// first error is the head's static_assert naming the contract, not an error deep in detail/.
#include <xsoftmax/hierarchical_softmax.hpp>

int main() {
  xsoftmax::hierarchical_softmax<int> head(1000, 16);
  (void)head;
}
