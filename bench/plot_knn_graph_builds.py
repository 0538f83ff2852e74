#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Recall against build time of the KNN-graph builders, ours beside FAISS's IndexIVFFlat, on the
clustered class vectors at N = 1e5 and 1e6 and on the KNN study's trained weights (K = 50, d = 64,
2 threads), as in the tables of bench/RESULTS.md ("KNN graph builds: the k-means and probes in
cache-sized tiles"; 1e5: the quiet run); the numbers are copied from there (each point: the
median of the rounds measured), because the runs take a quarter of an hour and the plot should not.

    python3 bench/plot_knn_graph_builds.py bench/knn_graph_builds.png
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# panel -> method -> [(seconds, recall, "lists x nprobe")]
POINTS = {
    "clustered, N = 1e5 (quiet run)": {
        "xsoftmax ivf_class_probes": [(2.44, 0.9904, "1000x4"), (2.87, 0.9929, "1000x8"), (2.77, 0.9974, "1265x4"),
                                      (3.21, 0.9982, "1265x8")],
        "FAISS IVFFlat": [(2.75, 0.9950, "1000x4"), (3.19, 0.9963, "1000x8"), (3.18, 0.9969, "1265x4"),
                          (3.70, 0.9978, "1265x8")],
    },
    "clustered, N = 1e6 (2,000 sampled classes)": {
        "xsoftmax ivf_class_probes": [(31.4, 0.6388, "3000x4"), (38.3, 0.7135, "4000x4"), (43.8, 0.7626, "4000x8"),
                                      (86.6, 0.8555, "4000x32"), (142.5, 0.8983, "4000x64")],
        "FAISS IVFFlat": [(56.5, 0.6424, "3000x4"), (67.1, 0.7173, "4000x4"), (78.6, 0.7621, "4000x8"),
                          (186.3, 0.8538, "4000x32")],
    },
    "KNN study's weights, step 100, N = 1e5": {
        "xsoftmax ivf_class_probes": [(2.64, 0.2546, "949x8"), (3.32, 0.2593, "1265x8"), (5.74, 0.4998, "1000x32"),
                                      (9.19, 0.6336, "1000x64")],
        "FAISS IVFFlat": [(4.84, 0.2735, "1000x8"), (6.64, 0.2592, "1265x8"), (10.51, 0.5000, "1000x32"),
                          (15.53, 0.6338, "1000x64")],
    },
}
STYLE = {"xsoftmax ivf_class_probes": ("tab:blue", "o"), "FAISS IVFFlat": ("tab:orange", "s")}


def main(out):
    fig, axes = plt.subplots(1, len(POINTS), figsize=(15, 4.6))
    for ax, (panel, methods) in zip(axes, POINTS.items()):
        for method, points in methods.items():
            colour, marker = STYLE[method]
            points = sorted(points)
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            ax.plot(xs, ys, marker=marker, color=colour, label=method)
            for x, y, tag in points:
                ax.annotate(tag, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7, color=colour)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("build time, s (2 threads, AMD EPYC Zen 3)")
        ax.set_ylabel("recall@50 against the exact graph")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("KNN graph builds: recall against time (up and left is better; labels: lists x nprobe)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "knn_graph_builds.png")
