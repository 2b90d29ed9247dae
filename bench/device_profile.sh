#!/usr/bin/env bash
# Where the time of a recipe linear goes, kernel by kernel, on the GPU
# machine; logs under $OUT. For each recipe: Nsight Systems over
# `gpu_check bench linear-large` at M = 16384, K = 3072, N = 12288 (with and
# without bias, 22 runs each), summed per kernel; then Nsight Compute on one
# launch of each quantizer kernel named below (throughput, occupancy, stalls).
#
#   bash bench/device_profile.sh gpu/new [RECIPE ...]   # default: nvfp4 fp8_rowwise fp8_block fp8
set -u
B=${1:?usage: bench/device_profile.sh BIN_DIR [RECIPE ...]}; shift
RECIPES=${*:-nvfp4 fp8_rowwise fp8_block fp8}
. "$(dirname "$0")/device_env.sh"
CU=$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1)
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}; ncu: ${NCU:-none}; cuda bin: $CU"
export GPU_CHECK_FIRST_SHAPE=1
for r in $RECIPES; do
  echo "== $r"
  if [ -n "$NSYS" ]; then
    GPU_CHECK_RECIPES=$r "$NSYS" profile -t cuda --force-overwrite true -o "$OUT/nsys_$r" \
      "$B/gpu_check" bench linear-large > "$OUT/nsys_$r.log" 2>&1
    grep BENCH "$OUT/nsys_$r.log"
    "$NSYS" stats -q -r cuda_gpu_kern_sum -f csv -o "$OUT/kern_$r" "$OUT/nsys_$r.nsys-rep" > /dev/null 2>&1
    "$PY" - "$OUT/kern_${r}_cuda_gpu_kern_sum.csv" <<'PYEOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
for r in rows[:14]:
    t = float(r["Total Time (ns)"])
    print(f'{t / tot * 100:5.1f}% {int(r["Instances"]):6d} x {float(r["Med (ns)"]) / 1e3:9.1f} us  {r["Name"][:110]}')
PYEOF
  else
    GPU_CHECK_RECIPES=$r "$B/gpu_check" bench linear-large
  fi
done
if [ -n "$NCU" ]; then
  for k in nvfp4_tile_bf16 fp8g_encode2d_bf16 fp8g_amax2d_bf16 lin_epilogue lin_colsum_partial; do
    echo "== ncu $k"
    GPU_CHECK_RECIPES=nvfp4,fp8_rowwise "$NCU" --kernel-name regex:$k --launch-skip 4 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats "$B/gpu_check" bench linear-large > "$OUT/ncu_$k.log" 2>&1
    grep -E "^  [a-z_0-9]+\(|Duration|Throughput|Achieved Occupancy|Registers Per|Block Limit|Issued Ipc|No Eligible|Warp Cycles Per Issued|Shared Memory Config" "$OUT/ncu_$k.log" | head -40
  done
fi
