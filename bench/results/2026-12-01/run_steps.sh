#!/bin/bash
# Device run: the GPU check harness, the ignored GPU test, and step times of the
# baseline (before issue 12) and new binaries, interleaved, in one run.
SP=/opt/torch/.venv/lib/python3.12/site-packages; export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')$LD_LIBRARY_PATH
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
if [ -z "$STEPS_ONLY" ]; then ( time gpu/new/gpu_check ) > $OUT/gpu_check.log 2>&1; echo "gpu_check rc $?" >> $OUT/gpu_check.log; tail -3 $OUT/gpu_check.log; fi
if [ -z "$STEPS_ONLY" ]; then gpu/new/cuda_test --ignored > $OUT/cuda_test.log 2>&1; echo "cuda_test rc $?" >> $OUT/cuda_test.log; tail -3 $OUT/cuda_test.log; fi
for round in 1 2 3 4 5; do
  for b in baseline new; do
    gpu/$b/mxswitch train --device cuda --config flux-small --iters 60 --switch-at 30 --out $OUT/small-$b-$round > $OUT/small-$b-$round.log 2>&1 || echo "small $b $round failed" >> $OUT/fail.txt
    gpu/$b/mxswitch train --device cpu --config flux-tiny --iters 40 --out $OUT/tiny-$b-$round > $OUT/tiny-$b-$round.log 2>&1 || echo "tiny $b $round failed" >> $OUT/fail.txt
  done
done
python3 - <<'PY' > $OUT/steps.txt
import json, os, statistics as st
agg = {}
out = os.environ["OUT"]
for cfg in ["small", "tiny"]:
    for b in ["baseline", "new"]:
        for r in [1, 2, 3, 4, 5]:
            p = f"{out}/{cfg}-{b}-{r}/metrics.jsonl"
            if not os.path.exists(p):
                print(cfg, b, r, "missing"); continue
            rows = [json.loads(l) for l in open(p)]
            by = {}
            for m in rows[1:]:
                by.setdefault(m["recipe"], []).append(m["step_time_ms"])
            print(cfg, b, r, {k: round(st.median(v), 2) for k, v in by.items()}, "loss", rows[0]["loss"], "->", rows[-1]["loss"])
            for k, v in by.items():
                agg.setdefault((cfg, k, b), []).append(st.median(v))
print("median over rounds of the per-run medians (ms); ratio new/baseline")
for (cfg, k, b), v in sorted(agg.items()):
    if b == "new":
        base = st.median(agg[(cfg, k, "baseline")]); new = st.median(v)
        print(f"{cfg} {k}: baseline {base:.2f}  new {new:.2f}  ratio {new/base:.3f}")
PY
cat $OUT/steps.txt; cat $OUT/fail.txt 2>/dev/null
