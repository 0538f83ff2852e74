#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws heads_bench results (Google Benchmark JSON) as the tree-shape plot: time per sample of
each tree shape (and of the full softmax) for each class count N, one bar per shape, on a log
scale, with the full softmax's bar as the reference line.

    ./build/bench/heads_bench --benchmark_out=heads.json --benchmark_out_format=json
    python3 bench/plot_heads.py heads.json bench/heads_tree_shapes.png

Repetitions of one benchmark are reduced to their fastest run (the machine is shared; see
bench/README.md). Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^(?P<head>hs|full_softmax)/(?:(?P<shape>[^/]+)/)?(?P<elem>[^/]+)/N=(?P<n>\d+)")


def load(path):
    """{N: {label: microseconds per sample}} from a heads_bench JSON file."""
    with open(path) as f:
        doc = json.load(f)
    best = defaultdict(dict)
    for b in doc.get("benchmarks", []):
        if b.get("run_type") == "aggregate":
            continue
        m = NAME.match(b["run_name"] if "run_name" in b else b["name"])
        if not m or "items_per_second" not in b:
            continue
        n = int(m["n"])
        label = "full softmax" if m["head"] == "full_softmax" else m["shape"]
        if m["elem"] != "fp32":
            label += " (" + m["elem"] + ")"
        us = 1e6 / b["items_per_second"]
        best[n][label] = min(us, best[n].get(label, float("inf")))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="heads_bench --benchmark_out file (JSON)")
    ap.add_argument("png", help="output image")
    ap.add_argument("--title", default="xsoftmax heads: forward+backward time per sample (CPU)")
    args = ap.parse_args(argv)

    data = load(args.json)
    if not data:
        sys.exit(f"{args.json}: no heads_bench results with items_per_second")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(data)
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.8), squeeze=False)
    for ax, n in zip(axes[0], sizes):
        rows = sorted(data[n].items(), key=lambda kv: kv[1])
        labels = [k for k, _ in rows]
        values = [v for _, v in rows]
        colors = ["#c44e52" if k.startswith("full") else "#4c72b0" for k in labels]
        ax.barh(labels, values, color=colors)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("microseconds per sample (log scale; lower is better)")
        ax.set_title(f"N = {n:,} classes")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
        if "full softmax" in data[n]:
            ax.axvline(data[n]["full softmax"], color="#c44e52", linestyle=":", linewidth=1)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}: " + ", ".join(f"N={n}: {len(data[n])} shapes" for n in sizes))


if __name__ == "__main__":
    main()
