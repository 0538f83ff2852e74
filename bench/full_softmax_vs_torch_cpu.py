#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The exact softmax on the CPU: xsoftmax's FullSoftmaxLoss against PyTorch's
F.cross_entropy(F.linear(h, W)) ("torch") and, where torch has it (>= 2.13), its own chunked
F.linear_cross_entropy(..., options=LinearCrossEntropyOptions()) ("torch_chunked"), one training
step each (forward + backward + SGD on W), side by side in one process (the methods alternate, so
the machine's load hits all alike), same threads.

Peak memory is measured in a fresh child process per method (peak RSS over two steps minus the
RSS once inputs and weights exist), so one method's allocations never count against the other.

    OMP_WAIT_POLICY=passive python3 bench/full_softmax_vs_torch_cpu.py --classes 100000 1000000
    python3 bench/full_softmax_vs_torch_cpu.py --classes 100000 --steps 5 --threads 2 --json out.json
    python3 bench/full_softmax_vs_torch_cpu.py --classes 100000 --cache-mib 0 all   # more budgets

Floor: a step is three GEMMs of 2 B N d FLOPs (scores, grad_hidden, grad_weight); xsoftmax adds a
fourth for every chunk of scores it recomputes in the backward pass (those that do not fit its
score-cache budget, FullSoftmaxLoss(score_cache_bytes=...); torch keeps the B x N logits).
"xsoftmax" is the head's automatic plan (on the CPU, blocks of rows that keep every score within
the larger of 64 MiB and the weight gradient's size); "xsoftmax@M" one block with a budget of M MiB ("all": B x N x 4 bytes);
"xsoftmax/R" row blocks of R rows, each keeping every score of its block (--row-blocks); each run
side by side with the others. --openblas-coretype sets OPENBLAS_CORETYPE (xsoftmax's BLAS)
before anything loads OpenBLAS. Needs the xsoftmax package (pip install --no-build-isolation ./python).
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def make(n, d, b, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(b, d, generator=g)
    t = torch.randint(0, n, (b,), generator=g)
    w = (torch.rand(n, d, generator=g) * 2 - 1) / d ** 0.5
    return h, t, w


def torch_step(w, h, t, lr):
    w.grad = None
    hh = h.detach().requires_grad_()
    loss = F.cross_entropy(F.linear(hh, w), t)
    loss.backward()
    with torch.no_grad():
        w.add_(w.grad, alpha=-lr)  # in place: no B x N or N x d temporary beyond the gradient
    return loss.item()


def torch_chunked_step(w, h, t, lr):
    """PyTorch's own chunked F.linear_cross_entropy (torch >= 2.13): the B x N logits never whole."""
    w.grad = None
    hh = h.detach().requires_grad_()
    loss = F.linear_cross_entropy(hh, w, t, options=torch.nn.LinearCrossEntropyOptions())
    loss.backward()
    with torch.no_grad():
        w.add_(w.grad, alpha=-lr)
    return loss.item()


def has_torch_chunked():
    return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")


def xsoftmax_step(head, h, t, lr):
    head.weight.grad = None
    hh = h.detach().requires_grad_()
    loss = head(hh, t)
    loss.backward()
    with torch.no_grad():
        head.weight.add_(head.weight.grad, alpha=-lr)
    return loss.item()


def row_block(method):
    """The row block of method "xsoftmax/R" (None: the default)."""
    return int(method.split("/", 1)[1]) if "/" in method else None


def cache_bytes(method, n, b):
    """The score-cache budget of method "xsoftmax@M" (None: the default; "xsoftmax/R": R x N x 4)."""
    if "/" in method:
        return row_block(method) * n * 4
    if "@" not in method:
        return None
    mib = method.split("@", 1)[1]
    return b * n * 4 if mib == "all" else int(float(mib) * 2 ** 20)


def stepper(method, n, d, b):
    h, t, w = make(n, d, b)
    if method in ("torch", "torch_chunked"):
        w = w.requires_grad_()
        step = torch_step if method == "torch" else torch_chunked_step
        return lambda: step(w, h, t, 0.1)
    from xsoftmax import FullSoftmaxLoss
    head = FullSoftmaxLoss(n, d, score_cache_bytes=cache_bytes(method, n, b), row_block=row_block(method))
    with torch.no_grad():
        head.weight.copy_(w)
    return lambda: xsoftmax_step(head, h, t, 0.1)


def openblas_core():
    """The core type OpenBLAS runs (the system libopenblas that xsoftmax links), or '?'."""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "?"


def proc_status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def step_peak_mib(step):
    """Peak RSS growth (MiB) over two calls of `step`: the peak (VmHWM) is reset to the current RSS
    first (Linux: /proc/self/clear_refs), so the set-up's temporaries do not count."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = proc_status_mib("VmRSS")
    step()
    step()
    return proc_status_mib("VmHWM") - base


def child_peak(method, n, d, b, threads):
    """Peak RSS growth (MiB) of two steps of `method` in a fresh process."""
    code = (f"import torch, sys; sys.path.insert(0, {repr(os.path.dirname(os.path.abspath(__file__)))}); "
            f"torch.set_num_threads({threads}); import full_softmax_vs_torch_cpu as m; "
            f"print(m.step_peak_mib(m.stepper({method!r}, {n}, {d}, {b})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="timed steps per method (after one warm-up step)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--cache-mib", nargs="*", default=[],
                   help="also run xsoftmax with these score-cache budgets (MiB, or 'all')")
    p.add_argument("--row-blocks", type=int, nargs="*", default=[],
                   help="also run xsoftmax in blocks of these many rows, each keeping every score of its block")
    p.add_argument("--no-torch-chunked", action="store_true",
                   help="leave out torch's chunked F.linear_cross_entropy (slow on the CPU: minutes a step at 1e6)")
    p.add_argument("--openblas-coretype", help="OPENBLAS_CORETYPE for xsoftmax's OpenBLAS (e.g. Haswell, SkylakeX)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    if a.openblas_coretype:
        os.environ["OPENBLAS_CORETYPE"] = a.openblas_coretype  # read when OpenBLAS loads (with xsoftmax._C)
    torch.set_num_threads(a.threads)
    methods = ["torch"] + (["torch_chunked"] if has_torch_chunked() and not a.no_torch_chunked else []) + ["xsoftmax"] + [f"xsoftmax@{m}" for m in a.cache_mib] + [
        f"xsoftmax/{r}" for r in a.row_blocks]
    rows = []
    import xsoftmax.torch  # noqa: F401  (loads OpenBLAS now, under the core type above)
    print(f"torch {torch.__version__}, {a.threads} threads, d = {a.dim}, B = {a.batch}; OpenBLAS core "
          f"{openblas_core()}; \"xsoftmax\" is the head's automatic plan (blocks that keep every score)",
          flush=True)
    for n in a.classes:
        steps = {m: stepper(m, n, a.dim, a.batch) for m in methods}
        for s in steps.values():
            s()  # warm-up
        times = {m: [] for m in steps}
        for _ in range(a.steps):
            for m, s in steps.items():  # alternate: the same load for both
                t0 = time.perf_counter()
                s()
                times[m].append(time.perf_counter() - t0)
        del steps
        peak = {m: child_peak(m, n, a.dim, a.batch, a.threads) for m in methods}
        gflop = 3 * 2 * a.batch * n * a.dim / 1e9
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"N = {n:>9,}: torch {med['torch'] * 1e3:8.1f} ms ({gflop / med['torch']:.0f} GFLOP/s of the 3-GEMM "
              f"floor), peak memory {peak['torch']:.0f} MiB", flush=True)
        for m in methods[1:]:
            budget = cache_bytes(m, n, a.batch)
            row = {"classes": n, "dim": a.dim, "batch": a.batch, "threads": a.threads, "gemm_gflop_per_step": gflop,
                   "openblas_core": openblas_core(), "method": m, "row_block": row_block(m),
                   "score_cache_bytes": budget,  # None: the head's automatic plan
                   "torch_s": med["torch"], "xsoftmax_s": med[m], "torch_all_s": times["torch"],
                   "xsoftmax_all_s": times[m], "speedup": med["torch"] / med[m],
                   "torch_peak_mib": peak["torch"], "xsoftmax_peak_mib": peak[m],
                   "memory_ratio": peak[m] / peak["torch"]}
            rows.append(row)
            cache = "      -" if m.startswith("torch") else "   auto" if budget is None else f"{budget / 2 ** 20:7.0f}"
            print(f"  {m:>16} (cache {cache} MiB): {med[m] * 1e3:8.1f} ms -> "
                  f"torch / {m.split('@')[0].split('/')[0]} {row['speedup']:.2f}x; peak memory {peak[m]:.0f} MiB "
                  f"({row['memory_ratio']:.2f}x torch's)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
