#!/usr/bin/env bash
# Issue 18's device measurements in one call, logs under $OUT: every GPU
# check, the recipe linears beside PyTorch's BF16 F.linear (gpu_peer.py runs
# `gpu_check bench quantize linear-large`), PyTorch's FP8 rowwise linear
# (the fp8_rowwise peer), and flux-small trained through
# [nvfp4 @ 0, fp8_block @ 40] on the GPU.
#
#   bash bench/device_issue18.sh gpu/new   # the folder with mxswitch and gpu_check
set -u
B=${1:?usage: bench/device_issue18.sh BIN_DIR}
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== gpu_check (every suite)"
"$B/gpu_check" > "$OUT/gpu_check.log" 2>&1; echo "exit $?"
grep -E "^FAIL" "$OUT/gpu_check.log" | head; tail -1 "$OUT/gpu_check.log"

echo "== recipe linears beside torch BF16 F.linear"
"$PY" bench/gpu_peer.py --bin "$B" --json "$OUT/gpu_peer.json" > "$OUT/gpu_peer.log" 2>&1; echo "exit $?"
grep -E "^[0-9]+x[0-9]+ " "$OUT/gpu_peer.log"

echo "== torch FP8 rowwise linear (the fp8_rowwise peer)"
"$PY" bench/fp8_rowwise_peer.py > "$OUT/fp8_rowwise_peer.log" 2>&1; echo "exit $?"
tail -8 "$OUT/fp8_rowwise_peer.log"

echo "== flux-small through [nvfp4 @ 0, fp8_block @ 40]"
"$B/mxswitch" train --device cuda --config tests/configs/flux-small-nvfp4.ron \
    --out /tmp/flux-small-nvfp4 --overwrite > "$OUT/flux_small_nvfp4.log" 2>&1; echo "exit $?"
grep -E "warm-up|now|trained|error" "$OUT/flux_small_nvfp4.log" | tail -6
cp /tmp/flux-small-nvfp4/metrics.jsonl "$OUT/flux_small_nvfp4_metrics.jsonl" 2>/dev/null
"$PY" - "$OUT/flux_small_nvfp4_metrics.jsonl" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
loss = [r["loss"] for r in rows]
mean = lambda v: sum(v) / len(v)
print(f"loss first 5 {mean(loss[:5]):.4f}, last 5 {mean(loss[-5:]):.4f} ({mean(loss[-5:]) / mean(loss[:5]):.2f}x); "
      f"30-39 {mean(loss[30:40]):.4f}, 40-49 {mean(loss[40:50]):.4f} ({mean(loss[40:50]) / mean(loss[30:40]):.2f}x)")
for rec in sorted({r["recipe"] for r in rows}):
    t = [r["step_time_ms"] for r in rows if r["recipe"] == rec][2:]
    print(f"{rec}: median step {statistics.median(t):.1f} ms over {len(t)} steps, "
          f"saved bytes/element {[r['saved_bytes_per_element'] for r in rows if r['recipe'] == rec][0]:.4f}")
PYEOF
