#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The host test suite (xsoftmax_tests: every doctest case on the serial and omp backends) built with
# AddressSanitizer and UndefinedBehaviorSanitizer, then run: the regression tests of bad input
# (tests/validation, tests/optim/optimizer_input_test.cpp, the checkpoint tests) then also catch an
# out-of-bounds access or undefined behaviour that a normal build would let pass. Not part of CI
# (about 30 minutes to build on 2 cores); run it before a release and after changing validation code.
#
#   tests/run_sanitized_tests.sh [doctest options, e.g. -tc='checkpoint*']
#
# -fno-sanitize=null: Thrust binds a reference to the null storage of an empty vector whenever it
# copies an empty range (tests/fuzz/README.md); real null dereferences still crash under ASan.
# OpenMP's runtime is not instrumented; ASan's leak checker is off (libgomp's thread pool).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${BUILD:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize=null -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DXSOFTMAX_BUILD_BENCH=OFF -DXSOFTMAX_BUILD_EXAMPLES=OFF \
  -DXSOFTMAX_PYTHON_TESTS=OFF -DXSOFTMAX_MPI_TESTS=OFF -DXSOFTMAX_INSTALL=OFF ${XSOFTMAX_DOCTEST_INCLUDE_DIR:+-DXSOFTMAX_DOCTEST_INCLUDE_DIR=$XSOFTMAX_DOCTEST_INCLUDE_DIR}
cmake --build "$out" -j"${JOBS:-2}" --target xsoftmax_tests
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  OMP_WAIT_POLICY=passive OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} "$out/tests/xsoftmax_tests" "$@"
