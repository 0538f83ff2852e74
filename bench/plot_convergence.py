#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the convergence study (bench/convergence_bench.cpp): held-out top-1 after each pass over
the training set, with SGD-momentum at batch 1024's final top-1 as a dashed reference line: the
question is which large-batch curve crosses it, and after how many passes.

    OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2 \\
        XSOFTMAX_CONV_OUT=convergence.json ./build/bench/convergence_bench
    python3 bench/plot_convergence.py bench/convergence.json [more.json ...] -o bench/convergence.png

Several JSON files may be given (a main run and sweep runs, one file per run or files merged with
--merge); every method run in them is used. Panels: (1) the best run of each method on the main
data seed (best = highest top-1 at any pass), (2) every run on the main seed (the sweep), (3) every
run on any other data seed, if there is one. Prints, per run, its final and best top-1 and the
first pass at which it reaches the reference of its seed; --table prints the runs as a Markdown
table (top-1 % after each pass, final mean training loss). Needs matplotlib (not for --merge or
--table alone).
"""
import argparse
import json
import sys

COLOUR = {"sgd_1k": "tab:blue", "lamb_8k": "tab:red", "lars_8k": "tab:green", "sgd_8k": "tab:gray"}
MARKER = {"sgd_1k": "o", "lamb_8k": "s", "lars_8k": "^", "sgd_8k": "v"}


def load(paths):
    """(config of the first file, list of method runs from every file, each carrying its own
    "config", "seed" and "weight_decay": older files hold them only in the file's config)."""
    config, runs = None, []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        config = config or doc["config"]
        for r in doc["methods"]:
            r.setdefault("config", doc["config"])
            r.setdefault("seed", r["config"]["seed"])
            r.setdefault("weight_decay", r["config"].get("weight_decay", 0))
            runs.append(r)
    return config, runs


MAIN_PASSES = [8]  # the main file's schedule length; a run with another one says so in its label


def label(r):
    wd = f', wd {r["weight_decay"]:g}' if r["weight_decay"] else ""
    sched = f', {r["config"]["epochs"]}-pass schedule' if r["config"]["epochs"] != MAIN_PASSES[0] else ""
    return f'{r["name"]}: {r["optimizer"]}, B {r["batch"]}, lr {r["lr"]:g}{wd}{sched}'


def best_top1(r):
    return max(p["top1"] for p in r["passes"])


def references(runs, reference):
    """Per data seed: the best final top-1 among that seed's runs of the reference method."""
    out = {}
    for r in runs:
        if r["name"] == reference:
            out[r["seed"]] = max(out.get(r["seed"], 0.0), r["passes"][-1]["top1"])
    return out


def report(runs, refs):
    for r in runs:
        target = refs.get(r["seed"])
        hit = next((p["epoch"] for p in r["passes"] if target is not None and p["top1"] >= target), None)
        print(f'seed {r["seed"]} {label(r)}: final top-1 {100 * r["passes"][-1]["top1"]:.2f} %, best '
              f'{100 * best_top1(r):.2f} %, reaches the reference '
              f'{"-" if target is None else f"{100 * target:.2f} %"} at pass {hit if hit else "never"}')


def table(runs):
    passes = max(len(r["passes"]) for r in runs)
    print("| method | batch | lr | wd | seed | passes | " + " | ".join(f"p{e + 1}" for e in range(passes)) +
          " | final loss |")
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * passes + "---:|")
    for r in runs:
        cells = [f'{100 * p["top1"]:.2f}' for p in r["passes"]] + ["–"] * (passes - len(r["passes"]))
        print(f'| {r["name"]} | {r["batch"]} | {r["lr"]:g} | {r["weight_decay"]:g} | {r["seed"]} | ' +
              f'{r["config"]["epochs"]} | ' +
              " | ".join(cells) + f' | {r["passes"][-1]["train_loss"]:.3g} |')


def draw(ax, runs, refs, title, faint_all=False):
    best = {}
    for r in runs:
        if r["name"] not in best or best_top1(r) > best_top1(best[r["name"]]):
            best[r["name"]] = r
    for r in runs:
        emphasised = not faint_all or best[r["name"]] is r
        ax.plot([p["epoch"] for p in r["passes"]], [100 * p["top1"] for p in r["passes"]],
                marker=MARKER.get(r["name"], "x"), color=COLOUR.get(r["name"]), label=label(r),
                alpha=1.0 if emphasised else 0.35, linewidth=1.6 if emphasised else 1.0, markersize=4)
    for seed, target in sorted(refs.items()):
        if any(r["seed"] == seed for r in runs):
            ax.axhline(100 * target, color="tab:blue", linestyle="--", linewidth=1,
                       label=f"sgd_1k final top-1, seed {seed} ({100 * target:.2f} %)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("passes over the training set")
    ax.set_ylabel("held-out top-1 (%)")
    ax.set_ylim(0, None)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    # below the axes: the sweep panel has up to ~20 curves, a legend inside would hide them
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="convergence_bench output files")
    ap.add_argument("-o", "--output", default="bench/convergence.png")
    ap.add_argument("--reference", default="sgd_1k", help="method whose final top-1 is the target")
    ap.add_argument("--merge", metavar="OUT", help="write every run of the inputs to one JSON file and stop")
    ap.add_argument("--table", action="store_true", help="print a Markdown table of every run and stop")
    args = ap.parse_args()
    config, runs = load(args.json)
    MAIN_PASSES[0] = config["epochs"]
    if not runs:
        sys.exit("no method runs in " + ", ".join(args.json))
    if args.merge:
        with open(args.merge, "w") as f:
            json.dump({"config": config, "methods": runs}, f, indent=1)
            f.write("\n")
        print(f"wrote {len(runs)} runs to {args.merge}")
        return
    if args.table:
        table(runs)
        return
    refs = references(runs, args.reference)
    report(runs, refs)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main_seed = config["seed"]
    mine = [r for r in runs if r["seed"] == main_seed]
    others = [r for r in runs if r["seed"] != main_seed]
    best = {}
    for r in mine:
        if r["name"] not in best or best_top1(r) > best_top1(best[r["name"]]):
            best[r["name"]] = r
    panels = 3 if others else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 6.0), sharey=True)
    draw(axes[0], list(best.values()), refs, f"best run of each method, data seed {main_seed}")
    draw(axes[1], mine, refs, f"every run, data seed {main_seed}", faint_all=True)
    if others:
        seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in others}))
        draw(axes[2], others, refs, f"data seed {seeds}")
    fig.suptitle(f'{config["classes"]:,} classes, d = {config["dim"]}, {config["train"]:,} training samples, '
                 f'{config["epochs"]} passes, warm-up {config["warmup_passes"]:g} pass, cosine decay to 0',
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100, bbox_inches="tight")
    print("wrote", args.output)


if __name__ == "__main__":
    main()
