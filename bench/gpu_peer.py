#!/usr/bin/env python3
"""GPU peer for issue 7: mxswitch and PyTorch in one run on the same GPU.

1. Runs mxswitch's GPU benchmarks from --bin (`gpu_check bench quantize
   linear-large`) and parses their `BENCH ...` lines.
2. Then, in this process, measures the PyTorch peers (CUDA events, warm-up,
   median of >= 20 samples):
   - quantize 8192x8192 bf16: a device-to-device copy (the copy baseline),
     torch.compile'd MXFP4 1x32 EVEN (packed codes + E8M0 scales) and FP8
     tensorwise E4M3 (amax + scale + cast);
   - linears fwd+bwd at M=16384 (bf16 activations, with bias): BF16 F.linear
     (the baseline), an FP8 torch._scaled_mm linear with eager tensorwise
     quantization, and an MXFP4 fake-quant linear (quantize-dequantize to bf16,
     bf16 GEMMs, the SPEC 4 recipe).
3. Prints one table per section: mxswitch, torch, ratio, target, met/MISSED.

    python bench/gpu_peer.py --bin .devbin [--json out.json]
    python bench/gpu_peer.py --self-test      # CPU: quantizers vs golden vectors, linears, tables

Units: quantize speeds are GB/s of bf16 input = elements * 2 B / time (the
same for the copy). Linears: TFLOP/s = 6*M*K*N / time of forward + backward.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "runtime", "tests", "golden")

Q_ROWS = Q_COLS = 8192
DEVICE = "cuda"  # the GPU runs; the self-test harness may point it elsewhere
LIN_M = 16384
LIN_SHAPES = [(3072, 12288), (12288, 3072), (3072, 3072)]  # (K, N)

# Quantize: mxswitch kernel GB/s divided by the bf16 copy's GB/s, at least this.
QUANT_TARGETS = {"mxfp4_1x32_even_bf16": 1.0, "fp8_tensorwise_e4m3_bf16": 0.7}
# Quantize kernels of `gpu_check bench quantize` in print order; the torch peer of each, if any.
QUANT_NAMES = [
    ("copy_bf16", "copy"),
    ("mxfp4_1x32_even_bf16", "mxfp4"),
    ("fp8_tensorwise_e4m3_bf16", "fp8"),
    ("fp8_cast_2d_both_e4m3_bf16", None),
    ("mxfp4_1x32_even_f32", None),
    ("fp8_tensorwise_e4m3_f32", None),
]
# Linears: mxswitch TFLOP/s divided by torch BF16 F.linear's, at least this.
LINEAR_TARGETS = {
    ("fp8", 3072, 12288): 1.3, ("fp8", 12288, 3072): 1.3, ("fp8", 3072, 3072): 1.1,
    ("mxfp4", 3072, 12288): 0.8, ("mxfp4", 12288, 3072): 0.8, ("mxfp4", 3072, 3072): 0.8,
    # Issue 18: with native block-scaled GEMMs; nvfp4 is dequantize + BF16 GEMM, as mxfp4.
    ("fp8_rowwise", 3072, 12288): 1.2, ("fp8_block", 3072, 12288): 1.2, ("nvfp4", 3072, 12288): 0.8,
}
LINEAR_RECIPES = ["bf16", "fp8", "mxfp4", "mxfp8", "nvfp4", "fp8_rowwise", "fp8_block"]  # printed in this order, others after
TORCH_PEER_OF = {"bf16": "bf16", "fp8": "fp8_scaled_mm", "mxfp4": "mxfp4_fakequant"}


# ==========================================================================
# mxswitch: run the binaries, parse their BENCH lines
# ==========================================================================
def run_bin(path, args, timeout):
    """Run one binary; never raises. Returns a dict with rc (int, "timeout",
    "missing" or "error"), seconds and the combined output."""
    cmd = [path] + args
    res = {"cmd": " ".join(cmd), "rc": None, "seconds": None, "output": ""}
    if not os.path.exists(path):
        res["rc"] = "missing"
        res["output"] = f"{path} does not exist"
        return res
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        res["rc"] = p.returncode
        res["output"] = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        err = e.stderr or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        res["rc"] = "timeout"
        res["output"] = out + err + f"\n(killed after {timeout} s)"
    except Exception as e:  # noqa: BLE001 (report anything, keep going)
        res["rc"] = "error"
        res["output"] = f"could not run: {type(e).__name__}: {e}"
    res["seconds"] = round(time.time() - t0, 2)
    return res


def num(s):
    try:
        return float(s)
    except ValueError:
        return None


QUANT_RE = re.compile(r"^\s*BENCH quantize (\S+) elems=(\d+) ms=(\S+) gbps=(\S+) copy_ratio=(\S+)", re.M)
# ms: runs back to back, as torch's are timed; idle_ms (newer binaries):
# each run from an idle device.
LINEAR_RE = re.compile(
    r"^\s*BENCH linear (.+?) M=(\d+) K=(\d+) N=(\d+) ms=(\S+) tflops=(\S+)(?: idle_ms=(\S+))?", re.M)


def parse_quant(text):
    """name -> {elems, ms, gbps, copy_ratio} from `BENCH quantize` lines (last one wins)."""
    out = {}
    for name, elems, ms, gbps, ratio in QUANT_RE.findall(text):
        out[name] = {"elems": int(elems), "ms": num(ms), "gbps": num(gbps), "copy_ratio": num(ratio)}
    return out


def parse_linear(text):
    """(recipe, M, K, N) -> {ms, tflops, idle_ms} from `BENCH linear` lines (last one wins)."""
    out = {}
    for recipe, m, k, n, ms, tf, idle in LINEAR_RE.findall(text):
        out[(recipe.strip(), int(m), int(k), int(n))] = {
            "ms": num(ms), "tflops": num(tf), "idle_ms": num(idle) if idle else None}
    return out


def show_run(name, res):
    print(f"===== {name}: rc={res['rc']}, {res['seconds']} s: {res['cmd']}")
    lines = res["output"].splitlines()
    keep = [l for l in lines if l.lstrip().startswith(("BENCH", "FAIL", "device:", "summary:"))]
    for l in keep[:80]:
        print("  " + l[:300])
    if res["rc"] != 0:
        print("  last lines of its output:")
        for l in lines[-15:]:
            print("  | " + l[:300])
    sys.stdout.flush()


# ==========================================================================
# torch quantizers (SPEC 2 and 3)
# ==========================================================================
def mxfp4_quantize(x):
    """MXFP4 1x32 with EVEN scales (SPEC 2) along the last axis of x [R, C], C % 32 == 0.

    Any float input dtype (bf16 in the benchmark, f32 for the golden vectors).
    Returns (packed E2M1 codes uint8 [R, C/2], element 2i in the low nibble;
    E8M0 scale bytes uint8 [R, C/32]). A block with NaN/Inf, or whose amax
    rounds up to 2^128, gets scale byte 0xFF and codes 0."""
    r, c = x.shape
    v = x.float().reshape(r, c // 32, 32)
    amax = v.abs().amax(-1, keepdim=True)
    bits = amax.view(torch.int32)
    # EVEN: round the amax significand to E2M1's 1 mantissa bit, keep the
    # exponent field, then FLOOR: byte = clamp(field - 127 - 2, -127, 128) + 127.
    field = ((bits + (1 << 21)) >> 23) & 0xFF
    ok = torch.isfinite(amax) & (field < 255)
    byte = torch.where(ok, (field - 2).clamp(min=0), 255)
    mult = ((254 - byte) << 23).view(torch.float32)  # 2^(127 - byte), exact for byte <= 253
    a = (v * mult).abs()
    # satfinite RNE to E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7);
    # ties go to the even code: > at ties that round down, >= at ties that round up.
    mag = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
           + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    code = mag | (torch.signbit(v).to(torch.uint8) << 3)
    code = torch.where(ok, code, 0).to(torch.uint8).reshape(r, c // 2, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return packed, byte.reshape(r, c // 32).to(torch.uint8)


def fp8_tensorwise(x, dtype=torch.float8_e4m3fn):
    """FP8 tensorwise current scaling (SPEC 3): amax in f32, scale =
    fl32(fmax / max(amax, 1e-12)) (the quotient in f64, rounded once, as
    torchao), codes = satfinite(RNE(x * scale)). Returns (codes, scale_inv f32 0-d)."""
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax().float()
    scale = (fmax / amax.double().clamp(min=1e-12)).float()
    codes = (x.float() * scale).clamp(-fmax, fmax).to(dtype)
    return codes, scale.reciprocal()


def fp8_tensorwise_e4m3(x):
    return fp8_tensorwise(x, torch.float8_e4m3fn)


def hadamard16(x):
    """(1/4) H16 on each group of 16 along the last axis: the f32 butterfly of SPEC 2."""
    shape = x.shape
    g = x.reshape(-1, 16)
    for h in (1, 2, 4, 8):
        g = g.reshape(-1, 16 // (2 * h), 2, h)
        a, b = g[:, :, 0, :], g[:, :, 1, :]
        g = torch.stack((a + b, a - b), dim=2)
    return g.reshape(shape) * 0.25


def mxfp4_fake(x, hadamard=False, tile=False):
    """MXFP4 EVEN quantize-dequantize along the last axis of x [R, C]
    (C % 32 == 0; with tile, R % 32 == 0 too), returned in bf16.

    hadamard: Hadamard-16 first (the wgrad operands); tile: one scale per
    32x32 tile (the weight). The dequantized values are exact in f32; the
    bf16 cast is exact too except for tiny subnormal-range values."""
    r, c = x.shape
    v = x.float()
    if hadamard:
        v = hadamard16(v)
    if tile:
        amax = v.reshape(r // 32, 32, c // 32, 32).abs().amax(dim=(1, 3))       # [R/32, C/32]
        amax = amax[:, None, :, None].expand(r // 32, 32, c // 32, 1).reshape(r, c // 32, 1)
    else:
        amax = v.reshape(r, c // 32, 32).abs().amax(-1, keepdim=True)
    bits = amax.view(torch.int32)
    field = ((bits + (1 << 21)) >> 23) & 0xFF
    byte = (field - 2).clamp(min=0)                    # finite data assumed (training)
    recip = ((254 - byte) << 23).view(torch.float32)   # 2^(127 - byte)
    a = v.reshape(r, c // 32, 32) * recip
    m = a.abs()
    code = ((m > 0.25).to(torch.int32) + (m >= 0.75) + (m > 1.25) + (m >= 1.75)
            + (m > 2.5) + (m >= 3.5) + (m > 5.0))
    val = torch.where(code < 4, code * 0.5, torch.where(code == 7, 6.0, code - 2.0))
    val = torch.where(torch.signbit(a), -val, val)
    return (val * (1.0 / recip)).reshape(r, c).to(torch.bfloat16)


# ==========================================================================
# torch linear peers
# ==========================================================================
class Fp8ScaledMmLinear(torch.autograd.Function):
    """y = x W^T + b with torch._scaled_mm: x, W E4M3 tensorwise forward, dy
    E5M2 tensorwise backward, eager quantization, 3 scaled GEMMs, bf16 out."""

    @staticmethod
    def forward(ctx, x, w, b):
        x8, xs = fp8_tensorwise(x, torch.float8_e4m3fn)
        w8, ws = fp8_tensorwise(w, torch.float8_e4m3fn)
        # _scaled_mm: mat1 row-major, mat2 column-major.
        y = torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, bias=b, out_dtype=x.dtype)
        ctx.save_for_backward(x8, xs, w8, ws)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x8, xs, w8, ws = ctx.saved_tensors
        dy8, ds = fp8_tensorwise(dy, torch.float8_e5m2)
        dx = torch._scaled_mm(dy8, w8.t().contiguous().t(), scale_a=ds, scale_b=ws, out_dtype=dy.dtype)
        dw = torch._scaled_mm(dy8.t().contiguous(), x8.t().contiguous().t(), scale_a=ds, scale_b=xs,
                              out_dtype=dy.dtype)
        db = dy.sum(0, dtype=torch.float32).to(dy.dtype) if ctx.has_bias else None
        return dx, dw, db


class Mxfp4FakeLinear(torch.autograd.Function):
    """The mxfp4 recipe of SPEC 4 as quantize-dequantize to bf16 plus bf16 GEMMs:
    fprop x 1x32 along K, W 32x32 tiles; dgrad dy along N, same W;
    wgrad dy and x along M with Hadamard-16. `Mxfp4FakeLinear.q` is the
    quantize-dequantize function (torch.compile'd on the GPU)."""

    q = staticmethod(mxfp4_fake)

    @staticmethod
    def forward(ctx, x, w, b):
        q = Mxfp4FakeLinear.q
        xq = q(x)
        wq = q(w, False, True)
        y = F.linear(xq, wq, b)
        x_m = q(x.t(), True, False)                      # [K, M], saved for wgrad
        ctx.save_for_backward(x_m, wq)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        q = Mxfp4FakeLinear.q
        x_m, wq = ctx.saved_tensors
        dx = q(dy) @ wq
        dw = q(dy.t(), True, False) @ x_m.t()
        db = dy.sum(0, dtype=torch.float32).to(dy.dtype) if ctx.has_bias else None
        return dx, dw, db


LINEAR_PEERS = {
    "bf16": lambda x, w, b: F.linear(x, w, b),
    "fp8_scaled_mm": Fp8ScaledMmLinear.apply,
    "mxfp4_fakequant": Mxfp4FakeLinear.apply,
}


def try_compile(fn, name, sample_args, notes):
    """torch.compile(fn) if it compiles and runs on sample_args; else fn, with a note."""
    try:
        import torch._dynamo
        for knob in ("recompile_limit", "cache_size_limit"):  # one graph per shape: allow many
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
        cf = torch.compile(fn, dynamic=False)
        cf(*sample_args)
        return cf, "compile"
    except Exception as e:  # noqa: BLE001
        msg = f"torch.compile failed for {name} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); eager used"
        print("NOTE:", msg)
        notes.append(msg)
        return fn, "eager"


# ==========================================================================
# timing
# ==========================================================================
def cuda_median_ms(fn, samples=25, inner=1, warmup=5):
    """Median over `samples` CUDA-event timings of `inner` back-to-back calls, per call (ms)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) / inner for a, b in pairs]
    return statistics.median(times), times


def gbps_bf16(elems, ms):
    return elems * 2 / (ms * 1e-3) / 1e9 if ms else None


def tflops(m, k, n, ms):
    return 6.0 * m * k * n / (ms * 1e-3) / 1e12 if ms else None


def torch_quantize(args, notes):
    dev = DEVICE
    torch.manual_seed(0)
    x = torch.randn(Q_ROWS, Q_COLS, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    n = x.numel()
    res = {}
    ms, ts = cuda_median_ms(lambda: y.copy_(x), args.samples, inner=10)
    res["copy"] = {"how": "copy_", "ms": ms, "gbps": gbps_bf16(n, ms), "samples_ms": ts}
    print(f"torch d2d copy bf16 {Q_ROWS}x{Q_COLS}: {ms:.4f} ms, {gbps_bf16(n, ms):.0f} GB/s of bf16 input")
    for key, fn in (("mxfp4", mxfp4_quantize), ("fp8", fp8_tensorwise_e4m3)):
        f, how = try_compile(fn, f"{key} quantize", (x,), notes)
        # The compiled kernels must give the eager bits.
        got, want = f(x), fn(x)
        same = all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) if g.dtype.itemsize == 1
                   else torch.equal(g, w) for g, w in zip(got, want))
        del got, want
        ms, ts = cuda_median_ms(lambda: f(x), args.samples, inner=10)
        res[key] = {"how": how, "ms": ms, "gbps": gbps_bf16(n, ms), "samples_ms": ts, "equals_eager": same}
        print(f"torch {key} quantize ({how}) {Q_ROWS}x{Q_COLS} bf16: {ms:.4f} ms, "
              f"{gbps_bf16(n, ms):.0f} GB/s, {res['copy']['ms'] / ms:.2f}x copy; bits equal eager: {same}")
        if not same:
            notes.append(f"torch {key} quantize: compiled output differs from eager")
    del x, y
    torch.cuda.empty_cache()
    return res


def torch_linears(args, notes):
    dev = DEVICE
    res = {}
    # Compile the MXFP4 quantize-dequantize once (static shapes: one graph per shape).
    probe = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    cq, how = try_compile(mxfp4_fake, "mxfp4 fake quant", (probe,), notes)
    Mxfp4FakeLinear.q = staticmethod(cq)
    for k, n in LIN_SHAPES:
        m = LIN_M
        torch.manual_seed(0)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5).requires_grad_()
        b = (torch.randn(n, device=dev, dtype=torch.bfloat16) * 0.1).requires_grad_()
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16) * 1e-3
        for name, fn in LINEAR_PEERS.items():
            def step():
                x.grad = w.grad = b.grad = None
                torch.autograd.backward(fn(x, w, b), dy)
            try:
                ms, ts = cuda_median_ms(step, args.samples, inner=1, warmup=5)
                tf = tflops(m, k, n, ms)
                res[(name, m, k, n)] = {"ms": ms, "tflops": tf, "samples_ms": ts,
                                        "how": how if name == "mxfp4_fakequant" else "eager"}
                print(f"torch {name:<16} fwd+bwd M={m} K={k} N={n}: {ms:.3f} ms, {tf:.1f} TFLOP/s")
            except Exception as e:  # noqa: BLE001
                msg = f"torch {name} M={m} K={k} N={n} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(msg)
                notes.append(msg)
            sys.stdout.flush()
        del x, w, b, dy
        torch.cuda.empty_cache()
    return res, how


# ==========================================================================
# report
# ==========================================================================
def verdict(ratio, target, at_least=True):
    """'met', 'MISSED by f x' or 'missing'."""
    if ratio is None:
        return "missing"
    if target is None:
        return ""
    ok = ratio >= target if at_least else ratio <= target
    if ok:
        return "met"
    factor = target / ratio if at_least else ratio / target
    return f"MISSED by {factor:.2f}x"


def fmt(v, spec, width, none="missing"):
    """v formatted right-aligned in width (one leading space kept); `none` when v is None."""
    s = f"{v:{spec}}" if isinstance(v, (int, float)) else (none if v is None else str(v))
    return " " + f"{s:>{width - 1}}"


def quant_rows(mx_q, tq):
    """One row per quantize kernel; the verdict ratio is mxswitch GB/s / torch copy GB/s."""
    copy = tq.get("copy", {})
    rows = []
    for name, peer in QUANT_NAMES:
        mx = mx_q.get(name)
        t = tq.get(peer) if peer else None
        mx_ms = mx["ms"] if mx else None
        bf16_in = name.endswith("_bf16")
        mx_gbps = gbps_bf16(mx["elems"], mx_ms) if (mx and bf16_in) else (mx["gbps"] if mx else None)
        ratio = mx_gbps / copy["gbps"] if (mx_gbps and bf16_in and copy.get("gbps")) else None
        target = QUANT_TARGETS.get(name)
        rows.append({
            "kernel": name,
            "mx_elems": mx["elems"] if mx else None,
            "mx_ms": mx_ms,
            "mx_gbps": mx_gbps,
            "mx_printed_gbps": mx["gbps"] if mx else None,
            "mx_copy_ratio_own": mx["copy_ratio"] if mx else None,
            "mx_over_torch_copy": ratio,
            "torch_peer": peer,
            "torch_how": t.get("how") if t else None,
            "torch_ms": t.get("ms") if t else None,
            "torch_gbps": t.get("gbps") if t else None,
            "torch_over_copy": (t["gbps"] / copy["gbps"]) if (t and copy.get("gbps")) else None,
            "mx_over_torch": (t["ms"] / mx_ms) if (t and mx_ms) else None,
            "target": target,
            "verdict": verdict(ratio, target) if target else ("missing" if mx is None else ""),
        })
    return rows


def linear_rows(mx_l, tl):
    at_shapes = {key[0] for key in mx_l if key[1] == LIN_M and (key[2], key[3]) in LIN_SHAPES}
    recipes = [r for r in LINEAR_RECIPES if r in at_shapes]
    recipes += sorted(at_shapes - set(recipes))
    for needed in ("bf16", "fp8", "mxfp4"):
        if needed not in recipes:
            recipes.append(needed)          # shown as missing
    rows = []
    for k, n in LIN_SHAPES:
        base = tl.get(("bf16", LIN_M, k, n), {}).get("tflops")
        for r in recipes:
            mx = mx_l.get((r, LIN_M, k, n))
            mx_tf = mx["tflops"] if mx else None
            peer = TORCH_PEER_OF.get(r)
            p_tf = tl.get((peer, LIN_M, k, n), {}).get("tflops") if peer else None
            ratio = mx_tf / base if (mx_tf and base) else None
            target = LINEAR_TARGETS.get((r, k, n))
            rows.append({
                "M": LIN_M, "K": k, "N": n, "recipe": r,
                "mx_ms": mx["ms"] if mx else None, "mx_tflops": mx_tf,
                "torch_bf16_tflops": base, "mx_over_torch_bf16": ratio,
                "target": target,
                "verdict": verdict(ratio, target) if target else ("missing" if mx is None else ""),
                "torch_peer": peer, "torch_peer_tflops": p_tf,
                "mx_over_torch_peer": mx_tf / p_tf if (mx_tf and p_tf) else None,
            })
    return rows


def print_report(rep):
    W = 132
    print()
    print("=" * W)
    print(f"mxswitch vs torch {rep['torch']} on {rep['device']} (one run, {rep['date']})")
    qs = rep["quantize"]
    copy = rep["torch_quantize"].get("copy", {})
    print("-" * W)
    base = f"{copy['gbps']:.0f} GB/s ({copy['ms']:.4f} ms)" if copy.get("gbps") else "missing"
    print(f"Quantize {Q_ROWS}x{Q_COLS}, GB/s of bf16 input (elements * 2 B / time).  "
          f"Copy baseline: torch d2d copy bf16 {base}")
    print(f"{'kernel':<28}{'mx ms':>9}{'mx GB/s':>9}{'mx/copy':>9}{'(own)':>8}  {'torch peer':<17}{'t ms':>9}"
          f"{'t GB/s':>8}{'t/copy':>8}{'mx/torch':>9}{'target':>8}  verdict")
    for r in qs:
        peer = f"{r['torch_peer']} ({r['torch_how']})" if r["torch_how"] else "-"
        bf16_in = r["kernel"].endswith("_bf16")
        tgt = f">={r['target']}" if r["target"] else "-"
        print(f"{r['kernel']:<28}{fmt(r['mx_ms'], '.4f', 9)}{fmt(r['mx_gbps'], '.0f', 9)}"
              f"{fmt(r['mx_over_torch_copy'], '.2f', 9, 'missing' if bf16_in else '-')}"
              f"{fmt(r['mx_copy_ratio_own'], '.2f', 8)}  {peer:<17}"
              f"{fmt(r['torch_ms'], '.4f', 9, '-')}{fmt(r['torch_gbps'], '.0f', 8, '-')}"
              f"{fmt(r['torch_over_copy'], '.2f', 8, '-')}{fmt(r['mx_over_torch'], '.2f', 9, '-')}{tgt:>8}  {r['verdict']}")
    print("  mx/copy: mxswitch GB/s / torch's copy GB/s (the target ratio). (own): the copy_ratio mxswitch printed, "
          "against its own copy_bf16.")
    print("  mx/torch: torch ms / mxswitch ms (> 1: mxswitch faster). The _f32 rows read f32 input: their GB/s is as "
          "gpu_check printed it.")
    mxc = next((r for r in qs if r["kernel"] == "copy_bf16"), None)
    if mxc and mxc["mx_over_torch_copy"] and abs(mxc["mx_over_torch_copy"] - 1) > 0.1:
        print(f"  NOTE: mxswitch's copy_bf16 runs at {mxc['mx_over_torch_copy']:.2f}x torch's copy: the two copy "
              "baselines disagree by more than 10%.")
    print("-" * W)
    print(f"Linear fwd+bwd at M={LIN_M}, bf16 activations, with bias: TFLOP/s = 6*M*K*N / time. "
          "Target ratio: mxswitch / torch BF16 F.linear.")
    print(f"{'K x N':<12}{'recipe':<18}{'mx ms':>9}{'mx TF/s':>9}{'t bf16 TF/s':>12}{'mx/t-bf16':>10}{'target':>8}"
          f"  {'verdict':<16}{'torch peer':<16}{'peer TF/s':>10}{'mx/peer':>9}")
    for r in rep["linear"]:
        tgt = f">={r['target']}" if r["target"] else "-"
        print(f"{str(r['K']) + 'x' + str(r['N']):<12}{r['recipe']:<18}{fmt(r['mx_ms'], '.3f', 9)}"
              f"{fmt(r['mx_tflops'], '.1f', 9)}{fmt(r['torch_bf16_tflops'], '.1f', 12)}"
              f"{fmt(r['mx_over_torch_bf16'], '.2f', 10)}{tgt:>8}  {r['verdict']:<16}{r['torch_peer'] or '-':<16}"
              f"{fmt(r['torch_peer_tflops'], '.1f', 10, '-')}{fmt(r['mx_over_torch_peer'], '.2f', 9, '-')}")
    print("  torch peers (context): bf16 = F.linear; fp8_scaled_mm = E4M3 x/W, E5M2 dy, eager tensorwise quantization, "
          "3 torch._scaled_mm;")
    print("  mxfp4_fakequant = SPEC 4 mxfp4 recipe as quantize-dequantize to bf16 "
          f"({rep.get('mxfp4_fake_how', '?')}) + 3 bf16 GEMMs.")
    missing = [f"{r['recipe']} {r['K']}x{r['N']}" for r in rep["linear"] if r["mx_tflops"] is None]
    if missing:
        print("  missing mxswitch BENCH linear lines: " + ", ".join(missing))
    extra = [f"{k[0]} M={k[1]} K={k[2]} N={k[3]}: {v['tflops']} TFLOP/s" for k, v in rep["mx_linear_other"].items()]
    if extra:
        print("  other mxswitch BENCH linear lines: " + "; ".join(extra))
    print("-" * W)
    met = [r for r in rep["quantize"] + rep["linear"] if r["target"]]
    n_met = sum(r["verdict"] == "met" for r in met)
    n_missing = sum(r["verdict"] == "missing" for r in met)
    print(f"targets: {n_met} met, {len(met) - n_met - n_missing} missed, {n_missing} missing, of {len(met)}")
    for n in rep["notes"]:
        print("NOTE:", n)
    print("=" * W)


def write_json(path, rep):
    def key(k):
        return " ".join(str(p) for p in k) if isinstance(k, tuple) else k

    def clean(o):
        if isinstance(o, dict):
            return {key(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean(rep), f, indent=1)
    print(f"wrote {path}")


def build_report(mx_runs, mx_q, mx_l, tq, tl, notes, device, how):
    known = {(r, LIN_M, k, n) for r in set(k[0] for k in mx_l) for k, n in LIN_SHAPES}
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": device,
        "mx_runs": mx_runs,
        "mx_quantize": mx_q,
        "mx_linear": mx_l,
        "mx_linear_other": {k: v for k, v in mx_l.items() if k not in known},
        "torch_quantize": tq,
        "torch_linear": tl,
        "mxfp4_fake_how": how,
        "quantize": quant_rows(mx_q, tq),
        "linear": linear_rows(mx_l, tl),
        "notes": notes,
    }


# ==========================================================================
# self-test (CPU)
# ==========================================================================
def golden(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return json.load(f)


def f32_from_hex(hs):
    return torch.tensor([int(h, 16) for h in hs], dtype=torch.int64).to(torch.int32).view(torch.float32)


def self_test():
    """CPU checks: quantizers against the golden vectors, the linear peers
    against F.linear, torch.compile of the quantizers, parsing and tables."""
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("ok    " if ok else "FAIL  ") + what)
        fails += 0 if ok else 1

    # 1. MXFP4 EVEN against mxfp4_blocks.json: scale bytes, codes, packed bytes, dequantized values.
    blocks = golden("mxfp4_blocks.json")["blocks"]
    x = torch.stack([f32_from_hex(b["input_f32_bits"]) for b in blocks])            # [13, 32]
    packed, scales = mxfp4_quantize(x)
    fake = mxfp4_fake(x.nan_to_num()).float()
    for i, b in enumerate(blocks):
        e = b["even"]
        ok = int(scales[i, 0]) == int(e["scale_e8m0"])
        if e["packed_bytes_hex"] not in (None, "None"):
            want = torch.tensor([int(h, 16) for h in e["packed_bytes_hex"]], dtype=torch.uint8)
            ok &= torch.equal(packed[i], want)
        else:
            ok &= bool((packed[i] == 0).all())                           # SPEC: codes 0 in a NaN block
        check(ok, f"mxfp4_quantize golden block {b['name']}: scale byte {int(scales[i, 0])}")
        if isinstance(e["scale_e8m0"], int) and e["scale_e8m0"] <= 252 and torch.isfinite(x[i]).all():
            want = torch.tensor([float(v) for v in e["dequantized"]], dtype=torch.float32)
            # mxfp4_fake returns bf16: compare to the golden values rounded to bf16.
            check(torch.equal(fake[i], want.to(torch.bfloat16).float()),
                  f"mxfp4_fake  golden block {b['name']}: dequantized values")

    # 2. FP8 tensorwise against fp8_tensorwise_scales.json: codes of the example tensor, and scales.
    g = golden("fp8_tensorwise_scales.json")
    ex = g["example_tensor_torchao"]
    xt = f32_from_hex(ex["input_f32_bits"])
    for key, dt in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        codes, inv = fp8_tensorwise(xt, dt)
        want = torch.tensor([int(h, 16) for h in ex[key]["codes"]], dtype=torch.uint8)
        want_inv = f32_from_hex([ex[key]["inverse_scale_f32_bits"]])[0]
        check(torch.equal(codes.view(torch.uint8), want) and inv.item() == want_inv.item(),
              f"fp8_tensorwise {key}: example tensor codes and scale_inv")
    bad = 0
    for s in g["scales"]:
        a = f32_from_hex([s["amax_f32_bits"]])[0]
        if not torch.isfinite(a):
            continue
        for key, dt in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
            _, inv = fp8_tensorwise(torch.stack([a, -a]), dt)
            want = f32_from_hex([s[key]["torchao"]["scale_f32_bits"]])[0]
            bad += int(inv.item() != (1.0 / want).item())
    check(bad == 0, f"fp8_tensorwise scales vs golden torchao column ({bad} mismatches)")

    # 3. Hadamard butterfly vs (1/4) H16.
    h = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=torch.float64)
    r = torch.randn(64, 16)
    err = (hadamard16(r).double() - r.double() @ h.t() / 4).abs().max().item()
    check(err < 1e-5, f"hadamard16 vs matrix (max error {err:.1e})")

    # 4. Packed MXFP4 and the fake quantizer agree on random bf16 data; tiles and Hadamard run.
    torch.manual_seed(0)
    xb = (torch.randn(64, 256) * torch.exp2(torch.randint(-8, 8, (64, 1)).float())).to(torch.bfloat16)
    p, s = mxfp4_quantize(xb)
    codes = torch.stack((p & 0xF, p >> 4), -1).reshape(64, 256).long()
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    deq = lut[codes] * torch.exp2(s.float() - 127).repeat_interleave(32, 1)
    check(torch.equal(deq.to(torch.bfloat16), mxfp4_fake(xb)), "mxfp4_quantize (decoded) == mxfp4_fake on random bf16")
    check(mxfp4_fake(xb, True, True).shape == xb.shape, "mxfp4_fake with Hadamard and 32x32 tiles runs")

    # 5. Linear peers on the CPU against F.linear (bf16, small shapes).
    m, k, n = 128, 256, 96
    x = torch.randn(m, k, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(n, k) / k ** 0.5).to(torch.bfloat16).requires_grad_()
    b = (torch.randn(n) * 0.1).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(m, n, dtype=torch.bfloat16)
    ref_y = F.linear(x.float(), w.float(), b.float())
    ref = torch.autograd.grad(ref_y, (x, w, b), dy.float())
    for name, fn in LINEAR_PEERS.items():
        try:
            y = fn(x, w, b)
            grads = torch.autograd.grad(y, (x, w, b), dy)
            rel = [((g.float() - r).norm() / r.norm()).item() for g, r in zip((y,) + grads, (ref_y,) + ref)]
            tol = {"bf16": 0.01, "fp8_scaled_mm": 0.1, "mxfp4_fakequant": 0.25}[name]
            check(all(v < tol for v in rel) and all(g.dtype == torch.bfloat16 for g in grads),
                  f"linear peer {name}: relative error y/dx/dw/db " + " ".join(f"{v:.3f}" for v in rel)
                  + f" (< {tol})")
        except Exception as e:  # noqa: BLE001
            check(False, f"linear peer {name}: {type(e).__name__}: {e}")

    # 6. torch.compile of the quantizers on the CPU (falls back to eager with a note).
    notes = []
    for name, fn, a in (("mxfp4_quantize", mxfp4_quantize, (xb,)), ("fp8_tensorwise_e4m3", fp8_tensorwise_e4m3, (xb,)),
                        ("mxfp4_fake", mxfp4_fake, (xb,))):
        t0 = time.time()
        cf, how = try_compile(fn, name, a, notes)
        got, want = cf(*a), fn(*a)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        same = all(torch.equal(u.view(torch.uint8), v.view(torch.uint8)) if u.dtype.itemsize == 1 else torch.equal(u, v)
                   for u, v in zip(got, want))
        check(same, f"{name} via {how} ({time.time() - t0:.0f} s) gives the eager bits")

    # 7. Parsing and the tables, with made-up lines (one line missing on purpose).
    fake_out = "\n".join([
        "device: test",
        "BENCH quantize copy_bf16 elems=67108864 ms=0.0700 gbps=1917.4 copy_ratio=1.00",
        "BENCH quantize mxfp4_1x32_even_bf16 elems=67108864 ms=0.0800 gbps=1677.7 copy_ratio=0.88",
        "BENCH quantize fp8_tensorwise_e4m3_f32 elems=67108864 ms=0.2000 gbps=1342.2 copy_ratio=0.35",
        "BENCH linear bf16 M=16384 K=3072 N=12288 ms=5.000 tflops=741.9",
        "BENCH linear fp8 M=16384 K=3072 N=12288 ms=3.500 tflops=1059.9 idle_ms=3.9000",
        "BENCH linear mxfp4 M=16384 K=3072 N=3072 ms=2.000 tflops=463.8",
        "BENCH linear mxfp4(sr = true) M=4096 K=3072 N=3072 ms=1.000 tflops=100.0",
    ])
    mq, ml = parse_quant(fake_out), parse_linear(fake_out)
    check(len(mq) == 3 and len(ml) == 4 and ("mxfp4(sr = true)", 4096, 3072, 3072) in ml
          and ml[("fp8", 16384, 3072, 12288)]["idle_ms"] == 3.9 and ml[("bf16", 16384, 3072, 12288)]["idle_ms"] is None,
          "BENCH line parsing")
    tq = {"copy": {"ms": 0.07, "gbps": gbps_bf16(Q_ROWS * Q_COLS, 0.07), "how": "copy_"},
          "mxfp4": {"ms": 0.1, "gbps": gbps_bf16(Q_ROWS * Q_COLS, 0.1), "how": "compile"},
          "fp8": {"ms": 0.1, "gbps": gbps_bf16(Q_ROWS * Q_COLS, 0.1), "how": "eager"}}
    tl = {(p, LIN_M, k, n): {"ms": 5.0, "tflops": tflops(LIN_M, k, n, 5.0)} for p in LINEAR_PEERS for k, n in LIN_SHAPES}
    rep = build_report({}, mq, ml, tq, tl, ["SELF-TEST: made-up numbers, this checks the table code only"],
                       "no device (self-test)", "compile")
    print_report(rep)
    v = {r["kernel"]: r["verdict"] for r in rep["quantize"]}
    check(v["mxfp4_1x32_even_bf16"] == "MISSED by 1.14x" and v["fp8_tensorwise_e4m3_bf16"] == "missing",
          f"quantize verdicts ({v['mxfp4_1x32_even_bf16']}, {v['fp8_tensorwise_e4m3_bf16']})")
    lv = {(r["recipe"], r["K"], r["N"]): r["verdict"] for r in rep["linear"]}
    check(lv[("fp8", 3072, 12288)] == "met" and lv[("fp8", 3072, 3072)] == "missing"
          and lv[("mxfp4", 3072, 3072)] == "met", "linear verdicts")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gpu_peer_selftest.json")
    write_json(path, rep)
    json.load(open(path))

    print("SELF-TEST " + ("OK" if fails == 0 else f"{fails} FAILURES"))
    return 1 if fails else 0


# ==========================================================================
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=".devbin", help="folder with gpu_check")
    ap.add_argument("--json", default=None, help="write all results here (default $OUT/gpu_peer.json if OUT is set)")
    ap.add_argument("--samples", type=int, default=25, help="timed samples per torch measurement (median; >= 20)")
    ap.add_argument("--bin-timeout", type=int, default=300, help="seconds per mxswitch run")
    ap.add_argument("--mx-output", default=None,
                    help="read the mxswitch BENCH lines from this file instead of running the binaries")
    ap.add_argument("--skip-torch-linears", action="store_true")
    ap.add_argument("--self-test", action="store_true", help="CPU checks only (no GPU needed)")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(self_test())
    if args.json is None and os.environ.get("OUT"):
        args.json = os.path.join(os.environ["OUT"], "gpu_peer.json")
    if not torch.cuda.is_available():
        sys.exit(f"CUDA is not available to torch {torch.__version__} here: the GPU benchmark needs an NVIDIA GPU "
                 "(run `python bench/gpu_peer.py --self-test` for the CPU checks).")
    args.samples = max(args.samples, 20)

    # mxswitch first, before torch allocates anything on the GPU.
    mx_runs = {}
    if args.mx_output:
        text = open(args.mx_output).read()
        mx_runs["file"] = {"cmd": args.mx_output, "rc": 0, "seconds": 0, "output": text}
    else:
        for name, extra in (("gpu_check", ["bench", "quantize", "linear-large"]),):
            res = run_bin(os.path.join(args.bin, name), extra, args.bin_timeout)
            show_run(name, res)
            mx_runs[name] = res
        text = "\n".join(r["output"] for r in mx_runs.values())
    mx_q, mx_l = parse_quant(text), parse_linear(text)
    notes = [f"{name} ended with rc={r['rc']} (its BENCH lines, if any, are still used)"
             for name, r in mx_runs.items() if r["rc"] != 0]

    device = torch.cuda.get_device_name()
    print(f"===== torch {torch.__version__} on {device}")
    tq = torch_quantize(args, notes)
    how = "-"
    tl = {}
    if not args.skip_torch_linears:
        tl, how = torch_linears(args, notes)
    rep = build_report(mx_runs, mx_q, mx_l, tq, tl, notes, device, how)
    print_report(rep)
    if args.json:
        write_json(args.json, rep)


if __name__ == "__main__":
    main()
