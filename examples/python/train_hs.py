#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train a hierarchical softmax head over 1M classes on synthetic Zipf data (PyTorch, CPU or CUDA).

The problem is shaped like the ones xsoftmax is for (a language model's vocabulary, product or
identity recognition):

* N classes whose frequencies follow Zipf's law (class 0 is the most frequent);
* class c has a fixed "true" vector t_c = centre(group of c) + own offset, and a sample of class
  c arrives as the feature vector t_c + noise; classes that share a tree node (a group of
  `branching` consecutive ids) look alike, as a good tree makes them;
* the model is a residual linear layer (h = x + W x, W starting at zero) followed by
  `HierarchicalSoftmaxLoss` over a two-level uniform tree with branching ceil(sqrt(N)) (or, with
  `--tree kmeans`, the balanced k-means tree of the class vectors t_c, as class embeddings from
  elsewhere would give, with the node weights initialised from them). The head's
  weight gradient is sparse (only the rows on the batch's paths) and is applied by plain SGD;
  the linear layer gets the hidden gradient the head passes back.

At the end: held-out loss and top-1 / top-5 accuracy by exact best-first tree search.

    python examples/python/train_hs.py                        # 1M classes, 300 steps
    python examples/python/train_hs.py --classes 10000 --steps 200 --dim 32 --batch 128
    python examples/python/train_hs.py --device cuda --batch 8192 --dim 256   # on a GPU
    python examples/python/train_hs.py --classes 100000 --tree kmeans        # label tree of the class vectors

Needs the xsoftmax package (pip install --no-build-isolation ./python); --device cuda needs a build
with its CUDA operators (xsoftmax.build_info()['cuda']). The data are drawn on the CPU and copied to
the device each step.
"""
import argparse
import functools
import math
import os
import sys
import time

# A hierarchical-softmax step opens many short OpenMP parallel regions; threads that spin between
# them starve each other (and anything else) on a shared machine. libgomp reads this once, when
# torch loads it, so it is set before the import (it has no effect when torch is already loaded).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import xsoftmax  # noqa: E402
from xsoftmax import HierarchicalSoftmaxLoss, Tree  # noqa: E402


class ZipfProblem:
    """Synthetic data: Zipf-distributed class ids and their noisy feature vectors."""

    def __init__(self, num_classes, dim, branching, exponent=1.05, noise=0.25, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.num_classes, self.dim, self.branching = num_classes, dim, branching
        ranks = torch.arange(1, num_classes + 1, dtype=torch.float64)
        p = ranks.pow(-exponent)
        self.prob = p / p.sum()
        self.cdf = self.prob.cumsum(0).float()
        groups = -(-num_classes // branching)
        scale = 4.0 / math.sqrt(dim)
        # t_c = centre[c // branching] + offset[(c * 7919) % table]: `table` (a prime >= branching)
        # offsets are shared between groups, but distinct inside one group, with no N x dim table.
        self.table = _next_prime(max(branching, 257))
        self.centre = torch.randn(groups, dim, generator=g) * scale
        self.offset = torch.randn(self.table, dim, generator=g) * scale
        self.noise = noise
        self.gen = torch.Generator().manual_seed(seed + 1)

    def true_vectors(self, classes):
        return self.centre[classes // self.branching] + self.offset[(classes * 7919) % self.table]

    def sample(self, batch):
        u = torch.rand(batch, generator=self.gen)
        targets = torch.searchsorted(self.cdf, u).clamp_(max=self.num_classes - 1)
        x = self.true_vectors(targets) + self.noise * torch.randn(batch, self.dim, generator=self.gen)
        return x, targets

    def head_mass(self, k):
        """P(class < k): top-k accuracy of always answering the k most frequent classes."""
        return float(self.cdf[k - 1])


def _next_prime(n):
    def is_prime(m):
        return m >= 2 and all(m % d for d in range(2, int(m ** 0.5) + 1))
    while not is_prime(n):
        n += 1
    return n


class Model(nn.Module):
    def __init__(self, num_classes, dim, tree, dtype):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        # init_scale 0.01: start near the uniform distribution over each node's children.
        self.head = HierarchicalSoftmaxLoss(num_classes, dim, tree=tree, bias=True, dtype=dtype, sparse_grad=True,
                                            init_scale=0.01)

    def hidden(self, x):
        return x + self.proj(x)

    def forward(self, x, targets):
        return self.head(self.hidden(x), targets)


class Progress:
    """tqdm when installed, else a carriage-return line."""

    def __init__(self, total, enabled=True):
        self.total, self.enabled, self.n = total, enabled, 0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="step", dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def update(self, loss, rate):
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{rate:,.0f}", refresh=False)
            self.bar.update(1)
        elif self.n == self.total or self.n % 5 == 0 or self.n == 1:
            width = 30
            done = int(width * self.n / self.total)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} "
                             f"loss {loss:.4f}  {rate:,.0f} samples/s   ")
            sys.stderr.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=1_000_000, help="number of classes (default 1M)")
    p.add_argument("--dim", type=int, default=64, help="hidden width")
    p.add_argument("--batch", type=int, default=512, help="samples per step")
    p.add_argument("--steps", type=int, default=300, help="SGD steps")
    p.add_argument("--lr", type=float, default=None, help="head learning rate (default: 0.025 * batch)")
    p.add_argument("--proj-lr", type=float, default=0.01, help="learning rate of the linear layer")
    p.add_argument("--tree", choices=["uniform", "huffman", "kmeans"], default="uniform",
                   help="uniform: two levels of ceil(sqrt(N)) (matches the data); huffman: binary Huffman "
                        "tree of the Zipf frequencies (word2vec style; ignores the data's groups); kmeans: "
                        "Tree.kmeans of the class vectors (two levels of ceil(sqrt(N))), node weights "
                        "initialised from them")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weight storage of the head")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (a build with the CUDA operators)")
    p.add_argument("--eval-batch", type=int, default=2048, help="held-out samples for the final evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch / OpenMP threads (0: default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (the summary lines are still printed)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not xsoftmax.build_info()["cuda"]:
        raise SystemExit(f"--device {args.device}: this build of xsoftmax has no CUDA operators "
                         f"({xsoftmax.build_info()['why_no_cuda']})")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {args.device}: cpu or cuda")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    n, d = args.classes, args.dim
    branching = max(2, math.ceil(math.sqrt(n)))
    lr = args.lr if args.lr is not None else 0.025 * args.batch
    dtype = getattr(torch, args.dtype)
    problem = ZipfProblem(n, d, branching, seed=args.seed)

    t0 = time.perf_counter()
    class_vectors = None
    if args.tree == "uniform":
        tree = Tree.uniform(n, 2 if n > branching else 1, branching)
    elif args.tree == "huffman":
        tree = Tree.huffman(problem.prob)
    else:  # the classes' vectors as embeddings: similar classes share nodes, the nodes start at their means
        class_vectors = problem.true_vectors(torch.arange(n))
        tree = Tree.kmeans(class_vectors, branching, 2 if n > branching else 1)
    model = Model(n, d, tree, dtype)
    if class_vectors is not None:
        model.head.init_weights_from_class_vectors(class_vectors, class_bias=torch.zeros(n))
    model = model.to(device)
    setup_s = time.perf_counter() - t0
    log = functools.partial(print, flush=True)
    log(f"xsoftmax {xsoftmax.__version__}: hierarchical softmax, {n:,} classes, dim {d}, {tree}, "
        f"{model.head.weight.shape[0]:,} weight rows ({args.dtype}), batch {args.batch}, {args.steps} steps, "
        f"lr {lr:g}, device {device}; setup {setup_s:.1f} s")

    # The head's gradient is sparse (the rows on the batch's paths): plain SGD applies it in place.
    opt = torch.optim.SGD([{"params": model.head.parameters(), "lr": lr},
                           {"params": model.proj.parameters(), "lr": args.proj_lr}])
    losses = []
    progress = Progress(args.steps, enabled=not args.quiet)
    ema = None
    samples, start = 0, time.perf_counter()
    for step in range(args.steps):
        x, t = problem.sample(args.batch)
        loss = model(x.to(device), t.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        losses.append(value)
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        samples += args.batch
        progress.update(ema, samples / (time.perf_counter() - start))
    progress.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - start

    model.eval()
    with torch.no_grad():
        x, t = problem.sample(args.eval_batch)
        x, t = x.to(device), t.to(device)
        h = model.hidden(x)
        loss, _, top = model.head.evaluate(h, t, k=min(5, n))  # held-out loss and top-5 in one call
        held_out = loss.item()
        top1 = (top[:, 0] == t).float().mean().item()
        top5 = (top == t[:, None]).any(1).float().mean().item()
    window = max(1, min(20, len(losses) // 5))
    result = {
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "held_out_loss": held_out,
        "top1": top1,
        "top5": top5,
        "samples_per_s": samples / train_s,
        "train_seconds": train_s,
        "setup_seconds": setup_s,
    }
    log(f"train loss {result['first_loss']:.4f} (first {window} steps) -> {result['last_loss']:.4f} "
        f"(last {window}); {result['samples_per_s']:,.0f} samples/s over {train_s:.1f} s")
    log(f"held-out ({args.eval_batch} samples): loss {held_out:.4f}, top-1 {100 * top1:.1f}%, "
        f"top-5 accuracy {100 * top5:.1f}%  (baselines: uniform {100 * min(5, n) / n:.4f}%, "
        f"5 most frequent classes {100 * problem.head_mass(min(5, n)):.1f}%)")
    return result


if __name__ == "__main__":
    main()
