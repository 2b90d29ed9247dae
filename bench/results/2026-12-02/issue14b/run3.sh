#!/bin/bash
# Third device call (binaries of 8781ed4 in gpu/new, 0beb14f in gpu/base):
# the attention checks first (stop on a failure), gpu_check's attention
# bench for both binaries, then the standard issue-14 bench on gpu/new.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
gpu/new/gpu_check attention > $OUT/check_attention.log 2>&1; tail -1 $OUT/check_attention.log
if grep -q "^FAIL" $OUT/check_attention.log; then grep -E "^FAIL" $OUT/check_attention.log | head -20; exit 1; fi
for b in base new base new; do echo "== $b"; gpu/$b/gpu_check bench attention 2>&1 | grep "BENCH attention fused"; done
bash bench/device_issue14.sh gpu/new
