#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train an exact softmax whose classes are split across processes (torch.distributed, gloo, CPU).

Every rank holds 1/world_size of the class weights (``xsoftmax.distributed.ShardedFullSoftmaxLoss``)
and its own batch of synthetic samples (data-parallel); a small shared linear encoder is kept in
sync by all-reducing its gradient, as DistributedDataParallel would. Each step prints, on rank 0,
the mean loss over all ranks; at the end, every rank's held-out top-1 accuracy (exact, over all
classes, through the sharded top-k).

    python examples/python/train_sharded.py                      # spawns 2 ranks, 100K classes
    python examples/python/train_sharded.py --ranks 4 --classes 1000000 --steps 50
    torchrun --nproc_per_node 2 examples/python/train_sharded.py --torchrun

Needs the xsoftmax package (pip install --no-build-isolation ./python).
"""
import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def synthetic(num_classes, dim, batch, generator, centres):
    """Samples of Zipf-distributed classes: the class centre plus noise."""
    ranks = torch.arange(1, num_classes + 1, dtype=torch.float64)
    zipf = 1.0 / ranks
    targets = torch.multinomial(zipf / zipf.sum(), batch, replacement=True, generator=generator)
    x = centres[targets] + 0.3 * torch.randn(batch, dim, generator=generator)
    return x, targets


def train(rank, world, args, init):
    from xsoftmax.distributed import ShardedFullSoftmaxLoss
    torch.set_num_threads(args.threads)
    if init is not None:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    centres = torch.randn(args.classes, args.dim, generator=torch.Generator().manual_seed(1))
    centres /= centres.norm(dim=1, keepdim=True)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own samples
    encoder = torch.nn.Linear(args.dim, args.dim)
    torch.nn.init.eye_(encoder.weight)
    torch.nn.init.zeros_(encoder.bias)
    head = ShardedFullSoftmaxLoss(args.classes, args.dim, seed=3)
    params = list(encoder.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"{world} ranks, {args.classes} classes x {args.dim} (rank 0 holds classes "
              f"[{head.class_begin}, {head.class_end})), batch {args.batch} per rank", flush=True)
    start = time.time()
    for step in range(1, args.steps + 1):
        x, t = synthetic(args.classes, args.dim, args.batch, data, centres)
        loss = head(encoder(x), t)
        opt.zero_grad()
        loss.backward()
        for p in encoder.parameters():  # the replicated encoder: average its gradient (as DDP)
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0 and (step % max(1, args.steps // 10) == 0 or step == 1):
            rate = step * args.batch * world / (time.time() - start)
            print(f"step {step:4d}  loss {mean_loss.item() / world:.4f}  {rate:,.0f} samples/s", flush=True)
    with torch.no_grad():
        x, t = synthetic(args.classes, args.dim, 512, data, centres)
        # The held-out loss and top-1 from one pass over each rank's scores.
        held_out, _, classes = head.evaluate(encoder(x), t, k=1)
        hits = (classes[:, 0] == t).float().sum()
        dist.all_reduce(hits)
        dist.all_reduce(held_out)
    if rank == 0:
        print(f"held-out loss {held_out.item() / world:.4f}, top-1 over all {args.classes} classes: "
              f"{100 * hits.item() / (512 * world):.1f} %", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="processes to spawn (ignored with --torchrun)")
    p.add_argument("--classes", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=256, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--torchrun", action="store_true", help="launched by torchrun (env:// rendezvous)")
    args = p.parse_args()
    if args.torchrun:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(train, args=(args.ranks, args, f"file://{tmp}/init"), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
