#!/usr/bin/env bash
# The device check: the heavy model on ONNX Runtime CPU, CUDA FP32/FP16 and TensorRT
# FP16 where each loads, the worker's own inference stage at the same settings, and
# PyTorch on the GPU with the same weights as the device's ceiling (benchmarks/gpu_check.py
# says what it measures). Prepared for an NVIDIA H200 machine whose python3 has PyTorch,
# numpy, onnx and CPU onnxruntime but not pydantic or orjson and no network: run
# `bash benchmarks/gpu_prepare.sh` here first, carry .whl and .gpu, then there:
#     bash benchmarks/gpu_check.sh --json "$OUT/gpu_check.json"
# Without a GPU it runs the CPU rows and lists the rows it skipped and why.
# Flags go to benchmarks/gpu_check.py (--budget-s, --json, --model, --fp16-model).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SITE="${STREAMFER_GPU_SITE:-/tmp/streamfer-gpu-site}"
if ! "$PY" -c "import pydantic, orjson" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed $(ls .whl | wc -l) carried wheels into $SITE" >&2
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
command -v nvidia-smi > /dev/null \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 \
    || echo "gpu_check: no nvidia-smi here" >&2
PYTHONUNBUFFERED=1 exec "$PY" -m benchmarks.gpu_check "$@"
