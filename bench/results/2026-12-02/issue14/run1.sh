#!/bin/bash
# Diagnostics: epilogue check + linear bench, per-phase profiles, nsys kernel summary.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
B=gpu/new
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/smi.txt
(which nsys; ls /usr/local/cuda*/bin 2>/dev/null | head -50; ls /opt 2>/dev/null) > $OUT/tools.txt 2>&1
$B/gpu_check linear > $OUT/check_linear.log 2>&1; tail -3 $OUT/check_linear.log
$B/gpu_check bench linear-large > $OUT/bench_linear_large.log 2>&1; grep BENCH $OUT/bench_linear_large.log
for ph in mxfp4:100 fp8:0; do
  name=${ph%%:*}; at=${ph##*:}
  MXSWITCH_PROFILE=1 $B/mxswitch train --config flux-wide --device cuda --iters 5 --switch-at $at --out /tmp/p_$name --overwrite > $OUT/profile_wide_$name.log 2>&1
  tail -32 $OUT/profile_wide_$name.log | head -40
done
MXSWITCH_PROFILE=1 $B/mxswitch train --config flux-1024 --device cuda --iters 4 --switch-at 0 --out /tmp/p_1024 --overwrite > $OUT/profile_1024_fp8.log 2>&1
tail -30 $OUT/profile_1024_fp8.log
NSYS=$(which nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  $NSYS profile -o /tmp/nsw --force-overwrite true -t cuda $B/mxswitch train --config flux-wide --device cuda --iters 4 --switch-at 0 --out /tmp/p_n --overwrite > $OUT/nsys_run.log 2>&1
  $NSYS stats --report cuda_gpu_kern_sum --format csv /tmp/nsw.nsys-rep > $OUT/nsys_kern_fp8.csv 2>&1
  head -40 $OUT/nsys_kern_fp8.csv
else
  echo "no nsys"
fi
