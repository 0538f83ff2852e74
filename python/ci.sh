#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# CI of the PyTorch package: installs torch / numpy / pytest when missing, builds and installs the
# extension from this checkout (no build isolation: it builds against the installed torch; with its
# CUDA operators when torch has CUDA and nvcc is found), and runs the Python tests: every test on
# the CPU, and on CUDA where there is a GPU (skipped and counted otherwise). Exits non-zero on any
# failure.
#
#   python/ci.sh                 # from anywhere; PYTHON=python3.11 python/ci.sh to choose the interpreter
#
# Environment: PYTHON (default python3), MAX_JOBS (default 2), PYTEST_ARGS (extra pytest arguments),
# XSOFTMAX_SKIP_INSTALL=1 (test the package already installed), XSOFTMAX_WITH_CUDA (auto, 0, 1; see
# setup.py), TORCH_CUDA_ARCH_LIST (default here: the visible GPUs', else 9.0 -- one architecture
# keeps a CI build without a GPU to a compile-and-link check), XSOFTMAX_CUDA_PTX_ONLY (default here:
# 1 when no GPU is visible -- nothing runs the CUDA operators then, so they are built as PTX only
# with unoptimised host code, 30 % less nvcc time; 0 with a GPU).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
py="${PYTHON:-python3}"
export MAX_JOBS="${MAX_JOBS:-2}"
# The heads open many short OpenMP parallel regions: spinning waiters starve each other on shared
# CI machines (10-100x slower). libgomp reads this when torch loads it.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

echo "== xsoftmax python: interpreter $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
if ! "$py" -c "import torch, numpy, pytest" >/dev/null 2>&1; then
  echo "== installing torch numpy pytest"
  "$py" -m pip install torch numpy pytest
fi
"$py" -c "import torch; print('== torch', torch.__version__)"

if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  export TORCH_CUDA_ARCH_LIST=9.0
fi
if [[ -z "${XSOFTMAX_CUDA_PTX_ONLY:-}" ]]; then
  if "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    export XSOFTMAX_CUDA_PTX_ONLY=0
  else
    export XSOFTMAX_CUDA_PTX_ONLY=1
  fi
fi

if [[ "${XSOFTMAX_SKIP_INSTALL:-0}" != 1 ]]; then
  echo "== building and installing the extension (MAX_JOBS=$MAX_JOBS)"
  start=$(date +%s)
  # pip builds in place (./python/build); --no-build-isolation: use the installed torch
  "$py" -m pip install --no-build-isolation --no-deps "$repo/python"
  echo "== extension built and installed in $(( $(date +%s) - start )) s"
fi

# Run the tests against the installed package, not the source tree: from a directory that does not
# hold the xsoftmax package.
cd "$here/tests"
"$py" -c "import xsoftmax, os; print('== testing', os.path.dirname(xsoftmax.__file__)); print('== build', xsoftmax.build_info())"
"$py" -m pytest -q -p no:cacheprovider --rootdir "$here/tests" "$here/tests" ${PYTEST_ARGS:-}
echo "== xsoftmax python: all tests passed"
