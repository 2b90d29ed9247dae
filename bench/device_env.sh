# Sourced by the bench/device_*.sh scripts on the GPU machine: the output
# folder ($OUT, the device tool's; ./out elsewhere), PyTorch's CUDA 13
# libraries on the loader's path (cudarc loads libcuda, NVRTC, cuBLASLt and
# NCCL from there) and PyTorch's Python.
OUT=${OUT:-out}; mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
PY=${PY:-/opt/torch/.venv/bin/python}
