#!/bin/bash
# Linear benches (baseline cuda_linear_check --bench vs new gpu_check bench linear-large),
# alternating, then flux-small step times over longer runs and one profile each.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
cd "$(dirname "$0")/.."
for r in 1 2; do
  gpu/baseline/cuda_linear_check --bench > $OUT/lin-baseline-$r.log 2>&1
  gpu/new/gpu_check bench linear-large > $OUT/lin-new-$r.log 2>&1
done
grep -h "BENCH" $OUT/lin-baseline-1.log | head -40 > $OUT/lin-summary.txt
echo ---- >> $OUT/lin-summary.txt
grep -h "BENCH" $OUT/lin-new-1.log | head -40 >> $OUT/lin-summary.txt
for r in 1 2 3; do
  for b in baseline new; do
    gpu/$b/mxswitch train --device cuda --config flux-small --iters 120 --switch-at 60 --out $OUT/s-$b-$r > /dev/null 2>&1 || echo "s $b $r failed" >> $OUT/fail.txt
  done
done
for b in baseline new; do
  MXSWITCH_PROFILE=1 gpu/$b/mxswitch train --device cuda --config flux-small --iters 20 --switch-at 1 --out $OUT/p-$b > $OUT/profile-$b.log 2>&1
done
python3 - <<'PY' > $OUT/steps2.txt
import json, os, statistics as st
out = os.environ["OUT"]; agg = {}
for b in ["baseline", "new"]:
    for r in [1, 2, 3]:
        rows = [json.loads(l) for l in open(f"{out}/s-{b}-{r}/metrics.jsonl")]
        by = {}
        for m in rows[2:]:
            by.setdefault(m["recipe"], []).append(m["step_time_ms"])
        for k, v in by.items():
            agg.setdefault((k, b), []).append(st.median(v))
        print(b, r, {k: round(st.median(v), 2) for k, v in by.items()})
for k in ["mxfp4", "fp8"]:
    base, new = st.median(agg[(k, "baseline")]), st.median(agg[(k, "new")])
    print(f"flux-small {k}: baseline {base:.2f} ms, new {new:.2f} ms, new/baseline {new/base:.3f}")
PY
cat $OUT/steps2.txt; cat $OUT/lin-summary.txt
for f in $OUT/s-*/; do rm -f $f/checkpoint.safetensors $f/loss.png; done; rm -rf $OUT/p-*
