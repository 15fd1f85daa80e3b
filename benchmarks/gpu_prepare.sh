#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on the device machine that the machine cannot make
# (it has no network and no skl2onnx), written here into two
# git-ignored folders of at most ~25 MiB together, to be carried with each run:
#   .whl/  the wheels worker.inference.engine imports that its image lacks (pydantic, pydantic-core,
#          annotated-types, typing-inspection, typing-extensions, orjson), for CPython
#          3.12 on manylinux x86-64, at the versions this checkout's venv tests with;
#   .gpu/  the heavy benchmark model (benchmarks.models.make_model("heavy")) and its FP16
#          copy (the model tools' converter, float32 inputs and outputs kept).
# Needs pip and the dev extra (scikit-learn, skl2onnx, onnx) here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir -p .whl .gpu
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions orjson; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$name==$(version "$name")"
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
ls -l .whl .gpu
