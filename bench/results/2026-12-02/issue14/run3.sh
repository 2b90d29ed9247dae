#!/bin/bash
# Host parts of the step without device waits (MXSWITCH_PROFILE=host).
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
B=gpu/new
for c in flux-wide:1 flux-wide:100 flux-1024:1; do
  cfg=${c%%:*}; at=${c##*:}
  MXSWITCH_PROFILE=host $B/mxswitch train --config $cfg --device cuda --iters 6 --switch-at $at --out /tmp/h --overwrite > $OUT/host_${cfg}_$at.log 2>&1
  echo "== $cfg switch-at $at"; grep -A12 "^profile" $OUT/host_${cfg}_$at.log
  python3 -c "
import json,statistics
r=[json.loads(l) for l in open('/tmp/h/metrics.jsonl')]
print('step ms', [round(x['step_time_ms'],1) for x in r])"
done
