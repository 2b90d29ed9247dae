#!/bin/bash
# Session 2026-12-02b, first device call (binaries of 0beb14f): per-kernel
# device time over a window of steady-state steps (ncu, serialized), for
# flux-wide in each phase and flux-1024 in fp8; then flux-wide's host parts
# (MXSWITCH_PROFILE=host) in fp8, the phase that was data-bound.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
B=gpu/new
for c in flux-wide:100 flux-wide:1 flux-1024:1; do
  cfg=${c%%:*}; at=${c##*:}
  ncu --csv --page raw --metrics gpu__time_duration.sum --launch-skip 6000 --launch-count 2500 \
    $B/mxswitch train --config $cfg --device cuda --iters 8 --switch-at $at --out /tmp/n --overwrite > $OUT/ncu_${cfg}_$at.csv 2>&1
  echo "== ncu $cfg switch-at $at"; python3 bench/ncu_kernels.py $OUT/ncu_${cfg}_$at.csv --top 40
done
MXSWITCH_PROFILE=host $B/mxswitch train --config flux-wide --device cuda --iters 10 --switch-at 1 --out /tmp/h --overwrite > $OUT/host.log 2>&1
grep -A9 "^profile" $OUT/host.log
/opt/torch/.venv/bin/python -c "import json; print([round(json.loads(l)['step_time_ms'],1) for l in open('/tmp/h/metrics.jsonl')])"
