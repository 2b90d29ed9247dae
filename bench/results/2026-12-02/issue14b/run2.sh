#!/bin/bash
# Second device call: the forward with two row blocks a warp at D = 128 and
# the coalesced D = rowsum(dO * o) (gpu/new) against 0beb14f (gpu/base):
# the attention checks, gpu_check's attention bench for both, torch SDPA at
# the same shapes, and ncu's detail on the two backward passes.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
gpu/new/gpu_check attention > $OUT/check_attention.log 2>&1; grep -E "^FAIL" $OUT/check_attention.log | head; tail -1 $OUT/check_attention.log
for b in base new base new; do echo "== $b"; gpu/$b/gpu_check bench attention 2>&1 | grep "BENCH attention fused"; done
/opt/torch/.venv/bin/python bench/attention_peer.py
ncu --kernel-name regex:"attn_(dq|dkdv|fwd)_mma_d128" --launch-count 3 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
  gpu/new/gpu_check bench attention > $OUT/ncu_detail.log 2>&1
grep -E "attn_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Stall|L1/TEX Hit|Shared|Executed Ipc|Block Limit|Warp Cycles Per Issued|One or More" $OUT/ncu_detail.log | head -120
