#!/usr/bin/env bash
# The unit tests against the lowest version of every runtime dependency that
# pyproject.toml allows (each ">=X" pinned to "==X"), in a venv of their own
# (.venv-floors): a floor that is not true fails here. Flags go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv-floors/bin/python ]; then
    "$PY" -m venv .venv-floors
fi
.venv-floors/bin/python -m pip install -q --upgrade pip
.venv-floors/bin/python - > .venv-floors/floors.txt <<'PYEOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for dep in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?>=([^,;\s]+)", dep.split("#")[0].strip())
    if m is None:
        raise SystemExit(f"floors.sh: cannot read a floor from {dep!r}")
    print(f"{m.group(1)}=={m.group(3)}")
PYEOF
echo "streamfer floors: $(tr '\n' ' ' < .venv-floors/floors.txt)"
# The tests export their models with skl2onnx; newer exporters stamp an opset (22) that
# the oldest onnxruntime allowed (1.18, opset 21) refuses, so they stay contemporary.
printf 'onnx<1.17\nskl2onnx<1.18\nscikit-learn<1.6\nprotobuf<5\nscipy<1.15\n' >> .venv-floors/floors.txt
# The demo extra builds the tests' models; its packages may be any version that fits.
.venv-floors/bin/python -m pip install -q -c .venv-floors/floors.txt -e '.[demo,registry]' \
    pytest pytest-timeout hypothesis jsonschema pyarrow matplotlib
.venv-floors/bin/python -m pip check
exec .venv-floors/bin/python -m pytest -q tests/unit "$@"
