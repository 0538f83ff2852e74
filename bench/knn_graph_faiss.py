#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FAISS (faiss-cpu) beside bench/knn_graph_builds.cpp (issue 29): the same class vectors and the
same exact graph (written by `XSOFTMAX_KNN_DUMP=<prefix> knn_graph_builds ...`), then FAISS's
k-NN graph builds with its recommended settings, each timed whole (training, adding, searching
every vector as a query) and scored by the same recall (mean over classes of |approx row ∩ exact
row| / K; a class is its own neighbour under cosine):
  * IndexIVFFlat (inner product over unit vectors), nlist = 4 sqrt(N) and 1000, nprobe 4 / 8 / 16,
    trained on 64 x nlist rows (FAISS warns below 39);
  * IndexHNSWFlat, M = 32, efConstruction 40 (FAISS's default), efSearch 64 / 128 / 256.
  The HNSW graph is built once and searched at each efSearch; its lines give build + search (the
  graph's cost at that efSearch) and the search alone.
Usage: python3 bench/knn_graph_faiss.py <prefix> N d K [threads] [settings]
With the last argument: only those builds, e.g. "1000:4,1000:8" (IVF-Flat nlist:nprobe) and
"hnsw:64,hnsw:128" (HNSW efSearch), for runs alternated with ours. Recall over a sample: `<prefix>.sample.i64` (the rows) beside a sampled exact
graph (knn_graph_builds with XSOFTMAX_KNN_SAMPLE) scores only those rows.
"""
import sys
import time

import faiss
import numpy as np


def recall(found, exact):
    hits = 0
    for a, b in zip(found, exact):
        hits += len(set(a.tolist()) & set(b.tolist()))
    return hits / exact.size


def main():
    prefix, n, d, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    faiss.omp_set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    x = np.fromfile(prefix + ".vectors.f32", dtype=np.float32).reshape(n, d)
    exact = np.fromfile(prefix + ".exact.i64", dtype=np.int64).reshape(-1, k)
    rows = np.fromfile(prefix + ".sample.i64", dtype=np.int64) if exact.shape[0] < n else np.arange(n)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)  # cosine as inner product of unit rows
    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads, N = {n}, d = {d}, K = {k}")
    ivf = [(nlist, nprobe) for nlist in (int(round(4 * np.sqrt(n))), 1000) for nprobe in (4, 8, 16)]
    hnsw = [64, 128, 256]
    if len(sys.argv) > 6:
        items = [item.split(":") for item in sys.argv[6].split(",")]
        ivf = [(int(a), int(b)) for a, b in items if a != "hnsw"]
        hnsw = [int(b) for a, b in items if a == "hnsw"]
    for nlist, nprobe in ivf:
        t0 = time.perf_counter()
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        index.train(x[rng.choice(n, size=min(n, 64 * nlist), replace=False)])
        index.add(x)
        index.nprobe = nprobe
        _, found = index.search(x, k)
        s = time.perf_counter() - t0
        print(f"faiss IVFFlat  nlist {nlist:5d} nprobe {nprobe:3d}   {s:8.3f} s  "
              f"recall {recall(found[rows], exact):.4f}", flush=True)
    if not hnsw:
        return
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    index.add(x)
    built = time.perf_counter() - t0
    print(f"faiss HNSW32   build (efConstruction {index.hnsw.efConstruction})   {built:8.3f} s", flush=True)
    for ef in hnsw:
        t0 = time.perf_counter()
        index.hnsw.efSearch = ef
        _, found = index.search(x, k)
        s = time.perf_counter() - t0
        print(f"faiss HNSW32   efSearch {ef:4d}            {built + s:8.3f} s  recall {recall(found[rows], exact):.4f}"
              f"  (search {s:.3f} s)", flush=True)


if __name__ == "__main__":
    main()
