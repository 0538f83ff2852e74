#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Our full-softmax training step alone (FullSoftmaxLoss, automatic plan; forward + backward + SGD),
for a profiler: nothing else in the process runs after the warm-up step, so `perf record` splits
the step between OpenBLAS's kernels and ours (bench/RESULTS.md, "the same on an AVX-512 machine").

    OMP_WAIT_POLICY=passive perf record python3 bench/tools/full_softmax_step_profile.py 6
    perf report --no-children --sort dso      # then --sort sym

Arguments: [steps] (default 3), [classes] (default 100000); d = 256, B = 1024, 2 threads, as
bench/full_softmax_vs_torch_cpu.py. Prints ms a step. Needs the xsoftmax package.
"""
import sys
import time

import torch

import xsoftmax


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    d, b = 256, 1024
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(b, d, generator=g)
    t = torch.randint(0, n, (b,), generator=g)
    head = xsoftmax.FullSoftmaxLoss(n, d)
    with torch.no_grad():
        head.weight.copy_((torch.rand(n, d, generator=g) * 2 - 1) / d ** 0.5)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        head(h.detach().requires_grad_(), t).backward()
        opt.step()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print("ms/step %.1f" % ((time.perf_counter() - start) / steps * 1e3))


if __name__ == "__main__":
    main()
