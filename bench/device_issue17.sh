#!/bin/bash
# Issue 17 on one H200 (no multi-GPU machine was lent): flux-small for 20
# iterations through `mxswitch launch --nproc 1` over NCCL, beside the same
# run without the launcher; then the launcher's refusals on a GPU machine.
# Logs and metrics under $OUT (the device tool's folder; defaults to ./out).
#
#   bash bench/device_issue17.sh gpu/dist     # the folder with the mxswitch binary
set -u
B=${1:?usage: bench/device_issue17.sh BIN_DIR}
. "$(dirname "$0")/device_env.sh"
# cudarc looks for libnccl.so (and .so.13, .12, ...); PyTorch's wheel ships
# only libnccl.so.2, so a link named libnccl.so goes first on the path.
LINKS=$(mktemp -d)
ln -s "$SP/nvidia/nccl/lib/libnccl.so.2" "$LINKS/libnccl.so"
export LD_LIBRARY_PATH=$LINKS:$LD_LIBRARY_PATH
nvidia-smi -L > "$OUT/gpus.txt" 2>&1; cat "$OUT/gpus.txt"
RUN="train --device cuda --config flux-small --iters 20 --switch-at 10 --recipe-check-every 5"
echo "== alone"
"$B/mxswitch" $RUN --out "$OUT/alone" > "$OUT/alone.log" 2>&1; echo "exit status $?"
tail -3 "$OUT/alone.log"
echo "== launch --nproc 1 (NCCL)"
NCCL_DEBUG=INFO "$B/mxswitch" launch --nproc 1 -- $RUN --out "$OUT/launched{rank}" > "$OUT/launched.log" 2>&1
echo "exit status $?"
grep -E "NCCL INFO (NCCL version|.*NVLS|comm )" "$OUT/launched.log" | head -5
grep -v "NCCL INFO" "$OUT/launched.log" | tail -4
"$PY" - "$OUT/alone/metrics.jsonl" "$OUT/launched0/metrics.jsonl" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
a, b = ([r for r in rs if "loss" in r] for rs in rows)
print("iters", len(a), len(b))
print("max |loss diff|", max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)))
print("recipes equal", [x["recipe"] for x in a] == [y["recipe"] for y in b])
med = lambda r: sorted(x["step_time_ms"] for x in r[2:])[len(r[2:]) // 2]
print("median step ms: alone %.2f, launched %.2f" % (med(a), med(b)))
PY
echo "== refusals"
CUDA_VISIBLE_DEVICES=0 "$B/mxswitch" launch --nproc 2 -- $RUN --out /tmp/never 2>&1 | tail -2
echo "== a failing rank on the GPU (its config is missing; the launcher made an NCCL id first)"
"$B/mxswitch" launch --nproc 1 -- train --device cuda --config /nonexistent{rank}.ron 2>&1 | tail -2
