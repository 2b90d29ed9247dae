#!/bin/bash
# gpu-fp8group's device call for the tiled quantizer (issue 18 speed):
# linear-large (bf16, fp8, mxfp4, mxfp8, fp8_rowwise, fp8_block at M = 16384)
# and PyTorch's peer (BF16 F.linear and FP8 rowwise _scaled_mm) at the
# same shapes, logs under $OUT.
set -u
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
B=.devbin-fp8g
PY=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/smi.txt
T0=$(date +%s)
timeout 170 $B/gpu_check > $OUT/gpu_check.log 2>&1; echo "gpu_check rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E '^FAIL' $OUT/gpu_check.log | cut -c1-400 | head -30
grep -E 'fp8 (group|rowwise|1x128|128x128)|INFO|fp8_rowwise|fp8_block|fp8_block\)|summary' $OUT/gpu_check.log | cut -c1-300
T1=$(date +%s)
timeout 40 $B/gpu_check bench linear-large > $OUT/bench_linear_large.log 2>&1; echo "bench rc=$? ($(( $(date +%s) - T1 )) s)"
grep -E 'BENCH|\(|FAIL' $OUT/bench_linear_large.log
for s in "3072 12288 70" "12288 3072 40" "3072 3072 35"; do
  set -- $s
  timeout $3 $PY bench/fp8_rowwise_peer.py --m 16384 --k $1 --n $2 > $OUT/fp8_rowwise_peer_k$1_n$2.log 2>&1; echo "peer K=$1 N=$2 rc=$?"
  grep -vi warn $OUT/fp8_rowwise_peer_k$1_n$2.log | grep -v 'return Variable' 
done
echo "total $(( $(date +%s) - T0 )) s"
