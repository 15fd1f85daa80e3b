#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on the device machine that the machine cannot make
# (it has no network and no skl2onnx), written here into git-ignored folders:
#   .whl/        the wheels worker.inference.engine imports that its image lacks (pydantic,
#                pydantic-core, annotated-types, typing-inspection, typing-extensions,
#                orjson), for CPython 3.12 on manylinux x86-64, at the versions this
#                checkout's venv tests with;
#   .gpu/        the heavy benchmark model (benchmarks.models.make_model("heavy")) and its
#                FP16 copy (the model tools' converter, float32 inputs and outputs kept);
#   .gpu-wheel/  onnxruntime-gpu (ORT_GPU_VERSION, default 1.31.1: built for CUDA 13, whose
#                libraries the device's PyTorch brings, so no NVIDIA wheel travels), checked
#                against the index's SHA-256; kept, so a rerun does not fetch it again;
#   .gpu-pieces/ that wheel cut into folders 01, 02... of one piece each (PIECE_BYTES,
#                default 56 MiB, so that a piece and the working tree fit the 64 MiB a
#                device call carries), each with the manifest (python3 -m benchmarks.pieces).
# Then it prints the device calls, one per piece, as the run tool takes them (also in
# .gpu-pieces/calls.txt); benchmarks/README.md says how to make them. GPU_PIECES=0 skips
# onnxruntime-gpu (a GPU host that has it installed needs only .whl and .gpu).
# TensorRT's libraries (libnvinfer.so.10: tensorrt-cu13-libs) have no wheel on PyPI, only
# on NVIDIA's index, so they are not prepared: the TensorRT rows say they were skipped.
# Needs pip, network access to PyPI and the dev extra (scikit-learn, skl2onnx, onnx) here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ORT_GPU_VERSION="${ORT_GPU_VERSION:-1.31.1}"
PIECE_BYTES="${PIECE_BYTES:-$((56 * 1024 * 1024))}"
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux1_x86_64)
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir -p .whl .gpu
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions orjson; do
    "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d .whl "$name==$(version "$name")"
done
PYTHONPATH="$PWD" "$PY" - <<'PYEOF'
from pathlib import Path

from benchmarks.gpu_check import make_fp16
from benchmarks.models import make_model

model = make_model("heavy", Path(".gpu")).path
if make_fp16(model, Path(".gpu/heavy-fp16.onnx")) is None:
    raise SystemExit("gpu_prepare: the FP16 copy needs onnx (pip install 'streamfer[tools]')")
PYEOF
du -ch .whl .gpu | tail -1
if [ "${GPU_PIECES:-1}" = 0 ]; then
    exit 0
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# The index entry alone (metadata and SHA-256, not the 255 MB wheel), for the selection.
"$PY" -m pip install -q --dry-run --ignore-installed --no-deps "${TARGET[@]}" \
    --target "$scratch/t" --report "$scratch/report.json" "onnxruntime-gpu==$ORT_GPU_VERSION"
read -r _url sha file < <("$PY" -m benchmarks.gpu_wheel select "$scratch/report.json")
mkdir -p .gpu-wheel
if ! echo "$sha  .gpu-wheel/$file" | sha256sum -c --status 2> /dev/null; then
    find .gpu-wheel -name '*.whl' -delete
    "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d .gpu-wheel "onnxruntime-gpu==$ORT_GPU_VERSION"
    echo "$sha  .gpu-wheel/$file" | sha256sum -c --quiet
fi
"$PY" -m benchmarks.pieces split ".gpu-wheel/$file" --out .gpu-pieces --max-bytes "$PIECE_BYTES"
"$PY" -m benchmarks.gpu_wheel plan .gpu-pieces --last .whl --last .gpu > "$scratch/calls.txt"
mv "$scratch/calls.txt" .gpu-pieces/calls.txt
cat .gpu-pieces/calls.txt
