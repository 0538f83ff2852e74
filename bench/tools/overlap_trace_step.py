#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One step of a bench/sharded_overlap Chrome trace, as text: every event of one rank and mode
from the step's forward_backward start (minus --before ms) to its end, times in ms relative to
that start.

    python3 bench/tools/overlap_trace_step.py trace.json "prefetch+poll rank 0" 3
"""
import argparse
import json

p = argparse.ArgumentParser()
p.add_argument("trace")
p.add_argument("pid", help='e.g. "blocking rank 0", "prefetch rank 1", "prefetch+poll rank 0"')
p.add_argument("step", type=int, help="which forward_backward of the round (0-based)")
p.add_argument("--before", type=float, default=30.0, help="ms before the verb to include")
a = p.parse_args()
events = sorted((e for e in json.load(open(a.trace))["traceEvents"] if e["pid"] == a.pid), key=lambda e: e["ts"])
verb = [e for e in events if e["name"] == "forward_backward"][a.step]
start, end = verb["ts"], verb["ts"] + verb["dur"]
print(f"{a.pid}, step {a.step}: track, event, start_ms, duration_ms")
for e in events:
    if start - 1000 * a.before <= e["ts"] <= end:
        print(f"  {e['tid']:<13} {e['name']:<18} {(e['ts'] - start) / 1000:8.1f} {e['dur'] / 1000:8.1f}")
