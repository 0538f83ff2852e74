# SPDX-License-Identifier: Apache-2.0
"""What the graph break of sparse_grad=True heads under torch.compile costs (issue 27).

Without fullgraph=True, dynamo breaks the graph at `xsoftmax::loss_fused` when its gradient outputs
have a data-dependent row count (sparse_grad=True): the encoder before the head and the code after it
run as separate graphs. This times one training step (forward + backward of a small encoder and the
head) eagerly, compiled as is (graph breaks), compiled with
`torch._dynamo.config.capture_dynamic_output_shape_ops = True` (no break) and with fullgraph=True,
and prints the graph counts. CPU by default (--device cuda on a GPU build).

    python bench/python/compile_graph_breaks.py [--device cpu] [--steps 50]
"""
import argparse
import time

import torch

from xsoftmax import HierarchicalSoftmaxLoss, SampledSoftmaxLoss, Tree


class Model(torch.nn.Module):
    def __init__(self, head, dim):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.GELU(), torch.nn.Linear(dim, dim))
        self.head = head

    def forward(self, x, t):
        return self.head(torch.tanh(self.encoder(x)), t)


def timed(fn, steps, device):
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--classes", type=int, default=100000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    n, d, b = args.classes, args.dim, args.batch
    heads = {
        "hs_uniform2": lambda: HierarchicalSoftmaxLoss(n, d, tree=Tree.uniform(n, 2, 317), sparse_grad=True),
        "sampled_1024": lambda: SampledSoftmaxLoss(n, d, num_sampled=1024, sparse_grad=True),
    }
    x = torch.randn(b, d, device=args.device)
    t = torch.randint(0, n, (b,), device=args.device)
    print(f"device {args.device}, {n} classes, dim {d}, batch {b}, {args.steps} steps; ms per step")
    print(f"{'head':14} {'eager':>8} {'breaks':>8} {'graphs':>6} {'capture':>8} {'graphs':>6} {'fullgraph':>9}")
    for name, make in heads.items():
        torch.manual_seed(0)
        model = Model(make(), d).to(args.device)

        def step(m):
            m.zero_grad(set_to_none=True)
            m(x, t).backward()

        row = [timed(lambda: step(model), args.steps, args.device)]
        for capture in (False, True):
            torch._dynamo.reset()
            torch._dynamo.config.capture_dynamic_output_shape_ops = capture
            graphs = torch._dynamo.explain(model)(x, t).graph_count
            torch._dynamo.reset()
            compiled = torch.compile(model)
            row += [timed(lambda: step(compiled), args.steps, args.device), graphs]
        torch._dynamo.reset()
        torch._dynamo.config.capture_dynamic_output_shape_ops = False
        full = torch.compile(model, fullgraph=True)
        row.append(timed(lambda: step(full), args.steps, args.device))
        print(f"{name:14} {row[0]:8.2f} {row[1]:8.2f} {row[2]:6d} {row[3]:8.2f} {row[4]:6d} {row[5]:9.2f}")


if __name__ == "__main__":
    main()
