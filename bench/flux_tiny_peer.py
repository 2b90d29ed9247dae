#!/usr/bin/env python3
"""PyTorch CPU peer of `mxswitch train --config flux-tiny`.

Trains the same flux-tiny model, from the same initial weights (read from the
checkpoint that `mxswitch train --iters 0` writes), on the same seeded
synthetic batches (SplitMix64 + Box-Muller reproduced bit-exactly), with the
same precision schedule (mxfp4 for iterations < switch, fp8 after), in PyTorch
eager on the CPU. Every quantized linear is a torch.autograd.Function whose
three GEMMs take operands quantized and dequantized exactly as the Rust recipe
does (fake quantization in f32; SPEC sections 2-4). It then prints the median
step time of each phase for both runs, the ratio PyTorch / mxswitch, and how
closely the two loss curves agree.

    python3 bench/flux_tiny_peer.py [--mxswitch ./target/release/mxswitch] [--iters 80]

The Rust sources this mirrors: models/src/flux/{model,data}.rs,
models/configs/flux-tiny.ron, src/train/mod.rs, runtime/recipes/src/*.rs, runtime/src/qlinear/,
runtime/src/quant/*.rs, runtime/src/formats.rs, runtime/src/module.rs.
"""

import argparse
import ctypes
import ctypes.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux_torch  # noqa: E402  (the model, shared with flux_small_peer.py)

# --------------------------------------------------------------------------
# flux-tiny (models/configs/flux-tiny.ron)
# --------------------------------------------------------------------------
CFG = dict(
    in_channels=64, vec_in_dim=32, context_in_dim=64, hidden_size=64,
    mlp_ratio=4.0, num_heads=4, depth=2, depth_single_blocks=2,
    axes_dim=(4, 6, 6), theta=10000.0,
    latent_channels=16, latent_height=8, latent_width=8, txt_tokens=8, batch=4,
    iters=80, lr=1e-3, switch_at=40,
)
EPS = flux_torch.EPS            # LayerNorm and QK RMSNorm
TIME_DIM = flux_torch.TIME_DIM  # timestep embedding width
CLIP_NORM = 1.0

# --------------------------------------------------------------------------
# Seeded synthetic data (models/src/flux/data.rs), bit-exact
# --------------------------------------------------------------------------
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
CLASSES = 8
PATTERN_SCALE = np.float32(1.5)
SAMPLE_NOISE = np.float32(0.05)
TAU32 = np.float32(math.tau)  # std::f32::consts::TAU

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.sinf.restype = ctypes.c_float
_libm.sinf.argtypes = [ctypes.c_float]


def _mix(z):
    """SplitMix64 output function on a numpy uint64 array (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SplitMix64:
    """runtime/src/module.rs SplitMix64; `take(n)` draws n outputs at once."""

    def __init__(self, seed):
        self.state = seed & M64

    def take(self, n):
        ks = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = _mix(np.uint64(self.state) + ks * np.uint64(GAMMA))
        self.state = (self.state + n * GAMMA) & M64
        return z

    def next_u64(self):
        return int(self.take(1)[0])

    def next_f64(self, n=None):
        z = self.take(1 if n is None else n)
        u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        return float(u[0]) if n is None else u

    def normal(self, n):
        """n standard normals as f32, Box-Muller in f64 with libm (as Rust)."""
        u = self.next_f64(2 * n)
        log, sqrt, cos, two_pi = math.log, math.sqrt, math.cos, 2.0 * math.pi
        out = [sqrt(-2.0 * log(u[2 * i])) * cos(two_pi * u[2 * i + 1]) for i in range(n)]
        return np.asarray(out, dtype=np.float64).astype(np.float32)

    def normal_pairs(self, n):
        """n interleaved draws as `x0 noise` does: returns (first, second) of each pair of normals."""
        u = self.next_f64(4 * n).reshape(n, 2, 2)
        log, sqrt, cos, two_pi = math.log, math.sqrt, math.cos, 2.0 * math.pi
        flat = u.reshape(-1, 2).tolist()
        vals = [sqrt(-2.0 * log(a)) * cos(two_pi * b) for a, b in flat]
        v = np.asarray(vals, dtype=np.float64).astype(np.float32).reshape(n, 2)
        return v[:, 0], v[:, 1]


def patchify(x, c, h, w):
    """[C, H, W] -> [(H/2)(W/2), 4C], channels ordered (c, ph, pw)."""
    return x.reshape(c, h // 2, 2, w // 2, 2).transpose(1, 3, 0, 2, 4).reshape((h // 2) * (w // 2), 4 * c)


class SyntheticData:
    def __init__(self, seed):
        c, h, w = CFG["latent_channels"], CFG["latent_height"], CFG["latent_width"]
        self.seed = seed
        rng = SplitMix64(seed ^ 0xDA7A)
        yy = np.repeat(np.arange(h, dtype=np.float32), w)
        xx = np.tile(np.arange(w, dtype=np.float32), h)
        self.patterns = []
        for _ in range(CLASSES):
            p = []
            for _ in range(c):
                level = rng.normal(1)[0] * PATTERN_SCALE
                fy = np.float32(rng.next_f64())
                fx = np.float32(rng.next_f64())
                phase = np.float32(rng.next_f64()) * TAU32
                # f32 ops in Rust's order; no FMA contraction in Rust.
                arg = TAU32 * (fy * yy / np.float32(h) + fx * xx / np.float32(w)) + phase
                s = np.array([_libm.sinf(float(a)) for a in arg], dtype=np.float32)
                p.append(level + np.float32(0.5) * s)
            self.patterns.append(np.concatenate(p).astype(np.float32))
        self.texts = [rng.normal(CFG["txt_tokens"] * CFG["context_in_dim"]) for _ in range(CLASSES)]
        self.vectors = [rng.normal(CFG["vec_in_dim"]) for _ in range(CLASSES)]

    def batch(self, step):
        c, h, w = CFG["latent_channels"], CFG["latent_height"], CFG["latent_width"]
        s = (((self.seed * 0x9E3779B9) & M64) + step) & M64
        rng = SplitMix64((s * 0xD1342543DE82EF95) & M64)
        xt, tgt, txt, y, ts = [], [], [], [], []
        for _ in range(CFG["batch"]):
            cls = rng.next_u64() % CLASSES
            t = np.float32(rng.next_f64())
            p = self.patterns[cls]
            n1, noise = rng.normal_pairs(p.size)
            x0 = p + SAMPLE_NOISE * n1
            x_t = (np.float32(1.0) - t) * x0 + t * noise
            v = noise - x0
            xt.append(patchify(x_t, c, h, w))
            tgt.append(patchify(v, c, h, w))
            txt.append(self.texts[cls].reshape(CFG["txt_tokens"], CFG["context_in_dim"]))
            y.append(self.vectors[cls])
            ts.append(t)
        return dict(
            img=torch.from_numpy(np.stack(xt)),
            target=torch.from_numpy(np.stack(tgt)),
            txt=torch.from_numpy(np.stack(txt)),
            y=torch.from_numpy(np.stack(y)),
            temb=torch.from_numpy(timestep_embedding(ts, TIME_DIM)),
            timesteps=ts,
        )


def timestep_embedding(ts, dim):
    """cos-first sinusoidal embedding of t * 1000, computed in f64 as the Rust does."""
    half = dim // 2
    ln = math.log(10000.0)
    freqs = [math.exp(-ln * i / half) for i in range(half)]
    out = []
    for t in ts:
        args = [(float(t) * 1000.0) * f for f in freqs]
        out.append([math.cos(a) for a in args] + [math.sin(a) for a in args])
    return np.asarray(out, dtype=np.float64).astype(np.float32)


def rope_tables(txt_tokens, ph, pw):
    """[L, D/2] cos and sin; text at (0,0,0), patch (r, c) at (0, r, c)."""
    return flux_torch.rope_tables(CFG, txt_tokens, ph, pw)


# --------------------------------------------------------------------------
# Quantizers (runtime/src/formats.rs, runtime/src/quant/*.rs), fake quant in f32
# --------------------------------------------------------------------------
def _below(v):
    return float(np.nextafter(np.float32(v), np.float32(-np.inf)))


# E2M1 values (the -0 code merged with +0) and the RNE decision points for
# torch.bucketize(right=False), which sends a value equal to a boundary to the
# lower bucket: a tie that RNE resolves upwards gets the boundary just below.
E2M1_GRID = torch.tensor([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32)
E2M1_BOUNDS = torch.tensor(
    [_below(-5.0), -3.5, _below(-2.5), -1.75, _below(-1.25), -0.75, _below(-0.25),
     0.25, _below(0.75), 1.25, _below(1.75), 2.5, _below(3.5), 5.0],
    dtype=torch.float32,
)
E2M1_EMAX = 2          # emax_elem of E2M1
E2M1_MBITS = 1
BLOCK = 32


def e2m1_round(q):
    """satfinite RNE of f32 values to E2M1, returned as the E2M1 values.

    Two exact formulations (bench/check_quantizers.py checks both against a
    port of formats.rs): a table lookup, cheaper on small tensors, and the
    magic-number rounding (q + M) - M with M = +-2^(max(e, 0) + 22), whose f32
    ulp is the E2M1 spacing at q's binade, cheaper on large ones."""
    if q.numel() <= 8192:
        return E2M1_GRID[torch.bucketize(q, E2M1_BOUNDS)]
    return e2m1_round_magic(q)


def e2m1_round_magic(q):
    qc = q.clamp(-6.0, 6.0)
    bits = qc.view(torch.int32)
    m = (((bits >> 23) & 0xFF).clamp_(min=127) + 22) << 23
    m = (m | (bits & -0x80000000)).view(torch.float32)
    return (qc + m) - m


def even_scale_byte(amax):
    """EVEN rule: round the amax significand to the element's mantissa, then FLOOR."""
    bits = amax.view(torch.int32)
    field = ((bits + (1 << (23 - E2M1_MBITS - 1))) >> 23) & 0xFF
    return (field - E2M1_EMAX).clamp_(min=0)  # clamp(e - emax, -127, 128) + 127


def hadamard16(x):
    """(1/4) H16 on each group of 16 along the last axis, as the f32 butterfly."""
    shape = x.shape
    g = x.reshape(-1, 16)
    for h in (1, 2, 4, 8):
        g = g.reshape(-1, 16 // (2 * h), 2, h)
        a, b = g[:, :, 0, :], g[:, :, 1, :]
        g = torch.stack((a + b, a - b), dim=2)
    return g.reshape(shape) * 0.25


def mx_rows(x, hadamard=False, tile2d=False):
    """MXFP4 (E2M1, 1x32 EVEN) of each row of x [R, L] along L, dequantized.

    Returns [R, Lp] with L zero-padded to a multiple of 32 (rotated domain when
    hadamard): the GEMM operand of runtime/src/quant/mx.rs quantize_rows +
    dequantize_rows. tile2d: one scale per 32x32 tile (amax over the tile)."""
    r, l = x.shape
    lp = -(-l // BLOCK) * BLOCK
    if lp != l:
        x = F.pad(x, (0, lp - l))
    if hadamard:
        x = hadamard16(x)
    nb = lp // BLOCK
    if tile2d:
        rp = -(-r // BLOCK) * BLOCK
        xt = F.pad(x, (0, 0, 0, rp - r)) if rp != r else x
        amax = xt.reshape(rp // BLOCK, BLOCK, nb, BLOCK).abs().amax(dim=(1, 3))  # [rp/32, nb]
        byte = even_scale_byte(amax)
        recip = ((254 - byte) << 23).view(torch.float32)            # 2^(127 - byte)
        recip = recip.repeat_interleave(BLOCK, 0)[:r].unsqueeze(-1)  # [r, nb, 1]
    else:
        blocks = x.reshape(r, nb, BLOCK)
        byte = even_scale_byte(blocks.abs().amax(-1))
        recip = ((254 - byte) << 23).view(torch.float32).unsqueeze(-1)
    q = x.reshape(r, nb, BLOCK) * recip
    # decode(code) * 2^(byte - 127); 1/recip is exact (bytes here are <= 252).
    return (e2m1_round(q) * (1.0 / recip)).reshape(r, lp)


FP8 = {
    "e4m3": (448.0, torch.float8_e4m3fn),
    "e5m2": (57344.0, torch.float8_e5m2),
}


def fp8_tensorwise(x, fmt):
    """Tensorwise FP8 (SPEC 3): returns (decoded codes as f32, scale_inv 0-d f32)."""
    fmax, dtype = FP8[fmt]
    amax = x.abs().amax()
    scale = (fmax / amax.double().clamp_min(1e-12)).float()  # f64 quotient rounded once
    codes = (x * scale).clamp_(-fmax, fmax).to(dtype).to(torch.float32)
    return codes, 1.0 / scale


# --------------------------------------------------------------------------
# Quantized linears (runtime/src/qlinear/ with runtime/src/cpu/operand.rs)
# --------------------------------------------------------------------------
class Mxfp4Linear(torch.autograd.Function):
    """mxfp4: fprop x 1x32 along K, W 32x32 tiles; dgrad dy along N, W tiles
    along N; wgrad dy and x along M with Hadamard-16. f32 GEMMs of the
    dequantized operands, bias added after, db = column sums of dy."""

    @staticmethod
    def forward(ctx, x, w, b):
        k, n = w.shape[1], w.shape[0]
        x2 = x.reshape(-1, k)
        xq = mx_rows(x2)[:, :k]
        # A 32x32 tile scale does not depend on the axis, so W tiled along K
        # and W tiled along N (what Rust saves for dgrad) dequantize alike.
        wq = mx_rows(w, tile2d=True)[:, :k]
        y = xq @ wq.t()
        if b is not None:
            y = y + b
        x_m = mx_rows(x2.t(), hadamard=True)           # [K, Mp], saved
        ctx.save_for_backward(x_m, wq)
        ctx.has_bias = b is not None
        ctx.x_shape = x.shape
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, dy):
        x_m, wq = ctx.saved_tensors
        n = wq.shape[0]
        dy2 = dy.reshape(-1, n)
        dy_n = mx_rows(dy2)[:, :n]
        dx = dy_n @ wq
        dy_m = mx_rows(dy2.t(), hadamard=True)          # [N, Mp]
        dw = dy_m @ x_m.t()
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dw, db


class Fp8Linear(torch.autograd.Function):
    """fp8: x, W E4M3 tensorwise; dy E5M2 tensorwise; GEMM of the decoded codes
    times the product of the scale_invs; bias after."""

    @staticmethod
    def forward(ctx, x, w, b):
        k, n = w.shape[1], w.shape[0]
        x2 = x.reshape(-1, k)
        xc, xi = fp8_tensorwise(x2, "e4m3")
        wc, wi = fp8_tensorwise(w, "e4m3")
        y = (xc @ wc.t()) * (xi * wi)
        if b is not None:
            y = y + b
        ctx.save_for_backward(xc, xi, wc, wi)
        ctx.has_bias = b is not None
        ctx.x_shape = x.shape
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, dy):
        xc, xi, wc, wi = ctx.saved_tensors
        n = wc.shape[0]
        dy2 = dy.reshape(-1, n)
        dc, di = fp8_tensorwise(dy2, "e5m2")
        dx = (dc @ wc) * (di * wi)
        dw = (dc.t() @ xc) * (di * xi)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dw, db


RECIPES = {"mxfp4": Mxfp4Linear, "fp8": Fp8Linear}

# --------------------------------------------------------------------------
# Flux (models/src/flux/model.rs), functional over a name -> Parameter dict
# --------------------------------------------------------------------------


class FluxTiny(flux_torch.Flux):
    """flux_torch.Flux with the block linears quantized by `self.recipe`."""

    def __init__(self, params):
        super().__init__(params, CFG)
        self.recipe = "mxfp4"

    def qlin(self, x, name):
        return RECIPES[self.recipe].apply(x, self.p[name + ".weight"], self.p.get(name + ".bias"))


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------
def run_mxswitch(binary, out, seed, iters, switch_at, resume=None):
    cmd = [binary, "train", "--config", "flux-tiny", "--out", out, "--seed", str(seed),
           "--iters", str(iters), "--switch-at", str(switch_at)] + (["--resume", resume] if resume else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    return metrics, r.stdout


def perturbed_checkpoint(src, dst, frac=0.01):
    """src with 1% of every parameter's elements moved up by one f32 ulp (seeded)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(src, "pt") as f:
        meta = f.metadata()
    t = load_file(src)
    g = torch.Generator().manual_seed(0)
    for k, v in t.items():
        mask = torch.rand(v.shape, generator=g) < frac
        t[k] = torch.where(mask, torch.nextafter(v, torch.full_like(v, math.inf)), v).contiguous()
    save_file(t, dst, metadata=meta)


def load_params(ckpt):
    return {k[len("param."):]: torch.nn.Parameter(v.float().contiguous())
            for k, v in load_file(ckpt).items() if k.startswith("param.")}


def train_torch(params, batches, switch_at, foreach=True, start=0, adam_state=None):
    """Train iterations start..len(batches)-1; adam_state: name -> (steps, m, v)."""
    model = FluxTiny(params)
    plist = list(params.values())
    # foreach=True (multi-tensor AdamW) is the faster eager option on the CPU,
    # where torch's default is the per-parameter loop: the stronger baseline.
    opt = torch.optim.AdamW(plist, lr=CFG["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=foreach)
    for name, (steps, m, v) in (adam_state or {}).items():
        opt.state[params[name]] = {"step": torch.tensor(float(steps)), "exp_avg": m.clone(),
                                   "exp_avg_sq": v.clone()}
    pe = rope_tables(CFG["txt_tokens"], CFG["latent_height"] // 2, CFG["latent_width"] // 2)

    def step(it, update=True):
        b = batches[it]
        model.recipe = "mxfp4" if it < switch_at else "fp8"
        pred = model.forward(b, pe)
        loss = (pred - b["target"]).pow(2).mean()
        lv = loss.item()
        if not math.isfinite(lv):
            sys.exit(f"PyTorch loss is {lv} at iteration {it}: training diverged")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, CLIP_NORM)
        if update:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return lv

    # Warm-up as mxswitch does: one grad-enabled step per recipe, no update.
    # (Gradients only: parameters and optimizer state are untouched.)
    for it in sorted({start, max(start, switch_at)} & set(range(start, len(batches)))):
        step(it, update=False)
    losses, times = [], []
    for it in range(start, len(batches)):
        t0 = time.perf_counter()
        lv = step(it)
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(lv)
    return losses, times


def load_adam_state(ckpt):
    """name -> (steps, m, v) from an mxswitch checkpoint."""
    from safetensors import safe_open
    with safe_open(ckpt, "pt") as f:
        steps = json.loads(f.metadata().get("adamw.steps", "{}"))
    t = load_file(ckpt)
    return {k: (n, t[f"adamw.m.{k}"].float(), t[f"adamw.v.{k}"].float()) for k, n in steps.items()}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mxswitch", default="./target/release/mxswitch", help="path of the mxswitch binary")
    ap.add_argument("--iters", type=int, default=CFG["iters"])
    ap.add_argument("--switch-at", type=int, default=CFG["switch_at"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--check-steps", type=int, default=3,
                    help="also compare every parameter after this many steps against mxswitch's checkpoint (0: off)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="run both trainings this many times, alternating, and pool the step times (the losses "
                         "are deterministic and taken from the first run)")
    ap.add_argument("--resume-at", type=int, default=None,
                    help="also continue both from mxswitch's checkpoint at this iteration (weights and AdamW "
                         "moments) and compare the losses from there: checks the later phase at trained weights "
                         "(default: the switch iteration; 0: off)")
    ap.add_argument("--no-noise-floor", action="store_true",
                    help="skip the mxswitch-vs-mxswitch run from weights perturbed by one ulp")
    ap.add_argument("--no-foreach", action="store_true", help="torch's default per-parameter AdamW loop")
    ap.add_argument("--workdir", default=None, help="keep the mxswitch outputs here (default: a temp dir)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    binary = os.path.abspath(args.mxswitch)
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} is not an executable: build it with `cargo build --release` or pass --mxswitch")
    work = args.workdir or tempfile.mkdtemp(prefix="flux_tiny_peer_")
    os.makedirs(work, exist_ok=True)
    # Run a private copy, so a rebuild of target/ during the benchmark cannot mix binaries.
    shutil.copy2(binary, os.path.join(work, "mxswitch"))
    binary = os.path.join(work, "mxswitch")
    sw = args.switch_at
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; mxswitch {os.path.abspath(args.mxswitch)}")
    print(f"flux-tiny: batch {CFG['batch']}, {args.iters} iterations, mxfp4 for iterations < {sw}, fp8 after; seed {args.seed}")

    # Initial weights: the checkpoint of --iters 0 (after mxswitch's warm-up restored everything).
    init_dir = os.path.join(work, "init")
    run_mxswitch(binary, init_dir, args.seed, 0, sw)
    init_ckpt = os.path.join(init_dir, "checkpoint.safetensors")

    t0 = time.perf_counter()
    data = SyntheticData(args.seed)
    batches = [data.batch(i) for i in range(args.iters)]
    print(f"built {args.iters} batches in Python in {time.perf_counter() - t0:.1f} s (outside the timed steps)")

    if args.check_steps > 0:
        n = min(args.check_steps, args.iters)
        chk_dir = os.path.join(work, f"check{n}")
        run_mxswitch(binary, chk_dir, args.seed, n, sw)
        ref = {k[len("param."):]: v for k, v in load_file(os.path.join(chk_dir, "checkpoint.safetensors")).items()
               if k.startswith("param.")}
        params = load_params(init_ckpt)
        train_torch(params, batches[:n], sw, foreach=not args.no_foreach)
        init = load_params(init_ckpt)
        rows = []
        for k in ref:
            moved = (ref[k] - init[k].detach()).norm().item()
            diff = (params[k].detach() - ref[k]).norm().item()
            rows.append((diff / moved if moved > 0 else diff, diff, moved, k))
        worst = max(rows)
        print(f"parameter check after {n} steps, all {len(rows)} parameters: worst |torch - mxswitch| / "
              f"|mxswitch - initial| = {worst[0]:.2e} ({worst[3]}), median {median([r[0] for r in rows]):.2e}")

    resume_at = sw if args.resume_at is None else args.resume_at
    if 0 < resume_at < args.iters:
        a_dir = os.path.join(work, f"upto{resume_at}")
        run_mxswitch(binary, a_dir, args.seed, resume_at, sw)
        ckpt = os.path.join(a_dir, "checkpoint.safetensors")
        rm, _ = run_mxswitch(binary, os.path.join(work, f"resumed{resume_at}"), args.seed, args.iters, sw, resume=ckpt)
        rl, _ = train_torch(load_params(ckpt), batches, sw, foreach=not args.no_foreach, start=resume_at,
                            adam_state=load_adam_state(ckpt))
        d = [abs(m["loss"] - x) for m, x in zip(rm, rl)]
        print(f"resumed both from mxswitch's checkpoint at iteration {resume_at} (weights and AdamW moments; "
              f"{rm[0]['recipe']} from there): |diff| of the first loss {d[0]:.2e}; then per step "
              + " ".join(f"{v:.0e}" for v in d[1:6]) + f" ...; max over {len(d)} steps {max(d):.2e}")

    mx_time, pt_time = [[] for _ in range(args.iters)], [[] for _ in range(args.iters)]
    phases = [("mxfp4", range(0, min(sw, args.iters))), ("fp8", range(sw, args.iters))]
    print(f"{args.repeats} alternating run(s) of each; step times are per phase ({'/'.join(n for n, r in phases if len(r))})")
    for r in range(args.repeats):
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        # (a) mxswitch
        mx_metrics, mx_out = run_mxswitch(binary, os.path.join(work, f"mxswitch{r}"), args.seed, args.iters, sw)
        if r == 0:
            for line in mx_out.splitlines():
                print(f"  mxswitch: {line}")
            mx_loss = [m["loss"] for m in mx_metrics]
            recipes = [m["recipe"] for m in mx_metrics]
        # (b) PyTorch
        params = load_params(init_ckpt)
        losses, times = train_torch(params, batches, sw, foreach=not args.no_foreach)
        if r == 0:
            pt_loss = losses
        for i in range(args.iters):
            mx_time[i].append(mx_metrics[i]["step_time_ms"])
            pt_time[i].append(times[i])
        ph = lambda ts: "/".join(f"{median([ts[i] for i in rng]):.1f}" for _, rng in phases if len(rng))
        print(f"  run {r + 1}/{args.repeats} (load average before: {load}): median step ms per phase "
              f"mxswitch {ph([m['step_time_ms'] for m in mx_metrics])}, torch {ph(times)}; "
              f"final loss mxswitch {mx_metrics[-1]['loss']:.5f} torch {losses[-1]:.5f}", flush=True)

    floor = None
    if not args.no_noise_floor:
        # How far mxswitch's own loss curve moves when 1% of the initial weights
        # move by one f32 ulp: the scale of divergence that rounding-order
        # differences alone produce through the quantizers' discontinuities.
        pert = os.path.join(work, "perturbed_init.safetensors")
        perturbed_checkpoint(init_ckpt, pert)
        pm, _ = run_mxswitch(binary, os.path.join(work, "mxswitch_perturbed"), args.seed, args.iters, sw, resume=pert)
        floor = [abs(a["loss"] - b) for a, b in zip(pm, mx_loss)]

    print()
    print(f"median step time per phase: the lowest of the {args.repeats} runs' medians for each side "
          f"(other work on the cores only ever slows a run down)")
    print(f"{'phase':<7}{'iters':>9}{'mxswitch ms':>14}{'torch ms':>11}{'torch/mxswitch':>17}  target >= 2x")
    for name, rng in phases:
        if len(rng) == 0:
            continue
        assert all(recipes[i] == name for i in rng), f"mxswitch ran {set(recipes[i] for i in rng)} in the {name} phase"
        a = min(median([mx_time[i][r] for i in rng]) for r in range(args.repeats))
        b = min(median([pt_time[i][r] for i in rng]) for r in range(args.repeats))
        verdict = "met" if b / a >= 2.0 else "NOT met"
        print(f"{name:<7}{f'{rng.start}-{rng.stop - 1}':>9}{a:>14.2f}{b:>11.2f}{b / a:>16.2f}x  {verdict}")

    diff = [abs(x - y) for x, y in zip(mx_loss, pt_loss)]
    rel = [d / abs(x) for d, x in zip(diff, mx_loss)]
    k = min(5, len(diff))
    mean = lambda v: sum(v) / len(v)
    print()
    print(f"loss agreement over {len(diff)} steps: max |diff| {max(diff):.4g} (iteration {diff.index(max(diff))}), "
          f"mean |diff| {mean(diff):.4g}, max relative {max(rel):.3g}")
    print(f"  step 0 loss: mxswitch {mx_loss[0]:.7f}  torch {pt_loss[0]:.7f}")
    for name, lo in (("mxswitch", mx_loss), ("torch", pt_loss)):
        print(f"  {name:<9} first {k} mean {mean(lo[:k]):.4f}  last {k} mean {mean(lo[-k:]):.4f}")
    for name, rng in phases:
        if len(rng):
            d = [diff[i] for i in rng]
            extra = ""
            if floor:
                fl = [floor[i] for i in rng]
                extra = f"   (mxswitch vs itself from 1-ulp-perturbed weights: max {max(fl):.4g}, mean {mean(fl):.4g})"
            print(f"  {name:<5} phase: max |diff| {max(d):.4g}, mean |diff| {mean(d):.4g}{extra}")
    first = next((i for i, d in enumerate(rel) if d > 1e-4), None)
    print(f"  the curves agree to 1e-4 relative up to iteration {len(rel) - 1 if first is None else first - 1}")
    print()
    print("iter  recipe  mxswitch     torch      |diff|" + ("   |perturbed mxswitch - mxswitch|" if floor else ""))
    for i in range(len(diff)):
        print(f"{i:4d}  {recipes[i]:<6}  {mx_loss[i]:9.5f}  {pt_loss[i]:9.5f}  {diff[i]:9.2e}"
              + (f"   {floor[i]:9.2e}" if floor else ""))


if __name__ == "__main__":
    main()
