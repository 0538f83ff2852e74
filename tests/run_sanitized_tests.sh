#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The host tests built with AddressSanitizer and UndefinedBehaviorSanitizer, then run, so that the
# regression tests of bad input also catch an out-of-bounds access or undefined behaviour that a
# normal build lets pass. Not part of CI (CI has 60 minutes on 2 cores).
#
#   tests/run_sanitized_tests.sh             # the validation, optimizer, checkpoint and tree tests
#                                            # (one g++ call per source; 3 minutes on 2 cores)
#   FULL=1 tests/run_sanitized_tests.sh      # every doctest case (xsoftmax_tests through CMake;
#                                            # about 1.5 hours of 2 cores: the head tests' objects are
#                                            # heavy under ASan; clean at 03e2189, tests/fuzz/README.md)
#   tests/run_sanitized_tests.sh -tc='checkpoint*'   # doctest options pass through
#
# -fno-sanitize=null: Thrust binds a reference to the null storage of an empty vector whenever it
# copies an empty range (tests/fuzz/README.md); real null dereferences still crash under ASan.
# Leak checking is off (libgomp keeps its thread pool). Needs doctest's headers (Debian's
# doctest-dev, or XSOFTMAX_DOCTEST_INCLUDE_DIR) and the CUDA toolkit headers, as every host build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${BUILD:-build-asan}
cuda=${CUDAToolkit_ROOT:-/usr/local/cuda}
sanitize="-fsanitize=address,undefined -fno-sanitize=null -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$out"
if [[ -n ${FULL:-} ]]; then
  cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$sanitize" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DXSOFTMAX_BUILD_BENCH=OFF -DXSOFTMAX_BUILD_EXAMPLES=OFF \
    -DXSOFTMAX_PYTHON_TESTS=OFF -DXSOFTMAX_MPI_TESTS=OFF -DXSOFTMAX_INSTALL=OFF \
    ${XSOFTMAX_DOCTEST_INCLUDE_DIR:+-DXSOFTMAX_DOCTEST_INCLUDE_DIR=$XSOFTMAX_DOCTEST_INCLUDE_DIR}
  cmake --build "$out" -j"${JOBS:-2}" --target xsoftmax_tests
  binary=$out/tests/xsoftmax_tests
else
  sources=(tests/main.cpp tests/validation/bad_input_test.cpp tests/optim/optimizer_input_test.cpp
           tests/optim/topk_sparsifier_test.cpp tests/io/checkpoint_test.cpp tests/io/sharded_checkpoint_test.cpp
           tests/io/safetensors_test.cpp tests/tree/runtime_tree_test.cpp tests/tree/tree_size_test.cpp)
  includes=(-I include -I tests -I "$cuda/include/cccl" -isystem "$cuda/include")
  if [[ -n ${XSOFTMAX_DOCTEST_INCLUDE_DIR:-} ]]; then includes+=(-I "$XSOFTMAX_DOCTEST_INCLUDE_DIR"); fi
  objects=()
  for s in "${sources[@]}"; do
    o=$out/$(basename "${s%.cpp}").o
    objects+=("$o")
    # shellcheck disable=SC2086  # $sanitize is words on purpose
    echo "g++ -O1 -g $sanitize -fopenmp -std=c++17 -c $s" && g++ -O1 -g $sanitize -fopenmp -std=c++17 "${includes[@]}" -c "$s" -o "$o" &
    while (( $(jobs -r | wc -l) >= ${JOBS:-2} )); do wait -n; done
  done
  wait
  binary=$out/xsoftmax_sanitized_tests
  # shellcheck disable=SC2086
  g++ $sanitize -fopenmp "${objects[@]}" -o "$binary"
fi
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  OMP_WAIT_POLICY=passive "$binary" "$@"
