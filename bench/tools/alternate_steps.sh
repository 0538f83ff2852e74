#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Alternated timing of step drivers (bench/tools/hs_omp_step_driver.cpp built against different
# include/ trees) on a 2-vCPU VM whose 2-thread runs are bimodal (bench/RESULTS.md, "Stop 40: the
# 2-thread HS step"): first waits for a fast period (a probe run of $PROBE under $PROBE_MS ms a
# step, checked every 8 s, at most 8 minutes), then runs every binary once per round, alternated,
# and prints each binary's times sorted.
#
#   OMP_NUM_THREADS=2 bench/tools/alternate_steps.sh ROUNDS MODE STEPS BINARY...   # MODE: o (omp) or s
#   PROBE=/tmp/step_old PROBE_MS=0.6 ...                                            # the probe (default: the first binary)
set -euo pipefail
rounds=$1 mode=$2 steps=$3
shift 3
probe=${PROBE:-$1} limit=${PROBE_MS:-0.6}
ms() { OMP_WAIT_POLICY=active "$@" | sed -E 's/.*: ([0-9.]+) ms.*/\1/'; }
if [[ $mode == o && ${OMP_NUM_THREADS:-2} -gt 1 ]]; then
  for _ in $(seq 60); do
    t=$(ms "$probe" o 300)
    awk -v t="$t" -v l="$limit" 'BEGIN { exit !(t < l) }' && break
    sleep 8
  done
  echo "probe: $t ms a step at $(date +%T)"
fi
declare -A times
for _ in $(seq "$rounds"); do
  for b in "$@"; do times[$b]="${times[$b]:-} $(ms "$b" "$mode" "$steps")"; done
done
for b in "$@"; do echo "$b: $(tr ' ' '\n' <<< "${times[$b]}" | sort -n | tr '\n' ' ')"; done
