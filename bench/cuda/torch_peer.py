#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch peers of bench/cuda/heads_cuda_bench.cu, on the same GPU.

1. Full softmax, bf16, B x d x N = 8192 x 2304 x 256K (the heads_cuda_bench line full_bf16_256k):
   loss = F.cross_entropy(F.linear(h, W), t); forward, and forward + backward, time per call and
   torch.cuda.max_memory_allocated (PyTorch materialises the B x N logits, and their gradient).
   The same for PyTorch's F.linear_cross_entropy (where torch has it), Cut Cross-Entropy and
   Liger's fused linear cross-entropy when they import (carried wheels), and xsoftmax's own
   FullSoftmaxLoss operator when the PyTorch package with CUDA operators imports, on the same inputs; then
   all of them again at the small call 1024 x 2304 x 32K (heads_cuda_bench --quick's first line).
2. torch.nn.AdaptiveLogSoftmaxWithLoss over N = 1M classes (cutoffs 20K / 200K, div_value 4),
   bf16, d = 512, B = 8192, Zipf-like targets: the closest built-in peer of a hierarchical softmax.
   xsoftmax's HierarchicalSoftmaxLoss (the PyTorch package's CUDA operators, when installed) beside
   it: uniform trees of 2 and 3 levels over the same classes, bf16, same B, d and targets.
3. The two ceilings of the floors in bench/RESULTS.md, measured on this device: a 4 GiB
   device-to-device copy (bytes read + written per second) and cuBLAS's bf16 GEMM rate through
   torch.matmul, at 8192^3 and at the full softmax's score-GEMM shape (B x N x d).

Usage: python3 bench/cuda/torch_peer.py [--quick | --small] [--reps 10]
(--small: the small call 1024 x 2304 x 32K of every implementation only, 5 x reps calls each)
Prints one line per configuration. Needs torch with CUDA; Cut Cross-Entropy and Liger are optional.
"""
import argparse
import math

import torch
import torch.nn.functional as F


def time_ms(fn, reps):
    fn()  # warm-up (cuBLAS heuristics, allocator)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def zipf_targets(batch, n, device):
    # Same law as heads_cuda_bench: t = floor(n^u) - 1, u uniform in [0, 1).
    u = torch.rand(batch, device=device, dtype=torch.float64)
    return torch.clamp(torch.floor(torch.pow(float(n), u)).long() - 1, 0, n - 1)


def ceilings(batch, dim, n, device):
    """Device-to-device copy bandwidth and cuBLAS bf16 GEMM rates (the floors' denominators)."""
    words = 1 << 30
    a = torch.empty(words, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), 10)
    print(f"ceiling copy           {4 * words / 1e9:.1f} GB device-to-device: {ms:.3f} ms, "
          f"{2 * 4 * words / (ms * 1e-3) / 1e9:.0f} GB/s (read + write)", flush=True)
    del a, b
    for m, nn, k in ((8192, 8192, 8192), (batch, n, dim)):
        x = torch.rand(m, k, device=device, dtype=torch.bfloat16) - 0.5
        y = torch.rand(k, nn, device=device, dtype=torch.bfloat16) - 0.5
        ms = time_ms(lambda: x @ y, 10)
        print(f"ceiling gemm_bf16      M={m:<6} N={nn:<10} K={k:<5} {ms:9.3f} ms  "
              f"{2 * m * nn * k / (ms * 1e-3) / 1e12:6.1f} TFLOP/s", flush=True)
        del x, y
    torch.cuda.empty_cache()


def torch_linear_cross_entropy(h, w, t):
    return F.cross_entropy(F.linear(h, w), t)


def torch_fused_linear_cross_entropy():
    """PyTorch's own fused op, F.linear_cross_entropy, where this torch has it (else None)."""
    fn = getattr(F, "linear_cross_entropy", None)
    if fn is None:
        print(f"F.linear_cross_entropy not in torch {torch.__version__}", flush=True)
        return None
    return lambda h, w, t: fn(h, w, t)


def fused_peers():
    """(name, loss(h, w, t)) of the fused linear cross-entropy packages that import here: Cut
    Cross-Entropy (Apple, `cut_cross_entropy.linear_cross_entropy`, its default "cce" kernels and
    gradient filter) and Liger's fused linear cross-entropy. Carry their wheels (pure Python; torch and
    Triton are on the GPU machine): bench/cuda/gpu_run.sh installs what .whl/ holds."""
    peers = []
    torch_fused = torch_fused_linear_cross_entropy()
    if torch_fused is not None:
        peers.append(("torch_fused", torch_fused))
    try:
        from cut_cross_entropy import linear_cross_entropy
        peers.append(("cce", lambda h, w, t: linear_cross_entropy(h, w, t)))
    except Exception as e:  # noqa: BLE001 - any import failure means: not available here
        print(f"cut_cross_entropy not available: {e}", flush=True)
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
        peers.append(("liger", lambda h, w, t: liger_fused_linear_cross_entropy(h, w, t)))
    except Exception as e:  # noqa: BLE001
        print(f"liger_kernel not available: {e}", flush=True)
    xs = xsoftmax_package()
    if xs is not None:
        # The operator FullSoftmaxLoss calls (fused forward + backward when a gradient is needed).
        peers.append(("xsoftmax", lambda h, w, t: xs._ops.loss(h, w, None, t, 1, -100)))
        # With gradient filtering at Cut Cross-Entropy's bf16 default (2^-12, per entry), through a
        # FullSoftmaxLoss head handle that carries it: beside `cce`, which filters by default.
        filtering = xs.FullSoftmaxLoss(2, 1, gradient_filter=2.0 ** -12)
        peers.append(("xsoftmax_filter", lambda h, w, t: xs._ops.loss(h, w, None, t, 1, -100, filtering._head)))
    return peers


def xsoftmax_package():
    """The xsoftmax PyTorch package when it imports with its CUDA operators (else None, said why)."""
    try:
        import xsoftmax
    except Exception as e:  # noqa: BLE001
        print(f"xsoftmax package not available: {e}", flush=True)
        return None
    info = xsoftmax.build_info()
    if not info["cuda"]:
        print(f"xsoftmax package has no CUDA operators: {info['why_no_cuda']}", flush=True)
        return None
    print(f"xsoftmax package: {info}", flush=True)
    return xsoftmax


def full_softmax(batch, dim, n, reps, device, name="torch", loss_fn=torch_linear_cross_entropy):
    """One exact linear + cross-entropy implementation at B x d x N, bf16: time per call and peak
    memory beyond the inputs, forward (no grad) and forward + backward."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device=device).manual_seed(0)  # the same inputs for every implementation
    w = (torch.rand(n, dim, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1) / math.sqrt(dim)
    w.requires_grad_(True)
    h = (torch.rand(batch, dim, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1).requires_grad_(True)
    t = torch.randint(0, n, (batch,), device=device, generator=gen)
    base = torch.cuda.memory_allocated()

    def fwd():
        with torch.no_grad():
            return loss_fn(h, w, t)

    def fwd_bwd():
        w.grad = None
        h.grad = None
        loss = loss_fn(h, w, t)
        loss.backward()
        return loss

    try:
        torch.cuda.reset_peak_memory_stats()
        f_ms = time_ms(fwd, reps)
        f_peak = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        fb_ms = time_ms(fwd_bwd, reps)
        fb_peak = torch.cuda.max_memory_allocated() - base
        loss = float(fwd())
    except Exception as e:  # noqa: BLE001 - a peer that fails at this shape says so and the run goes on
        print(f"{name} full_bf16: failed at B={batch} d={dim} N={n}: {e}", flush=True)
        return
    label = f"{name} full_bf16"
    print(f"{label:<22} B={batch:<6} d={dim:<5} N={n:<10} fwd {f_ms:9.3f} ms  fwd+bwd {fb_ms:9.3f} ms  "
          f"peak extra fwd {f_peak / 1e6:9.1f} MB  fwd+bwd {fb_peak / 1e6:9.1f} MB  loss {loss:.4f}", flush=True)
    del w, h, t


def time_head(loss_of, module, h, t, reps):
    """(forward ms, forward + backward ms, peak extra MB of forward + backward) of loss_of(module(h, t))
    -- the hierarchical heads' shared timing."""
    base = torch.cuda.memory_allocated()

    def fwd():
        with torch.no_grad():
            return loss_of(module(h, t))

    def fwd_bwd():
        module.zero_grad(set_to_none=True)
        h.grad = None
        loss = loss_of(module(h, t))
        loss.backward()
        return loss

    torch.cuda.reset_peak_memory_stats()
    f_ms = time_ms(fwd, reps)
    torch.cuda.reset_peak_memory_stats()
    fb_ms = time_ms(fwd_bwd, reps)
    return f_ms, fb_ms, (torch.cuda.max_memory_allocated() - base) / 1e6


def hs_inputs(batch, dim, n, device):
    h = (torch.rand(batch, dim, device=device, dtype=torch.bfloat16) * 2 - 1).requires_grad_(True)
    return h, zipf_targets(batch, n, device)


def adaptive(batch, dim, n, reps, device):
    torch.cuda.empty_cache()
    cutoffs = [min(20000, n // 50), min(200000, n // 5)]
    head = torch.nn.AdaptiveLogSoftmaxWithLoss(dim, n, cutoffs=cutoffs, div_value=4.0).to(device, torch.bfloat16)
    h, t = hs_inputs(batch, dim, n, device)
    f_ms, fb_ms, peak = time_head(lambda out: out.loss, head, h, t, reps)
    print(f"torch adaptive_bf16    B={batch:<6} d={dim:<5} N={n:<10} fwd {f_ms:9.3f} ms  fwd+bwd {fb_ms:9.3f} ms  "
          f"peak extra fwd+bwd {peak:9.1f} MB  cutoffs {cutoffs}", flush=True)


def xsoftmax_hs(batch, dim, n, reps, device, depth):
    """xsoftmax's HierarchicalSoftmaxLoss over a uniform tree of `depth` levels (branching the
    depth-th root of n), bf16, as adaptive() times AdaptiveLogSoftmaxWithLoss."""
    xs = xsoftmax_package()
    if xs is None:
        return
    torch.cuda.empty_cache()
    branching = math.ceil(n ** (1.0 / depth))
    head = xs.HierarchicalSoftmaxLoss(n, dim, tree=xs.Tree.uniform(n, depth, branching), dtype=torch.bfloat16,
                                      sparse_grad=True).to(device)
    h, t = hs_inputs(batch, dim, n, device)
    f_ms, fb_ms, peak = time_head(lambda loss: loss, head, h, t, reps)
    print(f"xsoftmax hs{depth}_bf16      B={batch:<6} d={dim:<5} N={n:<10} fwd {f_ms:9.3f} ms  fwd+bwd {fb_ms:9.3f} ms  "
          f"peak extra fwd+bwd {peak:9.1f} MB  branching {branching}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--small", action="store_true",
                   help="only the small call 1024 x 2304 x 32K of every implementation (5 x reps calls)")
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_peer.py: no CUDA device")
        return 77
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    if a.small:
        for name, fn in [("torch", torch_linear_cross_entropy)] + fused_peers():
            full_softmax(1024, 2304, 32768, 5 * a.reps, device, name, fn)
    elif a.quick:
        ceilings(1024, 2304, 32768, device)
        for name, fn in [("torch", torch_linear_cross_entropy)] + fused_peers():
            full_softmax(1024, 2304, 32768, a.reps, device, name, fn)
        adaptive(1024, 512, 100000, a.reps, device)
        xsoftmax_hs(1024, 512, 100000, a.reps, device, 2)
    else:
        ceilings(8192, 2304, 262144, device)
        peers = [("torch", torch_linear_cross_entropy)] + fused_peers()
        for name, fn in peers:
            full_softmax(8192, 2304, 262144, a.reps, device, name, fn)
        # The small call of the target 5 (heads_cuda_bench --quick's first line), where
        # host-side cost per call shows: more repetitions, the time being short.
        for name, fn in peers:
            full_softmax(1024, 2304, 32768, 5 * a.reps, device, name, fn)
        adaptive(8192, 512, 1 << 20, a.reps, device)
        for depth in (2, 3):
            xsoftmax_hs(8192, 512, 1 << 20, a.reps, device, depth)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
