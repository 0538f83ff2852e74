#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Builds a libFuzzer target of tests/fuzz/ with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs it for a bounded time (not part of CI: see README.md).
#   tests/fuzz/run_fuzz.sh [seconds = 600] [jobs = 1] [target = fuzz_inputs | fuzz_checkpoint]
# Each input runs under a time limit (10 s) and a memory limit (2 GB): a hang or a huge allocation
# driven by the input is a finding.
# Needs clang and its runtime (Debian 12: apt-get install clang libclang-rt-14-dev) and the CUDA
# toolkit headers (for <cuda_bf16.h>, Thrust), as every host build of xsoftmax.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
seconds=${1:-600}
jobs=${2:-1}
target=${3:-fuzz_inputs}
cuda=${CUDAToolkit_ROOT:-/usr/local/cuda}
out=build-fuzz
corpus=corpus
max_len=4096
if [[ $target == fuzz_checkpoint ]]; then corpus=corpus_checkpoint max_len=16384; fi
mkdir -p "$out/$corpus"
# -fno-sanitize=null: Thrust binds references to the null storage of empty vectors when it copies
# empty ranges (a report inside Thrust, on every empty copy); real null dereferences still crash
# under AddressSanitizer.
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize=null -fno-sanitize-recover=undefined \
  -I include -I tests -I "$cuda/include/cccl" -isystem "$cuda/include" \
  "tests/fuzz/$target.cpp" -o "$out/$target"
# The checkpoint target's seeds: a real checkpoint of each kind (it writes them itself).
if [[ $target == fuzz_checkpoint ]]; then "$out/$target" --make-corpus "$out/$corpus"; fi
echo "== fuzzing $target for ${seconds} s (${jobs} job(s)); corpus in $out/$corpus, job logs in $out/fuzz-*.log"
start=$(date +%s)
# From inside $out: with -jobs, libFuzzer writes each job's log (fuzz-N.log) and any crash
# artifact to its working directory, which must not be the checkout.
(cd "$out" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "./$target" "$corpus" -max_total_time="$seconds" -jobs="$jobs" -workers="$jobs" \
  -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 25)
echo "== ran $(($(date +%s) - start)) s"
