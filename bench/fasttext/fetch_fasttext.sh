#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Fetches fastText's own C++ sources (the peer of bench/fasttext_peer_bench.cpp) and prints the
# absolute path of fastText's src/ directory, to hand to CMake:
#
#   cmake -S . -B build -DXSOFTMAX_FASTTEXT_SRC="$(bench/fasttext/fetch_fasttext.sh)"
#
# Source: the `fasttext-wheel` sdist on PyPI (fastText v0.9.2's src/*.cc and *.h, MIT licensed),
# fetched with `pip download --no-deps --no-binary :all:` into a cache directory and unpacked there.
#
# Usage: bench/fasttext/fetch_fasttext.sh [CACHE_DIR]
#   CACHE_DIR      where to download and unpack (default: bench/fasttext/.src next to this script;
#                  ignored by git through the repository's .gitignore)
#   FASTTEXT_VERSION  environment variable, the sdist version (default 0.9.2)
#   PIP            environment variable, the pip command (default: `python3 -m pip`)
#
# Idempotent: when CACHE_DIR/fasttext-wheel-$FASTTEXT_VERSION/src/loss.cc already exists nothing is
# downloaded or unpacked again. Everything but the final path goes to stderr, so the script can be
# used inside $(...).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${1:-$here/.src}"
version="${FASTTEXT_VERSION:-0.9.2}"
pip_cmd="${PIP:-python3 -m pip}"

mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
src="$cache/fasttext-wheel-$version/src"

if [[ ! -f "$src/loss.cc" ]]; then
  sdist="$cache/fasttext-wheel-$version.tar.gz"
  if [[ ! -f "$sdist" ]]; then
    echo "fetch_fasttext: downloading fasttext-wheel==$version (sdist) into $cache" >&2
    # --no-build-isolation is not used: pip may need to prepare the sdist's metadata in an isolated
    # environment (it fetches setuptools/pybind11 for that; nothing is built or installed).
    $pip_cmd download --no-deps --no-binary :all: -d "$cache" "fasttext-wheel==$version" >&2
  fi
  [[ -f "$sdist" ]] || { echo "fetch_fasttext: $sdist not found after pip download" >&2; exit 1; }
  echo "fetch_fasttext: unpacking $sdist" >&2
  tar -xzf "$sdist" -C "$cache"
  [[ -f "$src/loss.cc" ]] || { echo "fetch_fasttext: $src/loss.cc missing from the sdist" >&2; exit 1; }
fi

echo "$src"
