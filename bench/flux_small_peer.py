#!/usr/bin/env python3
"""flux-small training step: PyTorch BF16 eager against mxswitch, on one GPU (issue 7).

1. PyTorch: the Flux of bench/flux_torch.py at flux-small's shapes
   (models/configs/flux-small.ron: batch 8, 256 image + 256 text tokens,
   hidden 768, 4 double + 8 single blocks), BF16 eager on CUDA, on synthetic
   random data of the same shapes. Precision (--weights):
     autocast (default): f32 master weights, torch.autocast(bfloat16) over the
       forward, f32 AdamW state: the same split as mxswitch (f32 parameters
       and optimizer state, bf16 activations);
     bf16: the parameters themselves in bf16, AdamW state in bf16 too (torch's
       default: the state takes the parameter dtype).
   One step = forward + MSE in f32 + backward + clip_grad_norm_(1.0) +
   AdamW (lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1; torch's
   default implementation, which is foreach on CUDA) + zero_grad, with
   torch.cuda.synchronize() at the end; the batch is made before the timer.
   Median over --torch-steps steps after --torch-warmup steps.
2. mxswitch: `mxswitch train --device cuda --config flux-small --iters N
   --switch-at S --out DIR`, read DIR/metrics.jsonl, per phase (by the
   `recipe` key) the median step_time_ms after skipping the first --skip
   iterations of each phase, and the largest device_peak_bytes.
3. Prints per phase: mxswitch ms, torch bf16 ms, ratio, target (fp8 <= 0.9x,
   mxfp4 <= 1.2x the torch step), met/MISSED, tokens/s and peak memory.

    python bench/flux_small_peer.py --bin .devbin [--json out.json]
    python bench/flux_small_peer.py --self-test     # CPU: tiny forward/backward, metrics parsing
"""
import argparse
import datetime
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux_torch  # noqa: E402
from flux_wide_peer import gib, mx_phases, read_metrics  # noqa: E402

TARGETS = {"fp8": 0.9, "mxfp4": 1.2}   # mxswitch step time / torch BF16 step time, at most
CLIP_NORM = 1.0
DEVICE = "cuda"  # the GPU runs; the self-test harness may point it elsewhere


# ==========================================================================
# PyTorch
# ==========================================================================
def tokens_per_batch(cfg):
    img = (cfg["latent_height"] // 2) * (cfg["latent_width"] // 2)
    return cfg["batch"] * (img + cfg["txt_tokens"])


def make_batch(cfg, device, act, gen):
    """Random inputs of flux-small's shapes; target in f32 as mxswitch's."""
    b, lt = cfg["batch"], cfg["txt_tokens"]
    li = (cfg["latent_height"] // 2) * (cfg["latent_width"] // 2)
    ts = torch.rand(b, generator=gen).tolist()
    r = lambda *shape: torch.randn(*shape, generator=gen)
    return {
        "img": r(b, li, cfg["in_channels"]).to(device, act),
        "txt": r(b, lt, cfg["context_in_dim"]).to(device, act),
        "y": r(b, cfg["vec_in_dim"]).to(device, act),
        "temb": flux_torch.timestep_embedding(ts).to(device, act),
        "target": r(b, li, cfg["in_channels"]).to(device),
    }


class TorchTrainer:
    def __init__(self, cfg, device, weights, seed=0):
        self.cfg, self.device, self.weights = cfg, device, weights
        pdtype = torch.bfloat16 if weights == "bf16" else torch.float32
        self.params = flux_torch.init_params(cfg, dtype=pdtype, device=device, seed=seed)
        self.plist = list(self.params.values())
        self.model = flux_torch.Flux(self.params, cfg)
        self.opt = torch.optim.AdamW(self.plist, lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        ph, pw = cfg["latent_height"] // 2, cfg["latent_width"] // 2
        self.pe = tuple(t.to(device) for t in flux_torch.rope_tables(cfg, cfg["txt_tokens"], ph, pw))
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self):
        return make_batch(self.cfg, self.device, torch.bfloat16, self.gen)

    def step(self, batch):
        """One training step; returns the loss tensor (not synchronized)."""
        dev_type = torch.device(self.device).type
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=self.weights == "autocast"):
            pred = self.model.forward(batch, self.pe)
        loss = (pred.float() - batch["target"]).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.plist, CLIP_NORM)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def run_torch(cfg, args):
    dev = DEVICE
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tr = TorchTrainer(cfg, dev, args.weights, args.seed)
    n_params = sum(p.numel() for p in tr.plist)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: flux-small, {n_params / 1e6:.1f} M parameters, "
          f"weights {args.weights}, AdamW in torch's default implementation, batch {cfg['batch']}", flush=True)
    times, losses = [], []
    for i in range(args.torch_warmup + args.torch_steps):
        batch = tr.batch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = tr.step(batch)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        lv = loss.item()
        if not math.isfinite(lv):
            sys.exit(f"torch loss is {lv} at step {i}: diverged")
        if i >= args.torch_warmup:
            times.append(ms)
            losses.append(lv)
        del batch, loss
    peak = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    med = statistics.median(times)
    res = {"weights": args.weights, "params": n_params, "steps": len(times), "warmup": args.torch_warmup,
           "median_ms": med, "min_ms": min(times), "step_ms": times, "losses": losses,
           "tokens_per_s": tokens_per_batch(cfg) / (med * 1e-3),
           "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved}
    print(f"torch: median step {med:.2f} ms over {len(times)} steps (min {min(times):.2f}), "
          f"{res['tokens_per_s']:.0f} tokens/s, peak allocated {peak / 2**30:.2f} GiB "
          f"(reserved {reserved / 2**30:.2f} GiB); loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    del tr
    gc.collect()
    torch.cuda.empty_cache()
    return res


# ==========================================================================
# mxswitch
# ==========================================================================
def run_mxswitch(args, out_dir):
    stale = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(stale):
        os.remove(stale)  # never read an older run's metrics
    cmd = [args.mxswitch, "train", "--device", "cuda", "--config", args.config, "--iters", str(args.iters),
           "--switch-at", str(args.switch_at), "--out", out_dir]
    res = {"cmd": " ".join(cmd), "rc": None, "seconds": None, "output": ""}
    print(f"===== {res['cmd']}", flush=True)
    if not os.path.exists(args.mxswitch):
        res["rc"] = "missing"
        res["output"] = f"{args.mxswitch} does not exist"
        print("  " + res["output"])
        return res
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        res["rc"], res["output"] = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        res["rc"], res["output"] = "timeout", out + f"\n(killed after {args.timeout} s)"
    except Exception as e:  # noqa: BLE001
        res["rc"], res["output"] = "error", f"could not run: {type(e).__name__}: {e}"
    res["seconds"] = round(time.time() - t0, 1)
    lines = res["output"].splitlines()
    print(f"  rc={res['rc']}, {res['seconds']} s")
    for l in (lines if len(lines) <= 30 else lines[:10] + ["..."] + lines[-15:]):
        print("  | " + l[:300])
    return res


def verdict(ratio, target):
    if ratio is None:
        return "missing"
    return "met" if ratio <= target else f"MISSED by {ratio / target:.2f}x"


def report_rows(mx, tres):
    rows = []
    t_ms = tres.get("median_ms") if tres else None
    for recipe in ("mxfp4", "fp8"):
        p = mx.get(recipe) or {}
        ms = p.get("median_ms")
        ratio = ms / t_ms if (ms and t_ms) else None
        rows.append({"phase": recipe, "mx_iters": p.get("iters"), "mx_n_timed": p.get("n_timed"), "mx_ms": ms,
                     "torch_ms": t_ms, "ratio": ratio, "target": TARGETS[recipe], "verdict": verdict(ratio, TARGETS[recipe]),
                     "mx_tokens_per_s": p.get("tokens_per_s"), "torch_tokens_per_s": tres.get("tokens_per_s") if tres else None,
                     "mx_peak_bytes": p.get("peak_bytes"),
                     "torch_peak_bytes": tres.get("peak_allocated_bytes") if tres else None})
    return rows


def print_report(rep):
    W = 128
    f = lambda v, spec: "missing" if v is None else format(v, spec)
    print()
    print("=" * W)
    t = rep.get("torch_result") or {}
    print(f"flux-small training step, batch {rep['batch']}, {rep['tokens']} tokens per step: mxswitch vs torch "
          f"{rep['torch']} BF16 eager ({t.get('weights', '?')} weights) on {rep['device']} ({rep['date']})")
    print(f"{'phase':<7}{'mx iters':>10}{'mx ms':>10}{'torch ms':>10}{'mx/torch':>10}{'target':>8}  {'verdict':<16}"
          f"{'mx tok/s':>10}{'torch tok/s':>12}{'mx peak':>13}{'torch peak':>13}")
    for r in rep["rows"]:
        print(f"{r['phase']:<7}{r['mx_iters'] or 'missing':>10}{f(r['mx_ms'], '.2f'):>10}{f(r['torch_ms'], '.2f'):>10}"
              f"{f(r['ratio'], '.2f'):>10}{'<=' + str(r['target']):>8}  {r['verdict']:<16}"
              f"{f(r['mx_tokens_per_s'], '.0f'):>10}{f(r['torch_tokens_per_s'], '.0f'):>12}"
              f"{gib(r['mx_peak_bytes']):>13}{gib(r['torch_peak_bytes']):>13}")
    print(f"  mx ms: median step_time_ms of the phase after skipping its first {rep['skip']} iterations "
          "(includes moving the batch to the GPU; on a GPU the batch is built one step ahead on a host thread); mx peak: largest device_peak_bytes in metrics.jsonl.")
    print(f"  torch ms: median of {t.get('steps', '?')} steps after {t.get('warmup', '?')} warm-up (batch made "
          "before the timer); torch peak: torch.cuda.max_memory_allocated "
          f"(reserved: {gib(t.get('peak_reserved_bytes'))}). tokens/s = batch * (256 + 256) / step time.")
    for n in rep["notes"]:
        print("NOTE:", n)
    print("=" * W)


# ==========================================================================
# self-test (CPU)
# ==========================================================================
def self_test(args):
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("ok    " if ok else "FAIL  ") + what)
        fails += 0 if ok else 1

    # 1. flux-small's parameter count (no allocation of the full model).
    shapes = flux_torch.param_shapes(flux_torch.FLUX_SMALL)
    n = sum(torch.Size(s).numel() for s, _ in shapes.values())
    print(f"flux-small: {len(shapes)} parameter tensors, {n / 1e6:.2f} M parameters")

    # 2. One training step at tiny sizes on the CPU, both precision modes.
    tiny = dict(flux_torch.FLUX_SMALL, vec_in_dim=32, context_in_dim=64, hidden_size=64, num_heads=4, depth=2,
                depth_single_blocks=2, axes_dim=(4, 6, 6), latent_height=8, latent_width=8, txt_tokens=8, batch=2, lr=1e-2)
    for weights in ("autocast", "bf16"):
        tr = TorchTrainer(tiny, "cpu", weights)
        # Modulation is zero-initialized, which zeroes most gradients: perturb it to exercise all paths.
        with torch.no_grad():
            for k, p in tr.params.items():
                if p.abs().max() == 0:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p.dtype) * 0.02)
        before = {k: p.detach().clone() for k, p in tr.params.items()}
        batch = tr.batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=weights == "autocast"):
            pred = tr.model.forward(batch, tr.pe)
        loss = tr.step(batch)
        moved = sum(not torch.equal(before[k], p.detach()) for k, p in tr.params.items())
        check(pred.shape == batch["target"].shape and torch.isfinite(loss).item() and moved == len(before),
              f"{weights}: one CPU step, pred {tuple(pred.shape)} {pred.dtype}, loss {loss.item():.4f}, "
              f"{moved}/{len(before)} parameters updated")

    # 3. The parameter names and shapes against an mxswitch checkpoint (flux-tiny, --iters 0), if a binary is here.
    binary = args.mxswitch if os.path.exists(args.mxswitch) else os.path.join("target", "release", "mxswitch")
    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    if os.path.exists(binary) and load_file:
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([binary, "train", "--config", "flux-tiny", "--iters", "0", "--out", d],
                               capture_output=True, text=True, timeout=300)
            ck = os.path.join(d, "checkpoint.safetensors")
            if p.returncode == 0 and os.path.exists(ck):
                ref = {k[len("param."):]: tuple(v.shape) for k, v in load_file(ck).items() if k.startswith("param.")}
                tiny_cfg = dict(flux_torch.FLUX_SMALL, vec_in_dim=32, context_in_dim=64, hidden_size=64, num_heads=4,
                                depth=2, depth_single_blocks=2, axes_dim=(4, 6, 6))
                mine = {k: tuple(s) for k, (s, _) in flux_torch.param_shapes(tiny_cfg).items()}
                check(ref == mine, f"param_shapes match {binary}'s flux-tiny checkpoint ({len(ref)} tensors)"
                      + ("" if ref == mine else f": only mxswitch {sorted(set(ref) - set(mine))[:5]}, only torch "
                         f"{sorted(set(mine) - set(ref))[:5]}"))
            else:
                print(f"skip  checkpoint comparison: {binary} failed ({p.returncode}): {p.stderr.strip()[-200:]}")
    else:
        print("skip  checkpoint comparison: no CPU mxswitch binary or no safetensors")

    # 4. Metrics parsing and the table, with made-up metrics (device_peak_bytes missing in the fp8 phase).
    lines = [{"iter": i, "recipe": "mxfp4" if i < 6 else "fp8", "loss": 1.0, "step_time_ms": 100.0 + i,
              **({"device_peak_bytes": 5 * 2**30} if i < 6 else {})} for i in range(12)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.jsonl")
        with open(path, "w") as fh:
            fh.write("\n".join(json.dumps(l) for l in lines) + "\n{broken\n")
        rows, bad = read_metrics(path)
    mx = mx_phases(rows, 3, 4096)
    check(bad == 1 and mx["mxfp4"]["median_ms"] == 104.0 and mx["fp8"]["median_ms"] == 110.0
          and mx["fp8"]["peak_bytes"] is None, "metrics.jsonl parsing and per-phase medians")
    tres = {"weights": "autocast", "median_ms": 100.0, "tokens_per_s": 40960.0, "peak_allocated_bytes": 4 * 2**30,
            "steps": 20, "warmup": 5}
    rep = {"date": "self-test", "torch": torch.__version__, "device": "none", "batch": 8, "tokens": 4096, "skip": 3,
           "torch_result": tres, "rows": report_rows(mx, tres),
           "notes": ["SELF-TEST: made-up numbers, this checks the table code only"]}
    print_report(rep)
    check([r["verdict"] for r in rep["rows"]] == ["met", "MISSED by 1.22x"], "verdicts")
    print("SELF-TEST " + ("OK" if fails == 0 else f"{fails} FAILURES"))
    return 1 if fails else 0


# ==========================================================================
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=".devbin", help="folder with the mxswitch binary")
    ap.add_argument("--mxswitch", default=None, help="the mxswitch binary (default BIN/mxswitch)")
    ap.add_argument("--config", default="flux-small")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--switch-at", type=int, default=30)
    ap.add_argument("--skip", type=int, default=3, help="warm-up iterations skipped at the start of each phase")
    ap.add_argument("--out-dir", default=None,
                    help="mxswitch's --out, kept (default: a temp dir, removed after; metrics.jsonl is copied to "
                         "$OUT/flux_small_mx_metrics.jsonl when OUT is set)")
    ap.add_argument("--timeout", type=int, default=540, help="seconds for the mxswitch run")
    ap.add_argument("--weights", choices=("autocast", "bf16"), default="autocast",
                    help="torch precision: autocast (f32 master weights, as mxswitch) or bf16 parameters")
    ap.add_argument("--torch-steps", type=int, default=30, help="timed torch steps (>= 20)")
    ap.add_argument("--torch-warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-mxswitch", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--json", default=None, help="write all results here (default $OUT/flux_small_peer.json if OUT is set)")
    ap.add_argument("--self-test", action="store_true", help="CPU checks only (no GPU needed)")
    args = ap.parse_args()
    args.mxswitch = args.mxswitch or os.path.join(args.bin, "mxswitch")
    if args.self_test:
        sys.exit(self_test(args))
    if args.config != "flux-small":
        sys.exit("flux_small_peer.py runs flux-small only; bench/flux_wide_peer.py takes any config "
                 "(eager and torch.compile + fused AdamW)")
    if not torch.cuda.is_available():
        sys.exit(f"CUDA is not available to torch {torch.__version__} here: this benchmark needs an NVIDIA GPU "
                 "(run `python bench/flux_small_peer.py --self-test` for the CPU checks).")
    args.torch_steps = max(args.torch_steps, 20)
    out_env = os.environ.get("OUT")
    if args.json is None and out_env:
        args.json = os.path.join(out_env, "flux_small_peer.json")
    # Not under $OUT by default: mxswitch also writes a checkpoint (~2 GB for flux-small).
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="flux_small_mx_")

    cfg = flux_torch.FLUX_SMALL
    notes = []
    tres = None
    if not args.skip_torch:
        tres = run_torch(cfg, args)
    mx_run, mx, n_rows = None, {}, 0
    if not args.skip_mxswitch:
        mx_run = run_mxswitch(args, out_dir)
        rows, bad = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
        n_rows = len(rows)
        if bad:
            notes.append(f"{bad} unparsable lines in metrics.jsonl")
        if not rows:
            notes.append(f"no metrics from mxswitch (rc {mx_run['rc']}): {os.path.join(out_dir, 'metrics.jsonl')}")
        elif not any("device_peak_bytes" in r for r in rows):
            notes.append("metrics.jsonl has no device_peak_bytes key: mxswitch peak memory missing")
        mx = mx_phases(rows, args.skip, tokens_per_batch(cfg))
        metrics = os.path.join(out_dir, "metrics.jsonl")
        if out_env and os.path.exists(metrics):
            shutil.copy(metrics, os.path.join(out_env, "flux_small_mx_metrics.jsonl"))
        if not args.out_dir:
            shutil.rmtree(out_dir, ignore_errors=True)
        for recipe in ("mxfp4", "fp8"):
            if recipe not in mx:
                notes.append(f"mxswitch metrics have no {recipe} phase")
    rep = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "batch": cfg["batch"], "tokens": tokens_per_batch(cfg), "skip": args.skip,
        "args": vars(args), "torch_result": tres, "mx_run": mx_run, "mx_metrics_lines": n_rows, "mx_phases": mx,
        "rows": report_rows(mx, tres), "notes": notes,
    }
    print_report(rep)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
