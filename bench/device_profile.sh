#!/usr/bin/env bash
# Where the time of a recipe linear goes, kernel by kernel, on the GPU
# machine (Nsight Compute from the CUDA toolkit); logs under $OUT.
# For each recipe: the kernels of one forward + backward at M = 16384,
# K = 3072, N = 12288 (`gpu_check bench linear-large` limited by
# GPU_CHECK_RECIPES / GPU_CHECK_FIRST_SHAPE; launches 80 to 111, past the
# warm-up), each with its duration at the GPU's own clocks. Then the
# throughput, occupancy and warp stalls of one launch of each quantizer
# kernel named in KERNELS.
#
#   bash bench/device_profile.sh BIN_DIR [RECIPE ...]   # default: nvfp4 fp8_rowwise fp8_block fp8
set -u
B=${1:?usage: bench/device_profile.sh BIN_DIR [RECIPE ...]}; shift
RECIPES=${*:-nvfp4 fp8_rowwise fp8_block fp8}
KERNELS=${KERNELS:-nvfp4_tile_bf16 fp8g_encode2d_bf16 fp8g_amax2d_bf16 lin_epilogue lin_colsum_partial}
. "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "device_profile: no ncu found"; exit 2; }
export GPU_CHECK_FIRST_SHAPE=1
for r in $RECIPES; do
  echo "== $r: one forward + backward"
  GPU_CHECK_RECIPES=$r "$NCU" --clock-control none --launch-skip 80 --launch-count 32 \
    --section SpeedOfLight "$B/gpu_check" bench linear-large > "$OUT/timeline_$r.log" 2>&1
  grep -E "^  [a-zA-Z_0-9]+.*\(|Duration" "$OUT/timeline_$r.log" | paste - - |
    awk '{printf "%-60s %8s %s\n", substr($1, 1, 60), $NF, $(NF-1)}'
done
for k in $KERNELS; do
  echo "== $k"
  GPU_CHECK_RECIPES=nvfp4,fp8_block "$NCU" --kernel-name regex:$k --launch-skip 4 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis "$B/gpu_check" bench linear-large > "$OUT/ncu_$k.log" 2>&1
  grep -E "^  [a-z_0-9]+ \(|Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|highest-utilized" \
    "$OUT/ncu_$k.log" | head -20
done
