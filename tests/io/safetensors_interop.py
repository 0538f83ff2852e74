#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Interop of xsoftmax checkpoints with Python's safetensors, both ways (CTest: safetensors_interop).

1. Runs `checkpoint_interop write DIR`: the C++ side saves checkpoints of every head kind and of
   sparse Adam, plus DIR/cpp/reference.txt with every tensor's values. Each file must load with
   safetensors.numpy.load_file, hold the values of the reference, the documented names, dtypes and
   shapes, and the header must be padded so that the data starts at a multiple of 8 bytes.
2. Writes DIR/python/head.safetensors with safetensors.numpy.save_file (F32 weights, F16 bias:
   numpy has no bfloat16) and DIR/python/expected.txt, then runs `checkpoint_interop read DIR`,
   which loads it into an fp32 and a bf16 head and checks the values.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def check(condition, message):
    if not condition:
        sys.exit("safetensors_interop: FAILED: " + message)


def read_reference(path):
    """{"<name>/<file>:<tensor>": list of values} from the C++ side's reference.txt."""
    reference = {}
    with open(path) as f:
        for line in f:
            key, *values = line.split()
            reference[key] = [float.fromhex(v) if ("p" in v or "x" in v) else int(v) for v in values]
    return reference


def check_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    check((8 + n) % 8 == 0, f"{path}: the data does not start at a multiple of 8 bytes (header length {n})")
    return header["__metadata__"]


def check_cpp_checkpoints(root):
    reference = read_reference(os.path.join(root, "reference.txt"))
    check(len(reference) > 0, "the C++ reference lists no tensor")
    seen = set()
    for key, values in reference.items():
        label, tensor = key.split(":")
        path = os.path.join(root, label + ".safetensors")
        tensors = load_file(path)
        check(tensor in tensors, f"{path}: safetensors does not see tensor {tensor}")
        got = tensors[tensor].astype(np.float64).ravel()
        want = np.array(values, dtype=np.float64)
        check(got.shape == want.shape and np.array_equal(got, want), f"{path}: tensor {tensor} differs from C++'s")
        seen.add((label, tensor))

    meta = check_header(os.path.join(root, "full", "head.safetensors"))
    check(meta["head"] == "full_softmax" and meta["num_classes"] == "11" and meta["dim"] == "5", f"metadata {meta}")
    full = load_file(os.path.join(root, "full", "head.safetensors"))
    check(full["weight"].dtype == np.float32 and full["weight"].shape == (11, 5), "full: weight F32 [11, 5]")
    check(full["bias"].shape == (11,) and np.any(full["bias"] != 0), "full: a trained bias")
    adam = load_file(os.path.join(root, "full", "optimizer.safetensors"))
    check(adam["state"].shape == (11, 5, 2) and adam["update_counts"].dtype == np.int64, "adam: state and counts")
    check(list(adam["update_counts"]) == [2 if r % 2 == 1 else 1 for r in range(11)], "adam: per-row counts")
    check(check_header(os.path.join(root, "full", "optimizer.safetensors"))["steps"] == "2", "adam: steps")

    half = load_file(os.path.join(root, "full16", "head.safetensors"))
    check(half["weight"].dtype == np.float16 and half["weight"].shape == (9, 4), "full16: weight F16 [9, 4]")

    hs = load_file(os.path.join(root, "hs", "head.safetensors"))
    rows = 2 * 13 - 2  # a binary Huffman tree over 13 classes has 24 non-root nodes
    check(hs["tree.row_parent"].shape == (rows,) and hs["tree.row_child"].dtype == np.int64, "hs: tree codes")
    leaves = sorted(-c - 1 for c in hs["tree.row_child"] if c < 0)
    check(leaves == list(range(13)), "hs: every class is one leaf")

    knn = load_file(os.path.join(root, "knn", "head.safetensors"))
    ids = knn["graph.ids"]
    check(ids.shape == (15, 4) and ids.min() >= 0 and ids.max() < 15, "knn: graph ids [15, 4] in range")
    print(f"safetensors read {len(seen)} C++ tensors; values match the C++ reference")


def write_python_checkpoint(root):
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(7)
    n, d = 6, 3
    weight = rng.standard_normal((n, d)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float16)
    metadata = {"format": "xsoftmax.checkpoint.v1", "head": "full_softmax", "precision": "fp32",
                "num_classes": str(n), "dim": str(d), "weight_rows": str(n), "has_bias": "true"}
    save_file({"weight": weight, "bias": bias}, os.path.join(root, "head.safetensors"), metadata=metadata)
    with open(os.path.join(root, "expected.txt"), "w") as f:
        f.write(f"shape {n} {d}\n")
        f.write("weight " + " ".join(float(v).hex() for v in weight.ravel()) + "\n")
        f.write("bias " + " ".join(float(v).hex() for v in bias.astype(np.float32)) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exe", required=True, help="the checkpoint_interop program")
    parser.add_argument("--dir", required=True, help="scratch directory (emptied first)")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(os.path.join(args.dir, "cpp"))

    subprocess.run([args.exe, "write", args.dir], check=True)
    check_cpp_checkpoints(os.path.join(args.dir, "cpp"))

    write_python_checkpoint(os.path.join(args.dir, "python"))
    subprocess.run([args.exe, "read", args.dir], check=True)
    print("safetensors_interop: passed")


if __name__ == "__main__":
    main()
