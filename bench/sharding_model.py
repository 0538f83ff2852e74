#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Paper model of one training step of the class-sharded full softmax (full_softmax over
class_sharding<nccl_communicator>, data-parallel rows) on S GPUs: weak scaling with a fixed
per-GPU batch, N classes split evenly. Prints a markdown table (bench/RESULTS.md).

Nothing here is measured: every rate below is an ASSUMPTION (vendor peak times an assumed
efficiency, or a typical nccl-tests figure) and must be replaced by the numbers measured on the
target GPU (issue 10) before the table is trusted. Run: python3 bench/sharding_model.py [--help].

Per GPU and step (b rows per GPU, B = S*b gathered rows, n = N/S local classes, d dims):
  compute   4 GEMMs of B x n x d (pass 1 scores; pass 2 recomputed scores, grad_hidden, grad_W):
            8*B*n*d flop = 8*b*N*d, independent of S (the weak-scaling invariant)
  epilogue  score chunks round-trip through HBM (cuBLAS writes fp32 scores, a kernel reads them):
            pass 1 write+read 8 B/score; pass 2 write+read 8 B, dlogit written bf16 2 B and read by
            two GEMMs 4 B: 22 B per score, B*n = b*N scores; 2 exp per score on the SFUs
  weights   bf16 W read by 3 GEMMs (6 B/elem), fp32 gradient written and read by SGD (8 B), W read
            and written by SGD (4 B): 18 B per local weight element, n*d elements
  comm      ring all-gather of the fp32 hidden rows and reduce-scatter of fp32 grad_hidden:
            (S-1)/S * S*b*d*4 bytes / bus bandwidth each (NCCL's busbw definition); all-gather of
            targets (8 B) and upstream gradients (4 B) per row; all-reduce of the per-row max (4 B)
            and of (sum, target logit) (8 B) per gathered row: 2(S-1)/S * bytes / busbw; plus a
            latency per collective (7 per step: counts, rows, targets, upstream, max, sums, RS)
  step      compute + comm (the current implementation blocks on every collective); the
            `overlap` column is max(compute, comm), what overlapping would reach at best
"""

import argparse
import math


def model(args, s):
    b, n_total, d = args.rows_per_gpu, args.classes, args.dim
    big_b = s * b
    n = n_total / s
    scores = big_b * n
    gemm_s = 8.0 * scores * d / (args.gemm_tflops * 1e12)
    epi_bytes = 22.0 * scores
    epi_s = max(epi_bytes / (args.hbm_tbs * 1e12), 2.0 * scores / (args.exp_per_s))
    weight_bytes = 18.0 * n * d
    weight_s = weight_bytes / (args.hbm_tbs * 1e12)
    compute_s = gemm_s + epi_s + weight_s

    busbw = (args.nvlink_busbw if s <= args.gpus_per_node else args.network_busbw) * 1e9
    ring = (s - 1) / s
    rows_bytes = s * b * d * 4.0                   # gathered fp32 rows (= grad_hidden input of the RS)
    small_gather = s * b * (8.0 + 4.0)             # targets, upstream
    reduce_bytes = s * b * (4.0 + 8.0)             # max; (sum, target logit)
    bw_s = (ring * rows_bytes + ring * small_gather + ring * rows_bytes + 2 * ring * reduce_bytes) / busbw
    hop = args.hop_us_intra if s <= args.gpus_per_node else args.hop_us_inter
    ring_latency = (s - 1) * hop * 1e-6            # per all-gather / reduce-scatter (5 of them)
    tree_latency = 2 * math.log2(s) * hop * 1e-6   # per small all-reduce (2 of them; NCCL picks a tree)
    comm_s = bw_s + 5 * ring_latency + 2 * tree_latency
    # bytes a GPU sends in the ring: (S-1) blocks of b*d*4 in the all-gather, (S-1)/S of the RS input,
    # and the small collectives
    sent = (s - 1) * b * d * 4.0 + ring * rows_bytes + ring * small_gather + 2 * ring * reduce_bytes
    mem_gb = (2.0 + 4.0) * n * d / 1e9 + (b * s * d * 4.0 * 3) / 1e9  # W bf16 + fp32 grad + rows/grad buffers
    return dict(S=s, B=big_b, n=n, mem_gb=mem_gb, gemm_ms=gemm_s * 1e3, epi_ms=epi_s * 1e3, weight_ms=weight_s * 1e3,
                compute_ms=compute_s * 1e3, sent_mb=sent / 1e6, comm_ms=comm_s * 1e3,
                step_ms=(compute_s + comm_s) * 1e3, overlap_ms=max(compute_s, comm_s) * 1e3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=float, default=100e6)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--rows-per-gpu", type=int, default=512)
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 32, 64, 128, 256])
    p.add_argument("--gemm-tflops", type=float, default=0.6 * 989,
                   help="sustained bf16 GEMM rate (assumed: 60%% of the H100 SXM dense bf16 peak, 989 TFLOP/s)")
    p.add_argument("--hbm-tbs", type=float, default=0.8 * 3.35,
                   help="sustained HBM bandwidth, TB/s (assumed: 80%% of H100 SXM's 3.35 TB/s)")
    p.add_argument("--exp-per-s", type=float, default=132 * 16 * 1.83e9,
                   help="exp throughput (assumed: 132 SMs x 16 MUFU ops/clock x 1.83 GHz)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nvlink-busbw", type=float, default=360.0,
                   help="NCCL bus bandwidth within a node, GB/s (assumed: typical nccl-tests on NVLink4/NVSwitch)")
    p.add_argument("--network-busbw", type=float, default=45.0,
                   help="NCCL bus bandwidth across nodes, GB/s per GPU (assumed: one 400 Gb/s NDR NIC per GPU, "
                        "~90%% efficiency)")
    p.add_argument("--hop-us-intra", type=float, default=1.0, help="latency per ring step within a node, us (assumed)")
    p.add_argument("--hop-us-inter", type=float, default=3.0, help="latency per ring step across nodes, us (assumed)")
    args = p.parse_args()
    print(f"N = {args.classes:.3g} classes, d = {args.dim}, bf16 weights, {args.rows_per_gpu} rows per GPU; "
          f"GEMM {args.gemm_tflops:.0f} TFLOP/s, HBM {args.hbm_tbs:.2f} TB/s, busbw {args.nvlink_busbw:.0f} GB/s "
          f"(node) / {args.network_busbw:.0f} GB/s (network): ASSUMED, not measured\n")
    print("| S | global batch | classes per GPU | W + grad per GPU (GB) | GEMM (ms) | score epilogue (ms) | "
          "weight traffic (ms) | compute (ms) | sent per GPU (MB) | comm (ms) | step, blocking (ms) | "
          "step, overlapped (ms) | comm share | samples/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in args.gpus:
        r = model(args, s)
        print(f"| {s} | {r['B']:,} | {r['n']:,.0f} | {r['mem_gb']:.1f} | {r['gemm_ms']:.0f} | {r['epi_ms']:.0f} | "
              f"{r['weight_ms']:.1f} | {r['compute_ms']:.0f} | {r['sent_mb']:.1f} | {r['comm_ms']:.1f} | "
              f"{r['step_ms']:.0f} | {r['overlap_ms']:.0f} | {r['comm_ms'] / r['step_ms']:.1%} | "
              f"{r['B'] / (r['step_ms'] / 1e3):,.0f} |")


if __name__ == "__main__":
    main()
