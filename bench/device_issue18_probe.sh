#!/usr/bin/env bash
# One device call for issue 18's questions and a check of this session's
# tree on the GPU. Run from the repo root on the GPU machine:
#   bash bench/device_issue18_probe.sh gpu/new
# gpu/new holds the stripped `mxswitch` and `gpu_check` built with
# --features cuda; gpu/wheels holds torchao 0.18's and ml_dtypes' wheels.
set -u
BIN=${1:-gpu/new}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== 1. NVFP4 golden vectors from torchao 0.18 (CPU tensors)"
rm -rf /tmp/pydeps && mkdir -p /tmp/pydeps
$PY -m pip install --no-deps --no-index --target /tmp/pydeps gpu/wheels/*.whl >/dev/null 2>&1 || echo "pip install of the wheels failed"
$PY -c "import torch; print('torch', torch.__version__)"
mkdir -p "$OUT/golden"
PYTHONPATH=/tmp/pydeps $PY runtime/tests/golden/gen_golden_nvfp4.py "$OUT/golden" --torchao-path /tmp/pydeps 2>&1 | tail -15
ls -la "$OUT/golden"

echo "== 2. cuBLASLt FP8 scale modes (rowwise, 128-block) on this GPU"
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
echo "nvcc: $NVCC"
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
"$NVCC" -O2 -std=c++17 -o /tmp/scale_modes bench/cublaslt_scale_modes.cu -L"$CUDA_HOME/lib64" -lcublasLt 2>&1 | tail -20
LD_LIBRARY_PATH=$CUDA_HOME/lib64:$LD_LIBRARY_PATH /tmp/scale_modes 2>&1 | tee "$OUT/scale_modes.log"

echo "== 3. this tree on the GPU: gpu_check and a flux-tiny run through the switch"
"$BIN/gpu_check" > "$OUT/gpu_check.log" 2>&1; echo "gpu_check exit $?"
grep -E "passed|failed" "$OUT/gpu_check.log" | tail -3
"$BIN/mxswitch" train --config flux-tiny --device cuda --iters 80 --out /tmp/run-cuda 2>&1 | grep -E "warm-up|now|trained|error" | tail -5
