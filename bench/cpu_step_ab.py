#!/usr/bin/env python3
"""The CPU training step of two mxswitch binaries, A/B in one run.

Runs `BIN train --config C --iters N` alternately with --base and --new,
--rounds times each, takes the median step_time_ms of each run (after its
first --skip iterations), and prints the median over runs per binary, the
ratio new / base and the median of the paired ratios. Alternating keeps a
noisy machine's drift out of the ratio. Issue 14's target: the flux-tiny
step is no slower than before (ratio <= 1).

    git worktree add /tmp/base f0dc0e4 && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release --bins)
    cargo build --release --bins
    python bench/cpu_step_ab.py --base /tmp/base-target/release/mxswitch --new target/release/mxswitch
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_once(binary, config, iters, skip):
    with tempfile.TemporaryDirectory() as out:
        cmd = [binary, "train", "--config", config, "--iters", str(iters), "--out", out, "--overwrite"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            times = [json.loads(line)["step_time_ms"] for line in f]
    return statistics.median(times[skip:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the baseline mxswitch binary")
    ap.add_argument("--new", required=True, help="the mxswitch binary measured against it")
    ap.add_argument("--config", default="flux-tiny")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--skip", type=int, default=3, help="iterations skipped at the start of each run")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    if a.iters <= a.skip:
        sys.exit("--iters must exceed --skip")
    base, new = [], []
    for i in range(a.rounds):
        base.append(run_once(a.base, a.config, a.iters, a.skip))
        new.append(run_once(a.new, a.config, a.iters, a.skip))
        print(f"round {i + 1}/{a.rounds}: base {base[-1]:.3f} ms, new {new[-1]:.3f} ms", flush=True)
    mb, mn = statistics.median(base), statistics.median(new)
    paired = statistics.median(n / b for n, b in zip(new, base))
    print(f"{a.config}: base {mb:.3f} ms, new {mn:.3f} ms (medians of {a.rounds} runs); "
          f"new / base {mn / mb:.3f}, paired median {paired:.3f}")


if __name__ == "__main__":
    main()
