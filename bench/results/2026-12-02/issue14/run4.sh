#!/bin/bash
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
B=gpu/new; PY=/opt/torch/.venv/bin/python
$B/gpu_check > $OUT/gpu_check.log 2>&1; grep -E "^FAIL" $OUT/gpu_check.log | head; tail -1 $OUT/gpu_check.log
for c in flux-wide:1 flux-wide:100; do
  cfg=${c%%:*}; at=${c##*:}
  MXSWITCH_PROFILE=host $B/mxswitch train --config $cfg --device cuda --iters 6 --switch-at $at --out /tmp/h --overwrite > $OUT/host_${cfg}_$at.log 2>&1
  echo "== $cfg switch-at $at"; grep -A9 "^profile" $OUT/host_${cfg}_$at.log
done
for c in flux-wide flux-1024 flux-small; do
  M=eager,compile; [ $c = flux-small ] && M=eager
  $PY bench/flux_wide_peer.py --bin $B --config $c --modes $M --iters 12 --switch-at 6 --json $OUT/$c.json --out-dir /tmp/peer_$c > $OUT/$c.log 2>&1; cp /tmp/peer_$c/metrics.jsonl $OUT/${c}_mx_metrics.jsonl
  grep -A3 "^phase" $OUT/$c.log
done
