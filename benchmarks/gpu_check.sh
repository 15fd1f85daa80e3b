#!/usr/bin/env bash
# The device check: the heavy model on ONNX Runtime CPU, CUDA FP32/FP16 and TensorRT
# FP16 where each loads, the worker's own inference stage at the same settings, and
# PyTorch on the GPU with the same weights as the device's ceiling (benchmarks/gpu_check.py
# says what it measures). Prepared for an NVIDIA H200 machine whose python3 (3.12) has
# PyTorch (with its CUDA 13 libraries), numpy, onnx and CPU onnxruntime but not pydantic,
# orjson or onnxruntime-gpu, and no network: run `bash benchmarks/gpu_prepare.sh` here
# first, make the device calls it prints (benchmarks/README.md), the last of which runs
#     bash benchmarks/gpu_check.sh --json "$OUT/gpu_check.json"
# Before the check it
# - joins the onnxruntime-gpu wheel from the pieces the earlier calls stored in
#   STREAMFER_GPU_PIECES (default /tmp/streamfer-pieces), if any, and stops naming any
#   piece that is missing or corrupted;
# - installs that wheel and, unless pydantic and orjson import already, the carried .whl/
#   into STREAMFER_GPU_SITE (pip --no-index), put first on PYTHONPATH so that it is
#   imported rather than the image's CPU onnxruntime;
# - puts the CUDA libraries of python3's own NVIDIA wheels (PyTorch's: cudart, cuBLAS,
#   cuDNN, cuFFT, cuRAND, NVRTC) and TENSORRT_LIBS, if set, on LD_LIBRARY_PATH. Without
#   libnvinfer.so.10 (TensorRT 10, which the device lacks and PyPI has no wheel of) the
#   TensorRT rows are skipped with the library's own error; the CUDA rows run.
# Without a GPU it runs the CPU rows and lists the rows it skipped and why.
# Flags go to benchmarks/gpu_check.py (--budget-s, --json, --model, --fp16-model).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SITE="${STREAMFER_GPU_SITE:-/tmp/streamfer-gpu-site}"
PIECES="${STREAMFER_GPU_PIECES:-/tmp/streamfer-pieces}"
wheels=()
if [ -f "$PIECES/manifest.json" ]; then
    wheels+=("$("$PY" -m benchmarks.pieces join "$PIECES" --out "$PIECES.joined")")
fi
if ! "$PY" -c "import pydantic, orjson" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
    wheels+=(.whl/*.whl)
fi
if [ "${#wheels[@]}" -gt 0 ]; then
    started=$SECONDS
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed ${#wheels[@]} wheels into $SITE in $((SECONDS - started)) s" >&2
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
libs="$("$PY" - <<'PYEOF'
import glob
import os
import site

found = (glob.glob(os.path.join(s, "nvidia", "**", "lib*.so*"), recursive=True)
         for s in site.getsitepackages())
print(":".join(sorted({os.path.dirname(p) for paths in found for p in paths})))
PYEOF
)"
libs="${TENSORRT_LIBS:-}${TENSORRT_LIBS:+${libs:+:}}$libs"
if [ -n "$libs" ]; then
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu_check: LD_LIBRARY_PATH has $(tr ':' '\n' <<< "$libs" | wc -l) NVIDIA library folders" >&2
fi
command -v nvidia-smi > /dev/null \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 \
    || echo "gpu_check: no nvidia-smi here" >&2
PYTHONUNBUFFERED=1 exec "$PY" -m benchmarks.gpu_check "$@"
