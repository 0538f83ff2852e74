// SPDX-License-Identifier: Apache-2.0
// Built against an installed xsoftmax by .ci/run: proves the installed headers and the CMake
// package (include directories, dependencies, compile definitions) work from outside the tree.
#include <xsoftmax/config.hpp>
#include <xsoftmax/types.hpp>

#include <cstdio>

int main() {
  static_assert(sizeof(xsoftmax::index_t) == 8, "index_t must be 64 bits");
  std::printf("xsoftmax %d.%d.%d installed and usable (cblas: %s)\n", XSOFTMAX_VERSION_MAJOR,
              XSOFTMAX_VERSION_MINOR, XSOFTMAX_VERSION_PATCH,
#if defined(XSOFTMAX_HAS_CBLAS) && XSOFTMAX_HAS_CBLAS
              "yes"
#else
              "no"
#endif
  );
  return 0;
}
