"""The Get-started walk-through, run as written: every titled file of
``docs/get-started/first-pipeline.md`` is written to an empty folder, and every
``python`` and ``streamfer`` line of its shell blocks runs there in order (``streamfer
run`` in the background), against the suite's real Kafka and Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "get-started" / "first-pipeline.md"
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```', re.M | re.S)


def walk_through() -> tuple[dict[str, str], list[str]]:
    """The page's files (title -> text) and its commands, in page order."""
    files: dict[str, str] = {}
    commands: list[str] = []
    for lang, title, body in FENCE.findall(PAGE.read_text()):
        if title:
            files[title] = body
        elif lang == "sh":
            commands += [
                line.split("#")[0].strip()
                for line in body.splitlines()
                if line.startswith(("python ", "streamfer "))
            ]
    return files, commands


def test_the_page_has_the_whole_walk_through() -> None:
    files, commands = walk_through()
    assert {"train.py", "worker.toml", "features.csv", "topics.py", "produce.py"} <= set(files)
    assert [c.split()[0:2] for c in commands] == [
        ["python", "train.py"],
        ["streamfer", "features"],
        ["python", "topics.py"],
        ["streamfer", "check"],
        ["streamfer", "run"],
        ["python", "produce.py"],
        ["python", "consume.py"],
    ]


def _argv(command: str) -> list[str]:
    words = command.split()
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return [sys.executable, "-m", "worker", *words[1:]]


def test_the_first_pipeline_runs_as_written(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    files, commands = walk_through()
    tag = f"first-{uuid.uuid4().hex[:8]}"
    for name, text in files.items():
        # Fresh names on the shared broker and Redis: topics, groups and keys.
        text = text.replace("first-", f"{tag}-").replace('"first:', f'"{tag}:')
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFER_")}
    env |= {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAMFER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAMFER_REDIS__URL": redis_url,
    }
    worker: subprocess.Popen[bytes] | None = None
    outputs: dict[str, str] = {}
    try:
        for command in commands:
            if command.startswith("streamfer run"):
                with (tmp_path / "worker.log").open("wb") as log:
                    worker = subprocess.Popen(
                        _argv(command), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                continue
            done = subprocess.run(
                _argv(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
            outputs[command] = done.stdout
        assert worker is not None and worker.poll() is None, (tmp_path / "worker.log").read_text()
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()

    assert "FAIL" not in outputs["streamfer check --config worker.toml"]
    result = json.loads(outputs["python consume.py"].strip().splitlines()[-1])
    assert result["id"] == "r1"
    assert result["key"] == "customer-17"
    assert result["model"]["name"] == "first"
    # The stored features, the request's inline amount over the stored one, in the
    # config's order: the score is the model's own for that row.
    row = np.array([[1.3, 1.5, 0.9]], dtype=np.float32)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    label, probabilities = session.run(None, {session.get_inputs()[0].name: row})
    assert result["outputs"]["label"] == int(label[0])
    assert result["outputs"]["scores"] == pytest.approx(probabilities[0].tolist(), abs=1e-6)
