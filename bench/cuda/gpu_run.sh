#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Everything the CUDA backend must prove on an H100/H200, in phases that each fit one call of a
# lent GPU machine (10 minutes at most a call): build, test, sanitize, bench, peer.
#
#   bench/cuda/gpu_run.sh build      configure + build the GPU tests, heads_cuda_bench, the CUDA example
#   bench/cuda/gpu_run.sh test       every GPU test case, each in its own process, then the CUDA example
#   bench/cuda/gpu_run.sh sanitize   compute-sanitizer memcheck on every case, racecheck on the CUDA cases
#   bench/cuda/gpu_run.sh sanitize2  compute-sanitizer synccheck and initcheck on the CUDA cases
#                                    (sanitizers too run each case in its own process)
#   bench/cuda/gpu_run.sh bench      heads_cuda_bench (--quick first, then the full sizes)
#   bench/cuda/gpu_run.sh peer       bench/cuda/torch_peer.py, and the device-to-device copy rate
#   bench/cuda/gpu_run.sh all        the six in order
#   bench/cuda/gpu_run.sh first      for a session's whole device budget of 15 minutes (a machine's start
#                                    takes 1-2 of them): build (about 5.5 minutes on 16 cores), every test
#                                    case in its own process (a crash fails that case only), the example,
#                                    memcheck the same way, the quick bench, each under its own time limit,
#                                    in one call of at most about 9 minutes (device tool: timeout_s 600)
#   bench/cuda/gpu_run.sh pyfirst    instead of `first`, for the PyTorch package (issue 27): built there beside
#                                    heads_cuda_bench, then the `python` phase, in one call of about 9.5 minutes
#   bench/cuda/gpu_run.sh second     the call right after `first` (the machine goes back after 30 s idle:
#                                    have it typed): the per-kernel breakdown (ncu) of the headline
#                                    configurations every GPU session must bring back, in about 4 minutes
#                                    (device tool: timeout_s 270), packed
#   bench/cuda/gpu_run.sh prebuilt   the same checks on binaries built here (saves the device build):
#                                    `BUILD=<sm_90 build> bench/cuda/gpu_run.sh carry` puts them, stripped
#                                    and compressed, in .gpu-bin/ (name it in `carry`); about 2.5 minutes
#   bench/cuda/gpu_run.sh fresh      here: whether .gpu-bin/ and .gpu-py/ still match HEAD (their COMMIT
#                                    stamps); when they do, spend a lent machine at once
#   bench/cuda/gpu_run.sh rerun      after `prebuilt`: every case again, then the failing ones ($CASES) with
#                                    pinned instead of managed test memory; a crash prints the faulting
#                                    address and the code addresses on the stack (tests/cuda/main.cu)
#   bench/cuda/gpu_run.sh profile    one quick-bench head ($PROFILE_FILTER) under nsys (or ncu): API calls,
#                                    kernels, copies, summed
#   bench/cuda/gpu_run.sh profiles   the per-kernel breakdown of each headline configuration (ncu)
#   bench/cuda/gpu_run.sh carry_python  here: the PyTorch package built against the GPU image's torch
#                                    (Python 3.12, torch 2.11.0+cu130: $PY_FOR_GPU) into .gpu-py/
#   bench/cuda/gpu_run.sh python     the PyTorch package on CUDA: its CUDA tests (pytest -m cuda), the
#                                    peers with xsoftmax's operators (torch_peer.py), train_hs.py --device
#                                    cuda at 1M classes; .gpu-py/ carried, or built there (PY_BUILD=1)
#   bench/cuda/gpu_run.sh pack       $OUT's logs into logs.tar.gz (the device tool brings 8 files back)
#   bench/cuda/gpu_run.sh poison     the CUDA cases with poisoned workspace pieces (XSOFTMAX_POISON_WORKSPACE)
#   bench/cuda/gpu_run.sh sweep      the tree-shape sweep at 1M and 10M classes: JSON and PNG
#   bench/cuda/gpu_run.sh scale      one HS training step over $SCALE_N classes (default 100M: an H200)
#   bench/cuda/gpu_run.sh rowblocks  the full softmax at the PyTorch peer's shape in row blocks that keep
#                                    every score ($ROW_BLOCKS) at several chunk sizes ($CHUNKS), then the
#                                    peer (PyTorch, Cut Cross-Entropy, Liger) on the same machine
#   bench/cuda/gpu_run.sh hstopk     the HS top-10 before and after 300 SGD steps on the bench's inputs,
#                                    with the search's expansions a row (issue 26, target 4)
#   bench/cuda/gpu_run.sh hsab       the HS's wide gather levels a node at a time (the default) against a
#                                    block per sample (XSOFTMAX_CUDA_HS_GATHER=per_sample), alternated
#   bench/cuda/gpu_run.sh carry_mpi  here: OpenMPI's runtime (Debian's packages, unpacked) and the CUDA MPI test
#                                    binary (xsoftmax_cuda_mpi_tests of $BUILD, sm_90) into .mpi/ (name it in
#                                    `carry`): the GPU image has no MPI (issue 26, target 8)
#   bench/cuda/gpu_run.sh mpi        the class-sharded full softmax and HS under mpiexec with 1, 2 and 4 ranks
#                                    sharing the GPU, against the unsharded cuda heads ($MPI_RANKS, each under
#                                    $MPI_LIMIT seconds, default 150)
#   bench/cuda/gpu_run.sh session    a whole session's plan in one call of about 9 minutes on carried
#                                    binaries (carry .gpu-bin .whl): prebuilt, rowblocks, sweep at 1M,
#                                    scale at $SCALE_N (default 60M: an H100), pack; each under a limit
#
# The GPU machine reaches no package registry. It has nvcc, CMake, ninja, compute-sanitizer and
# PyTorch; doctest (header-only) must be carried: copy /usr/include/doctest into .deps/doctest/ here
# (`mkdir -p .deps && cp -r /usr/include/doctest .deps/`) and name `.deps` in the device tool's
# `carry`. Outputs go to $OUT (the device tool's folder that comes back), or ./gpu-out.
# Environment: BUILD (default build-gpu), XSOFTMAX_DOCTEST_INCLUDE_DIR (default .deps).
set -euo pipefail

self=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$self")/../.."
out=${OUT:-gpu-out}
build=${BUILD:-build-gpu}
doctest_dir=${XSOFTMAX_DOCTEST_INCLUDE_DIR:-$PWD/.deps}
mkdir -p "$out"

log() { echo "== $*" | tee -a "$out/phases.txt"; }

# The folder of PyTorch's NCCL wheel (nvidia-nccl-cu13), or nothing.
nccl_wheel() { python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true; }

build() {
  log "build $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt" || true
  nvcc --version | tail -n 2 | tee -a "$out/gpu.txt"
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  # NCCL: the CUDA toolkit's own when it has one, else the one PyTorch's wheels bring
  # (nvidia-nccl-cu13: include/nccl.h and lib/libnccl.so.2, no unversioned .so), so that the
  # one-rank nccl_communicator test is compiled and run.
  local nccl=()
  if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
    local wheel
    wheel=$(nccl_wheel)
    if [[ -n $wheel && -e $wheel/include/nccl.h ]]; then
      nccl=(-DXSOFTMAX_NCCL_INCLUDE_DIR="$wheel/include" -DXSOFTMAX_NCCL_LIBRARY="$(ls "$wheel"/lib/libnccl.so* | head -n 1)")
    fi
  fi
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DXSOFTMAX_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DXSOFTMAX_INSTALL=OFF "${nccl[@]}" \
    -DXSOFTMAX_DOCTEST_INCLUDE_DIR="$doctest_dir" > "$out/configure.txt" 2>&1
  grep -E 'NCCL|CBLAS|doctest' "$out/configure.txt" || true
  # shellcheck disable=SC2086  # $BUILD_TARGETS: words
  cmake --build "$build" -j "${BUILD_JOBS:-$(nproc)}" --target ${BUILD_TARGETS:-xsoftmax_cuda_tests heads_cuda_bench cuda_training_step} 2>&1 |
    tail -n 20
  # The CUDA MPI tests, where an MPI is found (here; the GPU image has none: carry_mpi brings them).
  if [[ -z ${BUILD_TARGETS:-} ]] && grep -q xsoftmax_cuda_mpi_tests "$build/build.ninja" "$build/Makefile" 2> /dev/null; then
    cmake --build "$build" -j "$(nproc)" --target xsoftmax_cuda_mpi_tests 2>&1 | tail -n 5
  fi
}

# One call for the whole 15-minute budget (see the header): each step under `timeout`, so a hang or
# a slow tool costs its own limit, not the call. Limits in seconds, chosen to end by about 540 s.
first() {
  # The build took about 330 s on an H200 machine's 16 cores at stop 50 (270 s, the old limit, cut
  # it short); what the build leaves of the call's ~570 s goes to the tests (8 processes at a time),
  # the example, memcheck and the quick bench (about 40 s together with the example).
  local t0=$SECONDS rc=0 limit=${BUILD_LIMIT:-400}
  timeout "$limit" bash "$self" build > "$out/build.txt" 2>&1 || rc=$?
  log "build: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
  if [[ -e $out/configure.txt ]]; then cat "$out/configure.txt" >> "$out/build.txt" && rm -f "$out/configure.txt"; fi
  local left=$(( 570 - (SECONDS - t0) - 40 ))
  export TEST_JOBS=${TEST_JOBS:-8}
  export TESTS_LIMIT=${TESTS_LIMIT:-$(( left < 150 ? (left > 30 ? left : 30) : 150 ))}
  local memcheck=$(( left - TESTS_LIMIT ))
  export MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-$(( memcheck > 30 ? memcheck : 0 ))}
  check_binaries "$build/tests/cuda/xsoftmax_cuda_tests" "$build/examples/cuda_training_step" \
    "$build/bench/cuda/heads_cuda_bench"
}

# Puts the three GPU binaries of an sm_90 build ($build, configured as build() does, with
# -DXSOFTMAX_BUILD_BENCH=ON -DXSOFTMAX_BUILD_EXAMPLES=ON) into .gpu-bin/, stripped and xz-compressed
# (the test binary is 125 MB stripped, 28 MB compressed; the device tool carries 64 MiB at most).
carry_phase() {
  rm -rf .gpu-bin && mkdir -p .gpu-bin
  local f
  for f in tests/cuda/xsoftmax_cuda_tests bench/cuda/heads_cuda_bench examples/cuda_training_step; do
    strip -o ".gpu-bin/$(basename "$f")" "$build/$f"
    xz -T0 -3 ".gpu-bin/$(basename "$f")"
  done
  stamp .gpu-bin
  du -sh .gpu-bin/*
}

# Writes <folder>/COMMIT: the commit the carried build was made from (with "+dirty" when include/,
# tests/, bench/, examples/ or python/ had changes), so that a later session can tell at no device
# cost whether the carried binaries still match its code (`bench/cuda/gpu_run.sh fresh`).
stamp() {
  local commit
  commit=$(git rev-parse HEAD)
  git diff --quiet HEAD -- include tests bench/cuda examples python CMakeLists.txt ':!*.md' ':!*.sh' || commit+="+dirty"
  echo "$commit" > "$1/COMMIT"
}

# Here, before a device call: says whether .gpu-bin/ and .gpu-py/ were built from code that still
# matches HEAD (nothing the GPU binaries compile changed since). Exit 0 when both are fresh: then
# a lent machine can be used at once, without the ~35 minutes of rebuilding on 2 cores.
fresh() {
  local folder commit stale=0 paths
  for folder in .gpu-bin .gpu-py; do
    # what each compiles: the binaries include/, tests/, the bench and the examples; the package
    # include/ and python/ (scripts and docs change neither)
    paths=(include tests bench/cuda examples CMakeLists.txt ':!*.md' ':!*.sh' ':!*.py')
    [[ $folder == .gpu-py ]] && paths=(include python ':!*.md' ':!python/tests')
    commit=$(cat "$folder/COMMIT" 2> /dev/null || echo none)
    if [[ $commit == none || $commit == *+dirty ]] ||
      ! git diff --quiet "$commit" -- "${paths[@]}" 2> /dev/null; then
      echo "$folder: stale (built from $commit; rebuild: see the header)"
      stale=1
    else
      echo "$folder: fresh (built from $commit)"
    fi
  done
  return "$stale"
}

# One test case per process, under `timeout`, `jobs` at a time, so that a crash fails its own case
# only. doctest's --first/--last count the cases that pass the filters, in file-then-line order.
# Prints "case <i> exit <rc> after <s> s" for each, the output of every case whose exit status was
# not 0 (a doctest failure, a crash, a sanitizer's --error-exitcode, a timeout's 124), and a total. Arguments: jobs, per-case limit in seconds, the binary, the options every case gets.
# $RUNNER (words, e.g. "compute-sanitizer --tool memcheck") goes before the binary when set.
# $DEADLINE (seconds since the epoch), when set, ends the phase on time: a case that would start
# later is not run (and says so), and none runs past it.
run_one_case() {  # <index> <limit> <log dir> <binary> <options...>
  local i=$1 limit=$2 dir=$3 s=$SECONDS rc=0 now
  shift 3
  now=$(date +%s)
  if [[ -n ${DEADLINE:-} ]]; then
    if (( now + 2 >= DEADLINE )); then
      echo "case $i not run: the phase's deadline passed" | tee "$dir/$i.txt"
      echo skipped > "$dir/$i.rc"
      return
    fi
    (( DEADLINE - now < limit )) && limit=$((DEADLINE - now))
  fi
  # shellcheck disable=SC2086  # RUNNER is words on purpose
  timeout "$limit" ${RUNNER:-} "$@" --first="$i" --last="$i" > "$dir/$i.txt" 2>&1 || rc=$?
  echo "$rc" > "$dir/$i.rc"
  echo "case $i exit $rc after $((SECONDS - s)) s"
}
export -f run_one_case

each_case() {
  local jobs=$1 limit=$2
  shift 2
  local n dir i failed=0 unrun=0
  n=$("$@" --list-test-cases | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p' | tail -n 1)
  echo "${n:-no} cases: ${RUNNER:-} $*"
  dir=$(mktemp -d)
  # $CASES (indices, e.g. "5 18 26"), when set, runs those cases only.
  local list=${CASES:-$(seq 1 "${n:-0}")}
  # shellcheck disable=SC2086
  n=$(echo $list | wc -w)
  echo $list | tr ' ' '\n' | xargs -P "$jobs" -I{} bash -c 'run_one_case "$@"' _ {} "$limit" "$dir" "$@" | sort -k2n
  for i in $list; do
    case $(cat "$dir/$i.rc" 2> /dev/null) in
      0) ;;
      skipped) unrun=$((unrun + 1)) ;;
      *)
        failed=$((failed + 1))
        echo "---- case $i"
        cat "$dir/$i.txt"
        ;;
    esac
  done
  echo "total: ${n:-0} cases in their own processes: $((${n:-0} - failed - unrun)) exit 0, $failed failed, $unrun not run (deadline)"
  rm -rf "$dir"
}

# The binaries `carry` left in .gpu-bin/, uncompressed into folder $1.
unpack_carried() {
  local bin=$1 f
  mkdir -p "$bin"
  for f in .gpu-bin/*.xz; do xz -T0 -dc "$f" > "$bin/$(basename "$f" .xz)"; done
  chmod +x "$bin"/*
}

prebuilt() {
  local bin=/tmp/gpu-bin
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" || true
  unpack_carried "$bin"
  if ldd "$bin"/* | grep 'not found' | tee -a "$out/gpu.txt"; then
    log "prebuilt: libraries missing here, building instead"
    bash "$self" build > "$out/build.txt" 2>&1
    cp "$build/tests/cuda/xsoftmax_cuda_tests" "$build/bench/cuda/heads_cuda_bench" "$build/examples/cuda_training_step" "$bin/"
  fi
  check_binaries "$bin/xsoftmax_cuda_tests" "$bin/cuda_training_step" "$bin/heads_cuda_bench"
}

# The checks of `first` and `prebuilt` on built binaries (test binary, example, bench), each phase
# under its own limit ($TESTS_LIMIT, $MEMCHECK_LIMIT seconds; $BENCH_HEAD_LIMIT a bench head): every test case in its
# own process (a crash fails that case only), the example, memcheck the same way, the quick bench.
check_binaries() {
  local tests=$1 example=$2 bench=$3 t0=$SECONDS
  log "tests $(date -u +%FT%TZ)"
  DEADLINE=$(( $(date +%s) + ${TESTS_LIMIT:-150} )) each_case "${TEST_JOBS:-4}" 120 "$tests" --duration=true \
    > "$out/tests.txt" 2>&1
  tail -n 1 "$out/tests.txt" | tee -a "$out/phases.txt"
  grep -E 'exit [1-9]' "$out/tests.txt" | head -n 20 || true
  log "example $(( SECONDS - t0 )) s"
  timeout 20 "$example" > "$out/example.txt" 2>&1 || log "example exit $?"
  if (( ${MEMCHECK_LIMIT:-170} > 0 )); then
    DEADLINE=$(( $(date +%s) + ${MEMCHECK_LIMIT:-170} )) sanitize_with memcheck "$tests" --test-case-exclude='*2^31*'
  fi
  log "bench_quick $(( SECONDS - t0 )) s"
  quick_bench "$bench"
  log "done $(( SECONDS - t0 )) s"
}

# The quick bench, one head at a time, each under $BENCH_HEAD_LIMIT seconds (default 25), so that a
# slow head costs its own limit and the others still run; extra options in $BENCH_ARGS.
quick_bench() {
  local bench=$1 head
  # (--filter matches substrings: hs_uniform3_1m runs hs_uniform3_1m_per_run too)
  for head in ${BENCH_HEADS:-full_bf16_256k full_bf16_1m hs_uniform2_1m hs_uniform3_1m hs_huffman_sigmoid_1m knn_1m sampled_1m}; do
    # shellcheck disable=SC2086  # $BENCH_ARGS: more options
    local rc=0
    timeout "${BENCH_HEAD_LIMIT:-25}" "$bench" --quick --filter "$head" ${BENCH_ARGS:-} > "$out/bench_head.txt" 2>&1 ||
      rc=$?
    cat "$out/bench_head.txt" >> "$out/bench_quick.txt"
    if (( rc != 0 )); then
      log "bench_quick $head exit $rc; its last lines:"
      tail -n 3 "$out/bench_head.txt" | tee -a "$out/phases.txt"
    fi
  done
  rm -f "$out/bench_head.txt"
  grep -v '^  ' "$out/bench_quick.txt" | tee -a "$out/phases.txt" || true
}

# $out's logs in one archive, logs.tar.gz, beside phases.txt (the device tool brings 8 files back).
pack() {
  local archive
  archive=$(mktemp /tmp/logs.XXXXXX)
  (cd "$out" && tar czf "$archive" --exclude=logs.tar.gz --exclude=phases.txt . && find . -type f \
    ! -name phases.txt -delete)
  mv "$archive" "$out/logs.tar.gz"
}

# After `prebuilt` found failures: every case again (a crash prints its report, tests/cuda/main.cu:
# resolve the offsets here with `addr2line -Cfe <unstripped binary>`), then $CASES (failing ones) with the
# test buffers in pinned host memory instead of managed memory (XSOFTMAX_TEST_MEMORY=pinned), then
# the quick bench. Phase limits: $TESTS_LIMIT, $PINNED_LIMIT seconds; $BENCH_HEAD_LIMIT a bench head.
rerun() {
  local t0=$SECONDS bin=/tmp/gpu-bin
  unpack_carried "$bin"
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    grep -m1 'model name' /proc/cpuinfo
  } > "$out/gpu.txt" 2>&1
  log "rerun tests $(( SECONDS - t0 )) s"
  local cases=${CASES:-}
  CASES='' DEADLINE=$(( $(date +%s) + ${TESTS_LIMIT:-100} )) each_case 8 90 "$bin/xsoftmax_cuda_tests" \
    --duration=true > "$out/tests.txt" 2>&1
  tail -n 1 "$out/tests.txt" | tee -a "$out/phases.txt"
  log "rerun pinned $(( SECONDS - t0 )) s"
  XSOFTMAX_TEST_MEMORY=pinned CASES=$cases DEADLINE=$(( $(date +%s) + ${PINNED_LIMIT:-50} )) \
    each_case 8 45 "$bin/xsoftmax_cuda_tests" > "$out/pinned.txt" 2>&1
  tail -n 1 "$out/pinned.txt" | tee -a "$out/phases.txt"
  log "rerun bench_quick $(( SECONDS - t0 )) s"
  # shellcheck disable=SC2086  # $BENCH_ARGS: more options, e.g. "--filter hs_uniform2_1m"
  quick_bench "$bin/heads_cuda_bench"
  log "rerun done $(( SECONDS - t0 )) s"
}

# Where a step's time goes (the quick bench runs at 3-4 % of the GEMM's peak: RESULTS.md): one
# head of the quick bench under Nsight Systems when the machine has it (CUDA API calls, kernels and
# memory operations, summed), else Nsight Compute's per-kernel summary of its first 300 launches.
# $PROFILE_FILTER picks the head (default full_bf16_1m); binaries from .gpu-bin/ (carry) or $build.
# $PROFILE_ARGS: the bench's options (default --quick; e.g. "--reps 1 --row-blocks 4096" for a full
# size); $PROFILE_NAME names the output, profile_<name>.txt (default: profile.txt).
profile() {
  local bench filter=${PROFILE_FILTER:-full_bf16_1m} only=${PROFILE_ONLY:-forward_backward}
  local file=$out/profile${PROFILE_NAME:+_$PROFILE_NAME}.txt
  bench=$(bench_binary)
  log "profile $filter $only ${PROFILE_ARGS:---quick} $(date -u +%FT%TZ)"
  # shellcheck disable=SC2086  # PROFILE_ARGS is words on purpose
  if command -v nsys > /dev/null; then
    nsys profile --force-overwrite true -o /tmp/xsoftmax_profile --stats=false "$bench" ${PROFILE_ARGS:---quick} \
      --filter "$filter" --only "$only" > "${file%.txt}_run.txt" 2>&1 || true
    nsys stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv \
      /tmp/xsoftmax_profile.nsys-rep > "$file" 2>&1 || true
  else
    # One metric (each kernel's duration) needs one pass per launch, not the default sections' many;
    # the clocks as the card has them (METHOD.md: leave them alone).
    ncu --clock-control none --metrics gpu__time_duration.sum --launch-count "${PROFILE_LAUNCHES:-300}" \
      --print-summary per-kernel "$bench" ${PROFILE_ARGS:---quick} --filter "$filter" --only "$only" > "$file" 2>&1 || true
  fi
  tail -n 5 "$file"
}

# The per-kernel breakdown (ncu's gpu__time_duration per launch, summed by kernel) of each headline
# configuration, one bench process each under its own limit: the full softmax's training step at
# the peer's shape as the defaults run it and in row blocks of 4096 (one warm-up and one timed call:
# about 2 x 2000 launches), the small call of target 5, the 2-level HS at 1M classes, and the full
# softmax's top-10 at the peer's shape (target 4).
# $PROFILE_SPECS: other profiles, "name|filter|bench options|launches|limit[|measurement]" separated
# by ';' (the measurement: forward_backward unless named, e.g. topk or forward).
profiles() {
  local spec name filter args launches limit only specs
  # The headline configurations (about 230 s): the full softmax at the peers' shape (its step, and
  # its step with gradient filtering at 2^-12: stop 52's cost model), the small call, the HS at 2
  # and 3 levels. (The top-10's: PROFILE_SPECS="full256k_topk|full_bf16_256k|--reps 1|3000|60|topk".)
  local default="full256k|full_bf16_256k|--reps 1|4500|70"
  default+=";full256k_filter|full_bf16_256k|--reps 1|3000|60|forward_backward_filtered"
  default+=";small|full_bf16_256k|--quick --reps 1|400|20;hs2_1m|hs_uniform2_1m|--reps 1|600|40"
  default+=";hs3_1m|hs_uniform3_1m|--reps 1|600|40"
  IFS=';' read -r -a specs <<< "${PROFILE_SPECS:-$default}"
  for spec in "${specs[@]}"; do
    IFS='|' read -r name filter args launches limit only <<< "$spec"
    PROFILE_NAME=$name PROFILE_FILTER=$filter PROFILE_ARGS=$args PROFILE_LAUNCHES=$launches \
      PROFILE_ONLY=${only:-forward_backward} \
      timeout "$limit" bash "$self" profile || log "profiles: $name exit $?"
  done
}

# The phases below run on $build, one call each; every test case in its own process (each_case).
test_phase() {
  log "test $(date -u +%FT%TZ)"
  each_case 4 120 "$build/tests/cuda/xsoftmax_cuda_tests" --duration=true > "$out/tests.txt" 2>&1
  tail -n 1 "$out/tests.txt"
  "$build/examples/cuda_training_step" 2>&1 | tee "$out/example.txt"
}

# compute-sanitizer's <tool> on the cases of <test binary> that pass the filters, $SANITIZE_JOBS
# processes at a time (default 8; the tools' cost is mostly on the host: a 16-core machine takes
# 16), into $out/<tool>.txt (within $DEADLINE when set). Arguments: tool, test binary, filters.
sanitize_with() {
  local tool=$1 tests=$2
  shift 2
  log "sanitize $tool $(date -u +%FT%TZ)"
  RUNNER="compute-sanitizer --tool $tool --error-exitcode 3" each_case "${SANITIZE_JOBS:-8}" 300 "$tests" "$@" \
    > "$out/$tool.txt" 2>&1 ||
    true
  tail -n 1 "$out/$tool.txt" | tee -a "$out/phases.txt"
}

# A GPU binary: the carried one (.gpu-bin/, unpacked once into /tmp/gpu-bin) when there is one,
# else $build's. Arguments: its path in the build folder (tests/cuda/xsoftmax_cuda_tests, ...).
carried_or_built() {
  local name
  name=$(basename "$1")
  if [[ -e .gpu-bin/$name.xz ]]; then
    [[ -x /tmp/gpu-bin/$name ]] || unpack_carried /tmp/gpu-bin > /dev/null
    echo "/tmp/gpu-bin/$name"
  else
    echo "$build/$1"
  fi
}
test_binary() { carried_or_built tests/cuda/xsoftmax_cuda_tests; }
bench_binary() { carried_or_built bench/cuda/heads_cuda_bench; }

# The tree-shape sweep (heads_cuda_bench --sweep: complete trees of branching 2 ... N at N = 1M
# and 10M, B = 8192, d = 512, bf16, and the full softmax) as JSON, drawn by bench/plot_heads.py:
# $out/heads_tree_shapes_gpu.{json,png}, to check into bench/. $SWEEP_N overrides the sizes.
sweep() {
  local bench
  bench=$(bench_binary)
  log "sweep $(date -u +%FT%TZ)"
  "$bench" --sweep "$out/heads_tree_shapes_gpu.json" --sweep-n "${SWEEP_N:-1000000,10000000}" 2>&1 |
    tee "$out/sweep.txt" | grep -v '^  '
  python3 bench/plot_heads.py "$out/heads_tree_shapes_gpu.json" "$out/heads_tree_shapes_gpu.png" \
    --title "xsoftmax heads on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1): forward+backward time per sample, B = 8192, d = 512, bf16" ||
    true
}

# One HS training step at scale (heads_cuda_bench --filter hs_scale): $SCALE_N classes (default 100M:
# 102 GB of bf16 weights, an H200's size; on an H100 about 60M fit), d = 512, B = 8192.
scale() {
  local bench
  bench=$(bench_binary)
  log "scale ${SCALE_N:-100000000} $(date -u +%FT%TZ)"
  "$bench" --filter hs_scale --scale-n "${SCALE_N:-100000000}" --reps 3 2>&1 | tee "$out/scale.txt" | tee -a "$out/phases.txt"
}

# The full softmax's backward without the recompute pass: forward_backward at 8192 x 2304 x 256K
# in row blocks of $ROW_BLOCKS rows (0: the head's automatic plan, full_softmax::training_plan),
# each keeping all its scores (R x 256K x 4 bytes), at chunk sizes $CHUNKS (0: automatic), then torch_peer.py's full
# softmax rows (PyTorch, Cut Cross-Entropy, Liger) side by side on the same machine.
rowblocks() {
  local bench
  bench=$(bench_binary)
  log "rowblocks $(date -u +%FT%TZ)"
  # ROWBLOCKS_ALL=1: every measurement (forward and top-10 too), not only forward_backward
  local only=(--only forward_backward)
  [[ -n ${ROWBLOCKS_ALL:-} ]] && only=()
  "$bench" --filter full_bf16_256k "${only[@]}" --reps "${ROWBLOCK_REPS:-5}" \
    --row-blocks "${ROW_BLOCKS:-0,1024,2048,4096}" --chunks "${CHUNKS:-0,4096}" 2>&1 |
    tee "$out/rowblocks.txt" | grep -v '^  ' | tee -a "$out/phases.txt" ||
    log "rowblocks: heads_cuda_bench failed (rowblocks.txt); the peers still run"
  peer
}

# The wide HS gather levels a node at a time (gather_run_wide_kernel, the default) against a block
# per sample (XSOFTMAX_CUDA_HS_GATHER=per_sample), alternated in $HSAB_ROUNDS rounds (default 2) on
# $HSAB_HEADS (default: the 2- and 3-level uniform trees at 1M classes, full size).
hsab() {
  local bench heads round mode
  bench=$(bench_binary)
  heads=${HSAB_HEADS:-hs_uniform2_1m hs_uniform3_1m}
  log "hsab $(date -u +%FT%TZ)"
  for round in $(seq "${HSAB_ROUNDS:-2}"); do
    for mode in per_sample by_node; do
      for head in $heads; do
        echo "round $round, $mode:"
        XSOFTMAX_CUDA_HS_GATHER=$mode "$bench" --filter "$head" --only forward_backward --reps "${HSAB_REPS:-5}" 2>&1
      done
    done
  done | tee "$out/hsab.txt" | grep -E '^round|^hs_' | tee -a "$out/phases.txt"
}

# The HS top-10 on trained weights (issue 26, target 4): each head's measurements, then
# $HSTOPK_STEPS SGD steps (default 300, rate $HSTOPK_LR, default 1) on its inputs, then the forward
# and the top-10 again; the search's expansions a row before and after.
hstopk() {
  local bench head
  bench=$(bench_binary)
  log "hstopk $(date -u +%FT%TZ)"
  for head in ${HSTOPK_HEADS:-hs_uniform2_1m hs_uniform3_1m hs_huffman_sigmoid_1m}; do
    "$bench" --filter "$head" --reps "${HSTOPK_REPS:-3}" --train-steps "${HSTOPK_STEPS:-300}" \
      --train-lr "${HSTOPK_LR:-1}" 2>&1
  done | tee "$out/hstopk.txt" | grep -E '^hs_' | tee -a "$out/phases.txt"
}

# The PyTorch package for the GPU machine, built here: in a copy of python/ and include/, against the
# torch of $PY_FOR_GPU (default /tmp/py312/bin/python: `python3.12 -m venv /tmp/py312 &&
# /tmp/py312/bin/pip install torch==2.11.0 numpy pytest`, the GPU image's Python and torch), for sm_90,
# with the built-in GEMM (XSOFTMAX_CBLAS=none: the GPU image may have no OpenBLAS), stripped, into
# .gpu-py/xsoftmax (name .gpu-py in `carry`). About 5 minutes on 2 cores.
carry_python() {
  local py=${PY_FOR_GPU:-/tmp/py312/bin/python} tmp
  tmp=$(mktemp -d)
  cp -r include python "$tmp/"
  rm -rf "$tmp/python/build" "$tmp/python/xsoftmax/_C"*.so
  (cd "$tmp/python" && MAX_JOBS=${MAX_JOBS:-2} TORCH_CUDA_ARCH_LIST=9.0 XSOFTMAX_CBLAS=none XSOFTMAX_WITH_CUDA=1     "$py" setup.py build_ext --inplace > "$tmp/build.log" 2>&1) || { tail -n 30 "$tmp/build.log"; return 1; }
  rm -rf .gpu-py && mkdir -p .gpu-py
  cp -r "$tmp/python/xsoftmax" .gpu-py/
  strip --strip-debug .gpu-py/xsoftmax/_C*.so
  stamp .gpu-py
  rm -rf "$tmp"
  du -sh .gpu-py/xsoftmax/_C*.so
}

# The PyTorch package on CUDA, on the GPU machine: the package carried in .gpu-py/ (carry_python), or
# built there when PY_BUILD=1 or the carried one does not import (about 3 minutes on 16 cores); then
# the CUDA test cases (pytest -m cuda; $PY_TEST_LIMIT s, default 240), torch_peer.py with xsoftmax's
# operators beside PyTorch, Cut Cross-Entropy and Liger ($PY_PEER_LIMIT, 150), train_hs.py --device
# cuda at 1M classes ($PY_TRAIN_LIMIT, 90) and evaluate_vs_torch.py at 8192 x 2304 x 256K bf16
# ($PY_EVAL_LIMIT, 60).
python_phase() {
  log "python $(date -u +%FT%TZ)"
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [[ -z ${PY_BUILD:-} && -d .gpu-py/xsoftmax ]] &&
    PYTHONPATH=$PWD/.gpu-py${PYTHONPATH:+:$PYTHONPATH} python3 -c "import xsoftmax" > "$out/py_import.txt" 2>&1; then
    export PYTHONPATH=$PWD/.gpu-py${PYTHONPATH:+:$PYTHONPATH}
  else
    log "python: building the package here ($(tail -n 1 "$out/py_import.txt" 2>/dev/null))"
    MAX_JOBS=${MAX_JOBS:-8} TORCH_CUDA_ARCH_LIST=9.0 XSOFTMAX_WITH_CUDA=1 python3 -m pip install -q \
      --no-build-isolation --no-deps --no-cache-dir --target /tmp/xs-site ./python > "$out/py_build.txt" 2>&1 ||
      { tail -n 20 "$out/py_build.txt" | tee -a "$out/phases.txt"; return 1; }
    export PYTHONPATH=/tmp/xs-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "import xsoftmax; print('xsoftmax', xsoftmax.build_info())" 2>&1 | tee -a "$out/phases.txt"
  (cd python/tests && PYTHONUNBUFFERED=1 timeout "${PY_TEST_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider \
    -m cuda -rf . ) > "$out/pytest_cuda.txt" 2>&1 || true
  tail -n 4 "$out/pytest_cuda.txt" | tee -a "$out/phases.txt"
  PYTHONUNBUFFERED=1 timeout "${PY_PEER_LIMIT:-150}" python3 bench/cuda/torch_peer.py --reps "${PY_PEER_REPS:-5}" \
    > "$out/py_peer.txt" 2>&1 || true
  grep -E "full_bf16|hs[23]_bf16|adaptive" "$out/py_peer.txt" | tee -a "$out/phases.txt" || true
  PYTHONUNBUFFERED=1 timeout "${PY_TRAIN_LIMIT:-90}" python3 examples/python/train_hs.py --device cuda \
    --classes 1000000 --dim 256 --batch 8192 --steps 100 --quiet > "$out/train_hs_cuda.txt" 2>&1 || true
  tail -n 3 "$out/train_hs_cuda.txt" | tee -a "$out/phases.txt"
  # An evaluation step (loss and top-10) at the peers' shape: evaluate, forward + predict, PyTorch.
  PYTHONUNBUFFERED=1 timeout "${PY_EVAL_LIMIT:-60}" python3 bench/python/evaluate_vs_torch.py --device cuda \
    --classes 262144 --batch 8192 --dim 2304 --dtype bfloat16 --rounds 5 > "$out/py_evaluate.txt" 2>&1 || true
  tail -n 7 "$out/py_evaluate.txt" | tee -a "$out/phases.txt"
}

# OpenMPI's runtime for the GPU machine, which has none and reaches no registry: Debian 12's
# packages (`apt-get download`; their libraries are what the test binary links here), unpacked
# into .mpi/root, relocated at run time by OPAL_PREFIX and friends (checked here with the system's
# OpenMPI hidden in a mount namespace); and the CUDA MPI test binary of $build (configured as
# build() does, sm_90), stripped and compressed. About 4 MB of packages, 15 MB unpacked.
carry_mpi() {
  local f deb
  rm -rf .mpi && mkdir -p .mpi/debs .mpi/root
  (cd .mpi/debs && apt-get download openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 \
    libevent-pthreads-2.1-7 libevent-2.1-7 libnuma1)
  for deb in .mpi/debs/*.deb; do dpkg -x "$deb" .mpi/root; done
  rm -rf .mpi/debs .mpi/root/usr/share/man .mpi/root/usr/share/doc
  f=$build/tests/cuda/xsoftmax_cuda_mpi_tests
  if [[ -x $f ]]; then
    strip -o .mpi/xsoftmax_cuda_mpi_tests "$f" && xz -T0 -3 .mpi/xsoftmax_cuda_mpi_tests
  else
    echo "carry_mpi: no $f (cmake --build $build --target xsoftmax_cuda_mpi_tests): the runtime only" >&2
  fi
  stamp .mpi
  du -sh .mpi .mpi/* | tail -n 3
}

# The environment that runs the carried OpenMPI from .mpi/root (prints `export` lines for eval).
mpi_env() {
  local r=$PWD/.mpi/root
  echo "export PATH=$r/usr/bin:\$PATH LD_LIBRARY_PATH=$r/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
  echo "export OPAL_PREFIX=$r/usr OPAL_SYSCONFDIR=$r/etc/openmpi PMIX_INSTALL_PREFIX=$r/usr"
  echo "export PMIX_MCA_mca_base_component_path=$r/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
}

# Issue 26, target 8: the class-sharded full softmax and the sharded HS with $MPI_RANKS (default
# "1 2 4") ranks sharing the one GPU (cuda backend, mpi_communicator staging through the host),
# each rank's heads against the unsharded cuda head (tests/sharding/*_mpi.cpp built by nvcc):
# the OpenMPI carry_mpi left in .mpi/ (the binary's own), else the machine's mpiexec.
mpi() {
  local bin=$build/tests/cuda/xsoftmax_cuda_mpi_tests mpiexec=mpiexec n rc
  if [[ -e .mpi/xsoftmax_cuda_mpi_tests.xz ]]; then
    bin=/tmp/gpu-bin/xsoftmax_cuda_mpi_tests
    mkdir -p /tmp/gpu-bin && xz -T0 -dc .mpi/xsoftmax_cuda_mpi_tests.xz > "$bin" && chmod +x "$bin"
  fi
  if [[ -d .mpi/root ]]; then  # the carried OpenMPI, which the binary was linked against here
    eval "$(mpi_env)"
    mpiexec=mpiexec.openmpi
  fi
  log "mpi $(date -u +%FT%TZ): $(command -v "$mpiexec" || echo "no $mpiexec"), $bin"
  ldd "$bin" | grep 'not found' | tee -a "$out/phases.txt" || true
  for n in ${MPI_RANKS:-1 2 4}; do
    rc=0
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=2 \
      timeout "${MPI_LIMIT:-150}" "$mpiexec" -n "$n" "$bin" --duration=true > "$out/mpi_$n.txt" 2>&1 || rc=$?
    log "mpi: $n rank(s): exit $rc; $(grep -a -E 'test cases:' "$out/mpi_$n.txt" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g')"
  done
}

# A whole session in one device call (timeout_s 600): the checks of `prebuilt` within shorter
# limits, then `rowblocks` (with the peers), `sweep` at 1M classes, `scale` and `pack`, each under
# `timeout` so that a slow phase costs its own limit. About 540 s.
# $SESSION_PHASES (phase:limit words; default "rowblocks:170 sweep:80 scale:60") picks the phases
# after prebuilt; NO_PREBUILT=1 leaves prebuilt out (a second call on the same binaries).
pyfirst() {
  # The PyTorch package built there (8 jobs) while heads_cuda_bench builds beside it (4 jobs), then
  # the python phase: the CUDA pytest suite, the peers, train_hs.py, evaluate_vs_torch.py.
  local t0=$SECONDS rc=0
  log "pyfirst $(date -u +%FT%TZ)"
  BUILD_TARGETS=heads_cuda_bench BUILD_JOBS=4 timeout 330 bash "$self" build > "$out/build.txt" 2>&1 &
  local bench_pid=$!
  MAX_JOBS=${MAX_JOBS:-10} PY_BUILD=1 PY_TEST_LIMIT=${PY_TEST_LIMIT:-150} PY_PEER_LIMIT=${PY_PEER_LIMIT:-100} \
    PY_TRAIN_LIMIT=${PY_TRAIN_LIMIT:-60} PY_EVAL_LIMIT=${PY_EVAL_LIMIT:-50} timeout 560 bash "$self" python || rc=$?
  wait "$bench_pid" || log "pyfirst: heads_cuda_bench build exit $?"
  log "pyfirst: python exit $rc after $((SECONDS - t0)) s"
  pack
}
second() {
  NO_PREBUILT=1 SESSION_PHASES=${SESSION_PHASES:-profiles:240} session
}
session() {
  local t0=$SECONDS rc
  if [[ -z ${NO_PREBUILT:-} ]]; then
    TESTS_LIMIT=${TESTS_LIMIT:-70} MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-90} BENCH_HEAD_LIMIT=${BENCH_HEAD_LIMIT:-15} \
      TEST_JOBS=${TEST_JOBS:-8} prebuilt || log "prebuilt: exit $?"
  fi
  local phase limit
  for phase in ${SESSION_PHASES:-rowblocks:170 sweep:80 scale:60}; do
    limit=${phase#*:} phase=${phase%:*}
    log "session: $phase at $((SECONDS - t0)) s (limit $limit s)"
    rc=0
    SWEEP_N=${SWEEP_N:-1000000} SCALE_N=${SCALE_N:-60000000} timeout "$limit" bash "$self" "$phase" \
      > "$out/session_$phase.txt" 2>&1 || rc=$?
    (( rc == 0 )) || log "session: $phase exit $rc"
  done
  log "session: done at $((SECONDS - t0)) s"
  pack
}

# The CUDA-specific cases with every workspace piece filled with 0xFF bytes when handed out
# (XSOFTMAX_POISON_WORKSPACE, detail/cuda/workspace.cuh): a kernel that reads scratch nobody wrote
# then computes with NaNs and the case fails. Within $POISON_LIMIT seconds (default 60).
poison() {
  local tests
  tests=$(test_binary)
  log "poison $(date -u +%FT%TZ)"
  XSOFTMAX_POISON_WORKSPACE=1 DEADLINE=$(( $(date +%s) + ${POISON_LIMIT:-60} )) each_case 8 60 "$tests" \
    --test-case='cuda*' > "$out/poison.txt" 2>&1 || true
  tail -n 1 "$out/poison.txt" | tee -a "$out/phases.txt"
}

sanitize() {
  # memcheck on every case but the > 2^31-element one (minutes under the tool); racecheck (much
  # slower: it instruments shared memory) on the CUDA-specific cases, without the two-thread
  # stream test. Each tool within its own limit ($MEMCHECK_LIMIT, $RACECHECK_LIMIT seconds;
  # default: none), ended case by case (each_case's deadline), so that its summary still prints;
  # $MEMCHECK_CASES / $RACECHECK_CASES (indices among the tool's cases) run those only, e.g. the
  # ones an earlier call did not reach. SANITIZE_TOOLS="racecheck" runs one tool.
  local tests now tool
  tests=$(test_binary)
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    now=$(date +%s)
    if [[ $tool == memcheck ]]; then
      CASES=${MEMCHECK_CASES:-} DEADLINE=${MEMCHECK_LIMIT:+$((now + MEMCHECK_LIMIT))} \
        sanitize_with memcheck "$tests" --test-case-exclude='*2^31*'
    else
      CASES=${RACECHECK_CASES:-} DEADLINE=${RACECHECK_LIMIT:+$((now + RACECHECK_LIMIT))} \
        sanitize_with racecheck "$tests" --test-case='cuda*' --test-case-exclude='*2^31*,*two streams*'
    fi
  done
}

sanitize2() {
  # synccheck (barriers and warp-synchronous code: the LSE, gather and search kernels) and initcheck
  # (reads of uninitialised device memory: workspace pieces, gradient buffers) on the CUDA-specific
  # cases, which cover every kernel; without the 2^31-element and two-stream cases (slow, and
  # their kernels run in the other cases).
  local tool tests
  tests=$(test_binary)
  for tool in ${SANITIZE2_TOOLS:-synccheck initcheck}; do
    sanitize_with "$tool" "$tests" --test-case='cuda*' \
      --test-case-exclude='*2^31*,*two streams*'
  done
}

bench() {
  log "bench $(date -u +%FT%TZ)"
  "$build/bench/cuda/heads_cuda_bench" --quick 2>&1 | tee "$out/bench_quick.txt"
  "$build/bench/cuda/heads_cuda_bench" 2>&1 | tee "$out/bench.txt"
}

# PyTorch's peers and the two ceilings (copy bandwidth, cuBLAS bf16 GEMM rate), full sizes or,
# with PEER_ARGS=--quick, the quick bench's.
peer() {
  log "peer $(date -u +%FT%TZ)"
  # Cut Cross-Entropy and Liger (pure-Python wheels carried in .whl/: the machine reaches no
  # registry; torch and Triton are there). Here: `python3 -m pip download --no-deps
  # --only-binary=:all: --python-version 3.12 -d .whl cut-cross-entropy liger-kernel`.
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # shellcheck disable=SC2086  # PEER_ARGS is words on purpose
  PYTHONUNBUFFERED=1 python3 bench/cuda/torch_peer.py ${PEER_ARGS:-} 2>&1 | tee "$out/torch_peer.txt"
}

# The binaries find libnccl.so.2 in PyTorch's NCCL wheel, where the device machine has it (its
# toolkit has none on the library path; a build there links the wheel's: see build).
if [[ ${1:-all} != carry && ${1:-all} != carry_python && ${1:-all} != carry_mpi && ${1:-all} != pack && ${1:-all} != fresh ]]; then
  wheel=$(nccl_wheel)
  if [[ -n $wheel ]]; then
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

case "${1:-all}" in
  build) build ;;
  test) test_phase ;;
  sanitize) sanitize ;;
  sanitize2) sanitize2 ;;
  bench) bench ;;
  peer) peer ;;
  all) build && test_phase && sanitize && sanitize2 && bench && peer ;;
  first) first ;;
  second) second ;;
  pyfirst) pyfirst ;;
  carry) carry_phase ;;
  fresh) fresh ;;
  prebuilt) prebuilt ;;
  rerun) rerun ;;
  profile) profile ;;
  pack) pack ;;
  poison) poison ;;
  sweep) sweep ;;
  scale) scale ;;
  rowblocks) rowblocks ;;
  hsab) hsab ;;
  hstopk) hstopk ;;
  session) session ;;
  profiles) profiles ;;
  carry_python) carry_python ;;
  python) python_phase ;;
  carry_mpi) carry_mpi ;;
  mpi) mpi ;;
  *) echo "usage: $0 build|test|sanitize|sanitize2|bench|peer|all|first|carry|fresh|prebuilt|rerun|profile|pack|poison|sweep|scale|rowblocks|session|profiles|carry_python|python|carry_mpi|mpi" >&2; exit 2 ;;
esac
