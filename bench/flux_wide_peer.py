#!/usr/bin/env python3
"""A Flux training step at any run config: mxswitch against PyTorch BF16,
eager and torch.compile + fused AdamW, on one GPU in one run (issue 14).

--config takes what `mxswitch train --config` takes: a built-in name
(models/configs/<name>.ron: flux-wide, flux-1024, flux-small, ...) or a .ron
file. The model and data fields are read from the RON file (ron_config.py),
so the torch model is the same Flux (bench/flux_torch.py), at the same
shapes, batch and activation dtype.

1. mxswitch (first, on a GPU torch has not touched yet):
   `mxswitch train --config X --device cuda --iters N --out DIR --overwrite
   [--switch-at S]`; from DIR/metrics.jsonl, per phase (the `recipe` key:
   mxfp4 before the switch, fp8 after) the median step_time_ms after skipping
   the phase's first --skip iterations, and the largest device_peak_bytes.
2. torch, in this process, one mode after the other (--modes):
   eager:   the model as written, torch.optim.AdamW in its default
            implementation (foreach on CUDA);
   compile: forward + loss under torch.compile (--compile-mode), backward
            through the compiled graph, torch.optim.AdamW(fused=True).
   Both: f32 master weights and AdamW state with torch.autocast(bfloat16)
   over the forward when the config's activations are bf16 (--weights
   autocast, as mxswitch keeps f32 parameters; --weights bf16 for BF16
   parameters), MSE in f32, clip_grad_norm_(1.0), AdamW (config lr, betas
   (0.9, 0.95), eps 1e-8, weight decay 0.1), zero_grad, and
   torch.cuda.synchronize() at the end of the step; random inputs of the
   config's shapes, made before the timer. Median of --torch-steps steps
   after --torch-warmup steps (the compile happens there); peak memory is
   torch.cuda.max_memory_allocated over the mode's whole run.
3. Prints per phase: mxswitch ms, torch eager and compile ms, the ratios
   mxswitch / torch.compile and mxswitch / eager, tokens/s, and peak memory;
   everything also goes to --json (default $OUT/flux_wide_peer_<config>.json).

    python bench/flux_wide_peer.py --bin .devbin --config flux-wide
    python bench/flux_wide_peer.py --bin .devbin --config flux-1024
    python bench/flux_wide_peer.py --config flux-wide --print-config   # no GPU: the shapes it would run
    python bench/flux_wide_peer.py --self-test                         # no GPU: parser, shapes, tables
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux_shapes  # noqa: E402
import ron_config  # noqa: E402

CLIP_NORM = 1.0
MODES = ("eager", "compile")


def describe(cfg, name):
    n = flux_shapes.count_params(cfg)
    return (f"{name}: {cfg['depth']} double + {cfg['depth_single_blocks']} single blocks, hidden {cfg['hidden_size']}, "
            f"{cfg['num_heads']} heads, MLP {flux_shapes.mlp_hidden(cfg)}, {n / 1e6:.1f} M parameters; batch "
            f"{cfg['batch']} x ({ron_config.image_tokens(cfg)} image + {cfg['txt_tokens']} text tokens) = "
            f"{ron_config.tokens_per_step(cfg)} tokens a step; {cfg['activations']} activations; phases "
            + ", ".join(f"{r} from {s}" for s, r in cfg["phases"]))


# ==========================================================================
# torch
# ==========================================================================
def make_batch(torch, cfg, device, act, gen):
    """Random inputs of the config's shapes; the target in f32, as mxswitch's."""
    import flux_torch
    b, lt, li = cfg["batch"], cfg["txt_tokens"], ron_config.image_tokens(cfg)
    ts = torch.rand(b, generator=gen).tolist()
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    return {
        "img": r(b, li, cfg["in_channels"]).to(device, act),
        "txt": r(b, lt, cfg["context_in_dim"]).to(device, act),
        "y": r(b, cfg["vec_in_dim"]).to(device, act),
        "temb": flux_torch.timestep_embedding(ts).to(device, act),
        "target": r(b, li, cfg["in_channels"]).to(device),
    }


class TorchTrainer:
    """One training step of flux_torch.Flux at `cfg`, eager or compiled."""

    def __init__(self, torch, cfg, device, mode, weights, compile_mode=None, seed=0):
        import flux_torch
        self.torch, self.cfg, self.device, self.mode = torch, cfg, device, mode
        bf16_act = cfg["activations"] == "bf16"
        self.autocast = bf16_act and weights == "autocast"
        pdtype = torch.bfloat16 if weights == "bf16" else torch.float32
        self.act = torch.bfloat16 if bf16_act else torch.float32
        self.params = flux_torch.init_params(cfg, dtype=pdtype, device=device, seed=seed)
        self.plist = list(self.params.values())
        ph, pw = cfg["latent_height"] // 2, cfg["latent_width"] // 2
        pe = tuple(t.to(device) for t in flux_torch.rope_tables(cfg, cfg["txt_tokens"], ph, pw))
        dev_type = torch.device(device).type
        autocast = self.autocast

        def loss_fn(params, batch):
            with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=autocast):
                pred = flux_torch.Flux(params, cfg).forward(batch, pe)
            return (pred.float() - batch["target"]).pow(2).mean()

        opt_args = dict(lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        if mode == "compile":
            self.loss_fn = torch.compile(loss_fn, mode=compile_mode)
            self.opt = torch.optim.AdamW(self.plist, fused=True, **opt_args)
            self.opt_name = "torch.optim.AdamW(fused=True)"
        else:
            self.loss_fn = loss_fn
            self.opt = torch.optim.AdamW(self.plist, **opt_args)
            self.opt_name = "torch.optim.AdamW (default: foreach on CUDA)"
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self):
        return make_batch(self.torch, self.cfg, self.device, self.act, self.gen)

    def step(self, batch):
        """One training step; returns the loss tensor (not synchronized)."""
        loss = self.loss_fn(self.params, batch)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.plist, CLIP_NORM)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def run_torch_mode(torch, cfg, args, mode):
    """Median step time and peak memory of one mode; `error` set on failure."""
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    res = {"mode": mode, "weights": args.weights, "error": None}
    t_setup = time.perf_counter()
    try:
        tr = TorchTrainer(torch, cfg, args.device, mode, args.weights, args.compile_mode, args.seed)
        res["optimizer"] = tr.opt_name
        res["autocast"] = tr.autocast
        times, losses, first_ms = [], [], []
        for i in range(args.torch_warmup + args.torch_steps):
            batch = tr.batch()
            sync()
            t0 = time.perf_counter()
            loss = tr.step(batch)
            sync()
            ms = (time.perf_counter() - t0) * 1e3
            lv = loss.item()
            if not math.isfinite(lv):
                raise RuntimeError(f"loss is {lv} at step {i}: diverged")
            if i < args.torch_warmup:
                first_ms.append(ms)
            else:
                times.append(ms)
                losses.append(lv)
            del batch, loss
    except Exception as e:  # noqa: BLE001  (a compile failure is reported, eager still counts)
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
        print(f"torch {mode}: FAILED: {res['error']}", flush=True)
        return res
    med = statistics.median(times)
    res.update({
        "steps": len(times), "warmup": args.torch_warmup, "warmup_ms": first_ms,
        "setup_and_run_s": round(time.perf_counter() - t_setup, 1),
        "median_ms": med, "min_ms": min(times), "step_ms": times, "losses": losses,
        "tokens_per_s": ron_config.tokens_per_step(cfg) / (med * 1e-3),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
    })
    print(f"torch {mode}: median step {med:.2f} ms over {len(times)} steps (min {min(times):.2f}; warm-up "
          f"{', '.join(f'{x:.0f}' for x in first_ms)} ms), {res['tokens_per_s']:.0f} tokens/s, peak allocated "
          f"{gib(res['peak_allocated_bytes'])}; loss {losses[0]:.4f} -> {losses[-1]:.4f}; {tr.opt_name}", flush=True)
    del tr
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


# ==========================================================================
# mxswitch
# ==========================================================================
def mx_command(args, out_dir):
    cmd = [args.mxswitch, "train", "--config", args.config, "--device", args.device, "--iters", str(args.iters),
           "--out", out_dir, "--overwrite"]
    if args.switch_at is not None:
        cmd += ["--switch-at", str(args.switch_at)]
    return cmd


def run_mxswitch(args, out_dir):
    stale = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(stale):
        os.remove(stale)  # never read an older run's metrics
    cmd = mx_command(args, out_dir)
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
    for line in (lines if len(lines) <= 30 else lines[:10] + ["..."] + lines[-15:]):
        print("  | " + line[:300])
    return res


def read_metrics(path):
    """The metrics.jsonl lines as dicts; unparsable lines are counted and skipped."""
    rows, bad = [], 0
    if not os.path.exists(path):
        return rows, bad
    with open(path) as f:
        for line in f:
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    bad += 1
    return rows, bad


def mx_phases(rows, skip, tokens):
    """Per recipe, in order of appearance: iterations, the median step_time_ms
    after skipping the phase's first `skip`, tokens/s, the largest
    device_peak_bytes (None when absent) and the first and last loss."""
    phases = {}
    for r in rows:
        phases.setdefault(r.get("recipe"), []).append(r)
    out = {}
    for recipe, rs in phases.items():
        timed = [r["step_time_ms"] for r in rs[skip:] if isinstance(r.get("step_time_ms"), (int, float))]
        peaks = [r["device_peak_bytes"] for r in rs if isinstance(r.get("device_peak_bytes"), (int, float))]
        med = statistics.median(timed) if timed else None
        out[recipe] = {
            "iters": f"{rs[0].get('iter')}-{rs[-1].get('iter')}", "n_timed": len(timed), "median_ms": med,
            "tokens_per_s": tokens / (med * 1e-3) if med else None,
            "peak_bytes": max(peaks) if peaks else None,
            "loss_first": rs[0].get("loss"), "loss_last": rs[-1].get("loss"),
        }
    return out


# ==========================================================================
# report
# ==========================================================================
def gib(b):
    return f"{b / 2**30:.2f} GiB" if b else "missing"


def ratio(a, b):
    return a / b if (a and b) else None


def report_rows(mx, torch_res):
    """One row per mxswitch phase: its numbers, each torch mode's, the ratios."""
    rows = []
    t = {m: (torch_res.get(m) or {}) for m in MODES}
    for recipe, p in (mx or {"(no mxswitch)": {}}).items():
        ms = p.get("median_ms")
        rows.append({
            "phase": recipe, "mx_iters": p.get("iters"), "mx_n_timed": p.get("n_timed"), "mx_ms": ms,
            "eager_ms": t["eager"].get("median_ms"), "compile_ms": t["compile"].get("median_ms"),
            "mx_over_compile": ratio(ms, t["compile"].get("median_ms")),
            "mx_over_eager": ratio(ms, t["eager"].get("median_ms")),
            "mx_tokens_per_s": p.get("tokens_per_s"), "mx_peak_bytes": p.get("peak_bytes"),
            "eager_peak_bytes": t["eager"].get("peak_allocated_bytes"),
            "compile_peak_bytes": t["compile"].get("peak_allocated_bytes"),
        })
    return rows


def print_report(rep):
    W = 150
    f = lambda v, spec: "missing" if v is None else format(v, spec)  # noqa: E731
    x = lambda v: "missing" if v is None else f"{v:.2f}x"  # noqa: E731
    print()
    print("=" * W)
    print(f"{rep['describe']}")
    print(f"mxswitch vs torch {rep['torch']} on {rep['device']} ({rep['date']}), one run")
    print(f"{'phase':<8}{'mx iters':>10}{'mx ms':>10}{'eager ms':>10}{'compile ms':>12}{'mx/compile':>12}"
          f"{'mx/eager':>10}{'mx tok/s':>11}{'mx peak':>12}{'eager peak':>12}{'compile peak':>14}")
    for r in rep["rows"]:
        print(f"{str(r['phase']):<8}{r['mx_iters'] or 'missing':>10}{f(r['mx_ms'], '.2f'):>10}"
              f"{f(r['eager_ms'], '.2f'):>10}{f(r['compile_ms'], '.2f'):>12}{x(r['mx_over_compile']):>12}"
              f"{x(r['mx_over_eager']):>10}{f(r['mx_tokens_per_s'], '.0f'):>11}{gib(r['mx_peak_bytes']):>12}"
              f"{gib(r['eager_peak_bytes']):>12}{gib(r['compile_peak_bytes']):>14}")
    t = rep.get("torch_results") or {}
    for m in MODES:
        tm = t.get(m) or {}
        if tm.get("median_ms"):
            print(f"  torch {m}: {tm['median_ms']:.2f} ms, {tm['tokens_per_s']:.0f} tokens/s, "
                  f"{tm.get('optimizer')}, autocast {tm.get('autocast')}, weights {tm.get('weights')}")
        elif tm.get("error"):
            print(f"  torch {m}: FAILED ({tm['error']})")
    print(f"  mx ms: median step_time_ms of the phase after skipping its first {rep['skip']} iterations (it "
          "includes moving the batch to the GPU; mxswitch builds it one step ahead on a host thread); mx peak: the "
          "largest device_peak_bytes in metrics.jsonl (the caching allocator's most bytes held by tensors).")
    print(f"  torch ms: median of {rep['torch_steps']} steps after {rep['torch_warmup']} warm-up steps (batch made "
          "before the timer); torch peak: torch.cuda.max_memory_allocated over the mode's run. Ratios > 1: "
          "mxswitch is slower.")
    for n in rep["notes"]:
        print("NOTE:", n)
    print("=" * W)


# ==========================================================================
# self-test (no GPU)
# ==========================================================================
def self_test(args):
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("ok    " if ok else "FAIL  ") + what)
        fails += 0 if ok else 1

    # 1. The RON subset: every shipped config parses; syntax errors name line and column.
    names = ron_config.builtin_names()
    check({"flux-wide", "flux-1024", "flux-small", "flux-tiny"} <= set(names), f"built-in configs: {names}")
    cfgs = {}
    for n in names:
        path, run = ron_config.load_run_config(n)
        cfgs[n] = ron_config.flux_cfg(run, path)
    small = {k: v for k, v in cfgs["flux-small"].items() if k in ron_config.MODEL_KEYS + ron_config.DATA_KEYS}
    want = {"in_channels": 64, "vec_in_dim": 768, "context_in_dim": 4096, "hidden_size": 768, "mlp_ratio": 4.0,
            "num_heads": 6, "depth": 4, "depth_single_blocks": 8, "axes_dim": (16, 56, 56), "theta": 10000.0,
            "qkv_bias": True, "guidance_embed": False, "latent_channels": 16, "latent_height": 32,
            "latent_width": 32, "txt_tokens": 256, "batch": 8}
    check(small == want, "flux-small.ron parses to flux_torch.FLUX_SMALL's shapes")
    wide, k1024 = cfgs["flux-wide"], cfgs["flux-1024"]
    check((wide["hidden_size"], wide["num_heads"], ron_config.tokens_per_step(wide), wide["activations"],
           wide["phases"]) == (3072, 24, 8192, "bf16", [(0, "mxfp4"), (15, "fp8")]),
          f"flux-wide: {describe(wide, 'flux-wide')}")
    check((ron_config.image_tokens(k1024), k1024["txt_tokens"], k1024["batch"], ron_config.tokens_per_step(k1024))
          == (4096, 512, 2, 9216), f"flux-1024: {describe(k1024, 'flux-1024')}")
    v = ron_config.parse("Run(a: Some(-1.5e3), b: [1, 0x1F, \"x\\n\"], c: (1, true,), d: {\"k\": None}, "
                         "e: Variant, /* nested /* comment */ */ f: 'z',) // trailing", "t.ron")
    check(v == {"a": -1500.0, "b": [1, 31, "x\n"], "c": [1, True], "d": {"k": None}, "e": "Variant", "f": "z"},
          f"RON subset values: {v}")
    errors = {"(a: 1": "t.ron:1:6", "(a: 1,, b: 2)": "t.ron:1:7", "(a: \"x)": "t.ron:1:5", "[1 2]": "t.ron:1:4",
              "(a: 1)\nx": "t.ron:2:1", "(a: 1, a: 2)": "t.ron:1:8"}
    for text, at in errors.items():
        try:
            ron_config.parse(text, "t.ron")
            got = "no error"
        except ron_config.RonError as e:
            got = str(e)
        check(got.startswith(at), f"syntax error at {at}: {got}")
    for bad, msg in (("flux-huge", "unknown config `flux-huge`"), ("nope.ron", "no such file")):
        try:
            ron_config.resolve(bad)
            got = "no error"
        except ron_config.RonError as e:
            got = str(e)
        check(msg in got, f"--config {bad}: {got}")

    # 2. The torch model's parameter count against mxswitch's plan, when a binary is here.
    binary = args.mxswitch if os.path.exists(args.mxswitch) else os.path.join(ron_config.REPO, "target", "release",
                                                                              "mxswitch")
    if os.path.exists(binary):
        for n in names:
            p = subprocess.run([binary, "plan", "--config", ron_config.resolve(n), "--json"], capture_output=True,
                               text=True, timeout=120)
            mine = flux_shapes.count_params(cfgs[n])
            try:
                theirs = json.loads(p.stdout)["parameters"]
            except (json.JSONDecodeError, KeyError):
                theirs = f"no JSON (rc {p.returncode}: {p.stderr.strip()[-200:]})"
            check(theirs == mine, f"{n}: {mine} parameters in torch, {theirs} in `{binary} plan`")
    else:
        print(f"skip  parameter counts: no {binary}")

    # 3. Arguments: the mxswitch command line.
    a = argparse.Namespace(mxswitch="bin/mxswitch", config="flux-wide", iters=30, switch_at=None, device="cuda")
    check(mx_command(a, "D") == ["bin/mxswitch", "train", "--config", "flux-wide", "--device", "cuda", "--iters",
                                 "30", "--out", "D", "--overwrite"], "mxswitch command line")
    a.switch_at = 10
    check(mx_command(a, "D")[-2:] == ["--switch-at", "10"], "--switch-at is passed on")

    # 4. Metrics parsing and the table, with made-up numbers.
    lines = [{"iter": i, "recipe": "mxfp4" if i < 15 else "fp8", "loss": 1.0, "step_time_ms": 120.0 + i,
              **({"device_peak_bytes": 30 * 2**30} if i != 29 else {})} for i in range(30)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.jsonl")
        with open(path, "w") as fh:
            fh.write("\n".join(json.dumps(line) for line in lines) + "\n{broken\n")
        rows, bad = read_metrics(path)
    mx = mx_phases(rows, 3, 8192)
    check(bad == 1 and list(mx) == ["mxfp4", "fp8"] and mx["mxfp4"]["median_ms"] == 128.5
          and mx["fp8"]["median_ms"] == 143.5 and mx["fp8"]["iters"] == "15-29"
          and mx["fp8"]["peak_bytes"] == 30 * 2**30, "metrics.jsonl parsing and per-phase medians")
    tres = {"eager": {"median_ms": 70.0, "peak_allocated_bytes": 25 * 2**30, "tokens_per_s": 117028.0,
                      "optimizer": "made up", "autocast": True, "weights": "autocast"},
            "compile": {"error": "RuntimeError: made up"}}
    rep = {"describe": describe(wide, "flux-wide (SELF-TEST: made-up numbers)"), "torch": "none", "device": "none",
           "date": "self-test", "skip": 3, "torch_steps": 20, "torch_warmup": 5, "torch_results": tres,
           "rows": report_rows(mx, tres), "notes": ["SELF-TEST: made-up numbers, this checks the table code only"]}
    print_report(rep)
    r0 = rep["rows"][0]
    check(abs(r0["mx_over_eager"] - 128.5 / 70.0) < 1e-12 and r0["mx_over_compile"] is None
          and r0["compile_ms"] is None, "ratios, and a failed mode reported as missing")

    # 5. One torch step per mode at tiny sizes on the CPU, if torch is here (compile needs --self-test-compile).
    try:
        import torch
    except ImportError:
        torch = None
        print("skip  torch steps: torch is not installed here")
    if torch is not None:
        tiny = dict(cfgs["flux-tiny"], batch=2, lr=1e-2, activations="bf16")
        for mode in ("eager", "compile") if args.self_test_compile else ("eager",):
            tr = TorchTrainer(torch, tiny, "cpu", mode, "autocast")
            with torch.no_grad():
                for p in tr.plist:  # zero-initialized modulation zeroes most gradients
                    if p.abs().max() == 0:
                        p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.02)
            before = [p.detach().clone() for p in tr.plist]
            loss = tr.step(tr.batch())
            moved = sum(not torch.equal(b, p.detach()) for b, p in zip(before, tr.plist))
            check(torch.isfinite(loss).item() and moved == len(before),
                  f"torch {mode}: one CPU step, loss {loss.item():.4f}, {moved}/{len(before)} parameters updated")
    print("SELF-TEST " + ("OK" if fails == 0 else f"{fails} FAILURES"))
    return 1 if fails else 0


# ==========================================================================
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="flux-wide", help="built-in name or .ron file (as mxswitch train --config)")
    ap.add_argument("--bin", default=".devbin", help="folder with the mxswitch binary")
    ap.add_argument("--mxswitch", default=None, help="the mxswitch binary (default BIN/mxswitch)")
    ap.add_argument("--iters", type=int, default=None, help="mxswitch iterations (default: the config's train.iters)")
    ap.add_argument("--switch-at", type=int, default=None, help="passed to mxswitch (default: the config's schedule)")
    ap.add_argument("--skip", type=int, default=3, help="iterations skipped at the start of each mxswitch phase")
    ap.add_argument("--modes", default="eager,compile", help="torch modes, comma-separated: eager, compile")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default: torch's default; e.g. max-autotune-no-cudagraphs)")
    ap.add_argument("--weights", choices=("autocast", "bf16"), default="autocast",
                    help="torch precision: autocast (f32 master weights, as mxswitch) or bf16 parameters")
    ap.add_argument("--torch-steps", type=int, default=20, help="timed torch steps per mode (>= 10)")
    ap.add_argument("--torch-warmup", type=int, default=5, help="untimed torch steps per mode (compile happens here)")
    ap.add_argument("--torch-first", action="store_true", help="run torch before mxswitch")
    ap.add_argument("--timeout", type=int, default=480, help="seconds for the mxswitch run")
    ap.add_argument("--out-dir", default=None, help="mxswitch's --out, kept (default: a temp dir, removed after; "
                                                    "metrics.jsonl is copied to $OUT when OUT is set)")
    ap.add_argument("--mx-metrics", default=None,
                    help="read this metrics.jsonl instead of running mxswitch (a run made in another command)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke test of the whole script on a small config (no peak memory)")
    ap.add_argument("--skip-mxswitch", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--json", default=None, help="write all results here (default $OUT/flux_wide_peer_<config>.json)")
    ap.add_argument("--print-config", action="store_true", help="print the shapes the config gives and exit")
    ap.add_argument("--self-test", action="store_true", help="checks that need no GPU")
    ap.add_argument("--self-test-compile", action="store_true", help="with --self-test: also a torch.compile CPU step")
    args = ap.parse_args(argv)
    args.mxswitch = args.mxswitch or os.path.join(args.bin, "mxswitch")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"unknown --modes {bad}: use eager, compile")
    if args.torch_steps < 10:
        ap.error("--torch-steps must be at least 10")
    return args


def main():
    args = parse_args()
    if args.self_test or args.self_test_compile:
        sys.exit(self_test(args))
    try:
        path, run = ron_config.load_run_config(args.config)
        cfg = ron_config.flux_cfg(run, path)
    except ron_config.RonError as e:
        sys.exit(f"flux_wide_peer: {e}")
    name = os.path.basename(path)[:-4]
    if args.iters is None:
        args.iters = cfg["iters"]
    if args.switch_at is not None and len(cfg["phases"]) >= 2:
        cfg["phases"][1] = (args.switch_at, cfg["phases"][1][1])  # as mxswitch's --switch-at moves it
    info = describe(cfg, f"{name} ({os.path.relpath(path)})")
    if args.print_config:
        print(info)
        print("torch cfg:", json.dumps({k: v for k, v in cfg.items()}))
        print("mxswitch:", " ".join(mx_command(args, "DIR")))
        return
    try:
        import torch
    except ImportError:
        sys.exit("torch is not installed here: this benchmark needs PyTorch with CUDA "
                 "(`python bench/flux_wide_peer.py --self-test` checks the rest)")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"CUDA is not available to torch {torch.__version__} here: this benchmark needs an NVIDIA GPU "
                 "(`python bench/flux_wide_peer.py --self-test` checks the rest).")
    print(info, flush=True)
    out_env = os.environ.get("OUT")
    if args.json is None and out_env:
        args.json = os.path.join(out_env, f"flux_wide_peer_{name}.json")
    notes = []
    tres = {}

    def torch_side():
        if args.skip_torch:
            return
        for mode in args.modes:
            tres[mode] = run_torch_mode(torch, cfg, args, mode)

    if args.torch_first:
        torch_side()
    mx_run, mx, n_rows = None, {}, 0
    if not args.skip_mxswitch or args.mx_metrics:
        if args.mx_metrics:
            metrics = args.mx_metrics
            notes.append(f"mxswitch metrics read from {metrics} (not run in this process)")
        else:
            # Not under $OUT by default: the checkpoint of a 1.3 B-parameter run is ~16 GB.
            out_dir = args.out_dir or tempfile.mkdtemp(prefix=f"{name}_mx_")
            mx_run = run_mxswitch(args, out_dir)
            metrics = os.path.join(out_dir, "metrics.jsonl")
        rows, bad = read_metrics(metrics)
        n_rows = len(rows)
        if bad:
            notes.append(f"{bad} unparsable lines in {metrics}")
        if not rows:
            notes.append(f"no metrics from mxswitch ({metrics})")
        elif not any("device_peak_bytes" in r for r in rows):
            notes.append("metrics.jsonl has no device_peak_bytes key: mxswitch peak memory missing")
        mx = mx_phases(rows, args.skip, ron_config.tokens_per_step(cfg))
        if out_env and os.path.exists(metrics) and not args.mx_metrics:
            shutil.copy(metrics, os.path.join(out_env, f"flux_wide_peer_{name}_mx_metrics.jsonl"))
        if mx_run is not None and not args.out_dir:
            shutil.rmtree(out_dir, ignore_errors=True)
        for start, recipe in cfg["phases"]:
            if start < args.iters and recipe not in mx and rows:
                notes.append(f"mxswitch metrics have no {recipe} phase")
    if not args.torch_first:
        torch_side()
    for mode, r in tres.items():
        if r.get("error"):
            notes.append(f"torch {mode} failed: {r['error']}")
    rep = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "config": args.config, "config_path": path,
        "describe": info, "cfg": cfg, "params": flux_shapes.count_params(cfg),
        "tokens_per_step": ron_config.tokens_per_step(cfg), "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "skip": args.skip, "torch_steps": args.torch_steps,
        "torch_warmup": args.torch_warmup, "args": vars(args), "torch_results": tres, "mx_run": mx_run,
        "mx_metrics_lines": n_rows, "mx_phases": mx, "rows": report_rows(mx, tres), "notes": notes,
    }
    print_report(rep)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
