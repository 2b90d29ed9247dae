#!/bin/bash
# Issue 14's device measurements in one call, logs under $OUT (the device
# tool's output folder; defaults to ./out): gpu_check (every suite), the host
# parts of the flux-wide step in both phases (MXSWITCH_PROFILE=host), and
# mxswitch beside PyTorch eager and torch.compile at flux-wide, flux-1024
# and flux-small (eager only: its targets are against eager).
#
#   bash bench/device_issue14.sh gpu/new     # the folder with mxswitch and gpu_check
#   SKIP_GPU_CHECK=1 bash bench/device_issue14.sh gpu/new   # gpu_check already ran (device_issue18.sh)
set -u
B=${1:?usage: bench/device_issue14.sh BIN_DIR}
. "$(dirname "$0")/device_env.sh"
if [ -z "${SKIP_GPU_CHECK:-}" ]; then
  "$B/gpu_check" > "$OUT/gpu_check.log" 2>&1; grep -E "^FAIL" "$OUT/gpu_check.log" | head; tail -1 "$OUT/gpu_check.log"
fi
for at in 1 100; do
  MXSWITCH_PROFILE=host "$B/mxswitch" train --config flux-wide --device cuda --iters 8 --switch-at $at \
    --out /tmp/host_$at --overwrite > "$OUT/host_flux-wide_$at.log" 2>&1
  echo "== flux-wide, switch at $at"; grep -A9 "^profile" "$OUT/host_flux-wide_$at.log"
  "$PY" -c "import json,sys; print([round(json.loads(l)['step_time_ms'],1) for l in open(sys.argv[1])])" /tmp/host_$at/metrics.jsonl
done
for c in flux-wide flux-1024 flux-small; do
  M=eager,compile; [ $c = flux-small ] && M=eager
  "$PY" bench/flux_wide_peer.py --bin "$B" --config $c --modes $M --iters 12 --switch-at 6 \
    --json "$OUT/$c.json" --out-dir /tmp/peer_$c > "$OUT/$c.log" 2>&1
  cp /tmp/peer_$c/metrics.jsonl "$OUT/${c}_mx_metrics.jsonl"
  grep -A3 "^phase" "$OUT/$c.log"
  "$PY" -c "import json,sys; print([round(json.loads(l)['step_time_ms'],1) for l in open(sys.argv[1])])" "$OUT/${c}_mx_metrics.jsonl"
done
