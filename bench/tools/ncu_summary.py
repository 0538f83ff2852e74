#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A per-kernel time table from `ncu --metrics gpu__time_duration.sum --print-summary per-kernel`.

    python3 bench/tools/ncu_summary.py profile.txt [--steps 2] [--top 25]

Prints one line per kernel (short name, launches, average and total microseconds, share of the
total), largest total first; `--steps` divides launches and totals by the number of calls profiled
(bench/cuda/gpu_run.sh profiles: one warm-up and one timed call, so 2), giving a step's breakdown.
"""
import argparse
import re

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def short_name(name):
    """The part of a kernel's name that says what it is: the xsoftmax function (or lambda's owner)
    for Thrust/CUB wrappers, else the kernel's own name without template arguments."""
    m = re.search(r"xsoftmax::(?:detail::)?(?:gpu::)?(\w+)(?:<[^()]*?>)?\(const", name)
    if m and "static_kernel" in name:
        lam = re.search(r"\[lambda\(long\) \(instance (\d+)\)\]", name)
        return m.group(1) + (f"#{lam.group(1)}" if lam else "")
    m = re.search(r"gpu::(\w+)<", name)
    if m and "static_kernel" in name:
        return m.group(1)
    base = re.sub(r"<.*", "", name.replace("void ", "")).strip()
    return base.split("::")[-1][:70]


def parse(path):
    text = open(path, errors="replace").read()
    rows = []
    pattern = re.compile(
        r"^  (\S[^\n]*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)[^\n]*?Invocations (\d+)\n(.*?)gpu__time_duration\.sum\s+(\S+)\s+"
        r"([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)", re.S | re.M)
    for m in pattern.finditer(text):
        scale = UNITS.get(m.group(4))
        if scale is None:
            continue
        avg = float(m.group(7).replace(",", "")) * scale
        rows.append((short_name(m.group(1)), int(m.group(2)), avg))
    merged = {}
    for name, n, avg in rows:  # one kernel at several launch shapes: add them up
        launches, total = merged.get(name, (0, 0.0))
        merged[name] = (launches + n, total + n * avg)
    return merged


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--steps", type=float, default=1.0, help="calls profiled (divides launches and totals)")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    merged = parse(a.profile)
    total = sum(t for _, t in merged.values())
    print(f"{'kernel':<44} {'launches':>9} {'avg us':>9} {'total ms':>9} {'share':>6}")
    for name, (n, t) in sorted(merged.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{name:<44} {n / a.steps:9.1f} {t / n:9.2f} {t / a.steps / 1e3:9.3f} {100 * t / total:5.1f}%")
    print(f"{'sum of kernel times':<44} {sum(n for n, _ in merged.values()) / a.steps:9.1f} {'':>9} "
          f"{total / a.steps / 1e3:9.3f}")


if __name__ == "__main__":
    main()
