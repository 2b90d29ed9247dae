#!/bin/bash
# Fourth device call: the merge of the ROCm driver layer (5c9205a + fit.rs
# fix) on CUDA: every gpu_check suite, then flux-wide and flux-1024 steps.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
gpu/new/gpu_check > $OUT/gpu_check.log 2>&1; grep -E "^FAIL" $OUT/gpu_check.log | head; tail -1 $OUT/gpu_check.log
for c in flux-wide flux-1024; do
  gpu/new/mxswitch train --config $c --device cuda --iters 10 --switch-at 5 --out /tmp/r_$c --overwrite 2>&1 | tail -2
  /opt/torch/.venv/bin/python -c "import json,sys; print('$c', [round(json.loads(l)['step_time_ms'],1) for l in open('/tmp/r_$c/metrics.jsonl')])"
done
