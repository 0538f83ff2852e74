#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An evaluation step of the exact softmax -- the loss and each row's top-k -- side by side in one
process: xsoftmax's ``FullSoftmaxLoss.evaluate`` (one pass over the scores, the B x N logits never
whole) against PyTorch's ``logits = F.linear(h, W)``, ``F.cross_entropy(logits, t)`` and
``logits.topk(k)`` ("torch"), and xsoftmax's own ``forward`` then ``predict`` (two passes). The
methods alternate, round after round, so the machine's load hits all alike; best and median of the
rounds are printed, with the results compared (same loss within 1e-4, same top-k classes).

    OMP_WAIT_POLICY=passive python3 bench/python/evaluate_vs_torch.py --classes 100000 --threads 2
    python3 bench/python/evaluate_vs_torch.py --device cuda --classes 262144 --batch 8192 --dim 2304 --dtype bfloat16

Floor: one score GEMM of 2 B N d FLOPs; torch also writes and reads the B x N logits (B N times the
element size of the weights' dtype) for its loss and its top-k. Needs the xsoftmax package (pip install --no-build-isolation ./python).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from xsoftmax import FullSoftmaxLoss


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    head = FullSoftmaxLoss(args.classes, args.dim, dtype=dtype, device=device)
    h = torch.randn(args.batch, args.dim, generator=g).to(device=device, dtype=dtype)
    t = torch.randint(0, args.classes, (args.batch,), generator=g).to(device)
    w = head.weight.detach()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def xsoftmax_one_pass():
        loss, _, classes = head.evaluate(h, t, k=args.k)
        return loss, classes

    def xsoftmax_two_passes():
        with torch.no_grad():
            loss = head(h, t)
            _, classes = head.predict(h, k=args.k)
        return loss, classes

    def torch_logits():
        with torch.no_grad():
            logits = F.linear(h, w)  # in the weights' dtype, as a PyTorch user would have them
            loss = F.cross_entropy(logits, t)
            _, classes = logits.topk(args.k, dim=1)
        return loss, classes

    methods = {"xsoftmax evaluate": xsoftmax_one_pass, "xsoftmax forward + predict": xsoftmax_two_passes,
               "torch linear + cross_entropy + topk": torch_logits}
    results = {name: f() for name, f in methods.items()}  # warm-up, and the values compared below
    times = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, f in methods.items():
            sync()
            start = time.perf_counter()
            f()
            sync()
            times[name].append(time.perf_counter() - start)
    print(f"N = {args.classes}, B = {args.batch}, d = {args.dim}, k = {args.k}, {args.dtype} on {device}, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds")
    base = min(times["torch linear + cross_entropy + topk"])
    for name, ts in times.items():
        print(f"  {name:36s} best {min(ts) * 1e3:9.2f} ms  median {statistics.median(ts) * 1e3:9.2f} ms  "
              f"({min(ts) / base:.2f}x torch)")
    ref_loss, ref_classes = results["torch linear + cross_entropy + topk"]
    for name, (loss, classes) in results.items():
        same = torch.equal(classes.cpu(), ref_classes.cpu())
        print(f"  {name:36s} loss {loss.item():.6f}  top-{args.k} classes equal torch's: {same}")


if __name__ == "__main__":
    main()
