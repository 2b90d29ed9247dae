#!/bin/bash
# Checks and measurements at this commit: gpu_check, per-phase profiles, torch peers.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
B=gpu/new; PY=/opt/torch/.venv/bin/python
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
$B/gpu_check > $OUT/gpu_check.log 2>&1; grep -E "^FAIL" $OUT/gpu_check.log | head; tail -1 $OUT/gpu_check.log
for ph in mxfp4:100 fp8:1; do
  name=${ph%%:*}; at=${ph##*:}
  MXSWITCH_PROFILE=1 $B/mxswitch train --config flux-wide --device cuda --iters 5 --switch-at $at --out /tmp/p_$name --overwrite > $OUT/profile_wide_$name.log 2>&1
  grep -A30 "^profile" $OUT/profile_wide_$name.log | head -32
done
MXSWITCH_PROFILE=1 $B/mxswitch train --config flux-1024 --device cuda --iters 4 --switch-at 1 --out /tmp/p_1024 --overwrite > $OUT/profile_1024_fp8.log 2>&1
grep -A30 "^profile" $OUT/profile_1024_fp8.log | head -32
for c in flux-wide flux-1024; do
  $PY bench/flux_wide_peer.py --bin $B --config $c --iters 12 --switch-at 6 --json $OUT/$c.json --out-dir /tmp/peer_$c > $OUT/$c.log 2>&1; cp /tmp/peer_$c/metrics.jsonl $OUT/${c}_mx_metrics.jsonl
  tail -9 $OUT/$c.log
done
