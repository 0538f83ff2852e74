#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the convergence study (bench/convergence_bench.cpp): held-out top-1 after each pass over
the training set, one curve per method (and per learning rate when a file holds several runs of
one method, as the sweep files do), with SGD-momentum at batch 1024's final top-1 as a dashed
reference line: the question is which large-batch curve crosses it, and after how many passes.

    OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2 \\
        XSOFTMAX_CONV_OUT=convergence.json ./build/bench/convergence_bench
    python3 bench/plot_convergence.py bench/convergence.json [more.json ...] -o bench/convergence.png

Several JSON files may be given (a main run and sweep runs); every method run in them is drawn.
Also prints, per run, the first pass at which it reaches the reference. Needs matplotlib.
"""
import argparse
import json
import sys

STYLE = {  # colour and marker per method name; unknown names get matplotlib's defaults
    "sgd_1k": ("tab:blue", "o"),
    "lamb_8k": ("tab:red", "s"),
    "lars_8k": ("tab:green", "^"),
    "sgd_8k": ("tab:gray", "v"),
}


def load(paths):
    """(config of the first file, list of method runs from every file)."""
    config, runs = None, []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        config = config or doc["config"]
        runs.extend(doc["methods"])
    return config, runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="convergence_bench output files")
    ap.add_argument("-o", "--output", default="bench/convergence.png")
    ap.add_argument("--reference", default="sgd_1k", help="method whose final top-1 is the target")
    args = ap.parse_args()
    config, runs = load(args.json)
    if not runs:
        sys.exit("no method runs in " + ", ".join(args.json))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in runs]
    ref = [r for r in runs if r["name"] == args.reference]
    # The reference is the best final top-1 among the reference method's runs (its tuned lr).
    target = max(r["passes"][-1]["top1"] for r in ref) if ref else None

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs:
        colour, marker = STYLE.get(r["name"], (None, "x"))
        several = names.count(r["name"]) > 1
        x = [p["epoch"] for p in r["passes"]]
        y = [100 * p["top1"] for p in r["passes"]]
        label = f'{r["name"]}: {r["optimizer"]}, batch {r["batch"]}, lr {r["lr"]:g}'
        ax.plot(x, y, marker=marker, color=colour, label=label, alpha=0.45 if several and not r.get("main") else 1.0)
        if target is not None:
            hit = next((p["epoch"] for p in r["passes"] if p["top1"] >= target), None)
            print(f'{label}: final top-1 {100 * r["passes"][-1]["top1"]:.2f} %, '
                  f'reaches {100 * target:.2f} % at pass {hit if hit else "never"}')
    if target is not None:
        ax.axhline(100 * target, color="tab:blue", linestyle="--", linewidth=1,
                   label=f"{args.reference} final top-1 ({100 * target:.2f} %)")
    ax.set_xlabel("passes over the training set")
    ax.set_ylabel("held-out top-1 (%)")
    ax.set_title(f'{config["classes"]:,} classes, d = {config["dim"]}, {config["train"]:,} training samples, '
                 f'warm-up {config["warmup_passes"]:g} pass(es)', fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
