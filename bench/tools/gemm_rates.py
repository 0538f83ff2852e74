#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GEMM rates of a full-softmax training step's three shapes on the CPU, for the cost model of
bench/full_softmax_vs_torch_cpu.py: torch's matmul (MKL) against the system OpenBLAS that the
xsoftmax package links (cblas_sgemm through ctypes), alternating, best of --reps, same threads.

    H: B x d hidden rows, W: c x d weight chunk (c classes), G: B x c scores
    scores = H W^T (B x c x d), grad_h = G W (B x d x c), grad_w = G^T H (c x d x B)

    OMP_WAIT_POLICY=passive python3 bench/tools/gemm_rates.py --rows 1024 256 --chunk 8192 100000

Each GEMM is 2 B c d FLOPs. A step of F.cross_entropy(F.linear(...)) is the three with c = N;
xsoftmax's is the same three over chunks (and row blocks), plus a fourth for every recomputed chunk.
"""
import argparse
import ctypes
import os
import time

import numpy as np
import torch

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def openblas():
    lib = ctypes.CDLL("libopenblas.so.0")
    lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.cblas_sgemm.restype = None
    return lib


def sgemm(lib, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, beta=0.0):
    f = ctypes.c_float
    lib.cblas_sgemm(ROW_MAJOR, ta, tb, m, n, k, f(1.0), a.ctypes.data_as(ctypes.c_void_p), lda,
                    b.ctypes.data_as(ctypes.c_void_p), ldb, f(beta), c.ctypes.data_as(ctypes.c_void_p), ldc)


def best(fn, reps):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1024, 256], help="B: rows of a (block of a) batch")
    p.add_argument("--chunk", type=int, nargs="+", default=[8192, 100000], help="c: classes per GEMM")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    lib = openblas()
    lib.openblas_set_num_threads(a.threads)
    print(f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), OpenBLAS core "
          f"{lib.openblas_get_corename().decode()}, {a.threads} threads, d = {a.dim}; GFLOP/s, best of {a.reps}")
    print(f"{'B':>6} {'c':>7} | {'scores':>15} | {'grad_h':>15} | {'grad_w':>15}")
    print(f"{'':>6} {'':>7} | {'torch':>7} {'oblas':>7} | {'torch':>7} {'oblas':>7} | {'torch':>7} {'oblas':>7}")
    d = a.dim
    for b in a.rows:
        for c in a.chunk:
            rng = np.random.default_rng(0)
            h = rng.standard_normal((b, d), dtype=np.float32)
            w = rng.standard_normal((c, d), dtype=np.float32)
            g = rng.standard_normal((b, c), dtype=np.float32)
            gh = np.zeros((b, d), np.float32)
            gw = np.zeros((c, d), np.float32)
            th, tw, tg = torch.from_numpy(h), torch.from_numpy(w), torch.from_numpy(g)
            flop = 2.0 * b * c * d
            shapes = [
                (lambda: th @ tw.T, lambda: sgemm(lib, NO_TRANS, TRANS, b, c, d, h, d, w, d, g, c)),
                (lambda: tg @ tw, lambda: sgemm(lib, NO_TRANS, NO_TRANS, b, d, c, g, c, w, d, gh, d)),
                (lambda: tg.T @ th, lambda: sgemm(lib, TRANS, NO_TRANS, c, d, b, g, c, h, d, gw, d)),
            ]
            cells = []
            for tf, of in shapes:
                tf(), of()  # warm-up
                tt = ot = float("inf")
                for _ in range(a.reps):  # alternate: the same load for both
                    tt = min(tt, best(tf, 1))
                    ot = min(ot, best(of, 1))
                cells.append(f"{flop / tt / 1e9:7.1f} {flop / ot / 1e9:7.1f}")
            print(f"{b:>6} {c:>7} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
