#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Top-1 of each cheap head minus the full softmax's, per data seed (2024, 7, 11), for linear logits
and for the normalised classifier (s cos theta, without and with CosFace), as in the tables of
bench/RESULTS.md ("Normalised classifier"); the numbers are copied from there (their runs are in
bench/knn_accuracy_normalised.log and, for linear logits, the tables of the first study), because
the runs take half an hour and the plot should not. The K = 1 control (-1.8 to -31 points) is left
out so that the 1-point band stays readable.

    python3 bench/plot_knn_normalised.py bench/knn_normalised_gaps.png
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# method -> setting -> [seed 2024, seed 7, seed 11] (None: not run)
GAPS = {
    "KNN K=50": {"linear": [-0.38, -3.58, -5.76], "s cos": [-0.36, -0.56, -0.48], "CosFace": [-0.18, -0.26, -0.36]},
    "KNN K=200": {"linear": [-0.28, -2.96, -1.96], "s cos": [-0.22, -0.16, -0.10], "CosFace": [-0.14, -0.12, -0.08]},
    "KNN K=50\nexact graph": {"linear": [-0.68, -5.70, None], "s cos": [-0.22, -0.14, -0.14], "CosFace": [None] * 3},
    "uniform\nm=8900": {"linear": [None] * 3, "s cos": [-0.40, -0.36, -0.36], "CosFace": [-0.38, -0.22, -0.34]},
    "sampled\nm=2048": {"linear": [0.62, 0.32, 0.86], "s cos": [-0.60, -0.78, -0.44], "CosFace": [-0.56, -0.52, -0.62]},
}
SETTINGS = [("linear", "tab:gray", "o"), ("s cos", "tab:blue", "s"), ("CosFace", "tab:orange", "^")]


def main(out):
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (method, by_setting) in enumerate(GAPS.items()):
        for j, (setting, colour, marker) in enumerate(SETTINGS):
            x = i + (j - 1) * 0.25
            ys = [y for y in by_setting[setting] if y is not None]
            ax.scatter([x] * len(ys), ys, color=colour, marker=marker, s=28,
                       label=setting if i == 0 else None, zorder=3)
    ax.axhspan(-1, 1, color="tab:green", alpha=0.08, label="within 1 point")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(GAPS)))
    ax.set_xticklabels(GAPS.keys())
    ax.set_ylabel("top-1 minus full softmax (points)")
    ax.set_title("N = 1e5, one pass, 3 data seeds: cheap heads against the full softmax")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "knn_normalised_gaps.png")
