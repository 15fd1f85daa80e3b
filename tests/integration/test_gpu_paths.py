"""The GPU serving paths on a machine without a GPU, end to end against real Kafka and Redis.

A user's config asks for CUDA first; this machine has the CPU build of ONNX Runtime. The
worker must say so at start-up (naming the reason), serve every request on the CPU with
the scores ONNX Runtime itself gives, and export which provider serves. Then the same
model with ``pad_to_buckets`` and ``io_binding`` forced on, under batches of ragged
sizes: the bucket and IOBinding code a GPU runs, run by the CPU provider, must give the
same scores. The model is the torch-style MLP recipe (``tests.integration.recipes``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, scrape_metrics, streamfer
from tests.integration.recipes import NUMERIC, FraudData, Recipe, fraud_data, torch_style_mlp
from tests.integration.test_bring_your_own_model import request_doc, served_config

pytestmark = pytest.mark.integration

N_REQUESTS = 240
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(N_REQUESTS, seed=11)


@dataclass(frozen=True)
class Served:
    """The MLP recipe's config, with extra [pipelines.model] lines and a metrics port."""

    recipe: Recipe
    topics: Topics
    config: Path
    port: int


@pytest.fixture
def serve_mlp(
    data: FraudData,
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> Callable[[str], Served]:
    """Factory: the recipe's features stored, its config written with ``model_lines``
    in its [pipelines.model] table."""

    def make(model_lines: str) -> Served:
        recipe = torch_style_mlp(tmp_path, data)
        topics = fresh_topics(2)
        port = free_port()
        config = served_config(
            recipe,
            data,
            bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            topics=topics,
            path=tmp_path / "gpu.toml",
            extra=f'[metrics]\nhost = "127.0.0.1"\nport = {port}\n',
        )
        text = config.read_text()
        anchor = f'name = "{recipe.name}"\n'
        assert text.count(anchor) == 1
        config.write_text(text.replace(anchor, anchor + model_lines + "\n"))
        return Served(recipe, topics, config, port)

    return make


def _runtimes_own(recipe: Recipe, data: FraudData) -> np.ndarray[Any, Any]:
    """The scores ONNX Runtime gives for the data's rows, in one plain session.run."""
    session = ort.InferenceSession(str(recipe.model_path), providers=["CPUExecutionProvider"])
    x = np.array([[float(r[c]) for c in NUMERIC] for r in data.rows()], dtype=np.float32)
    scores: np.ndarray[Any, Any] = session.run(None, {"input": x})[0]
    return scores.astype(np.float64)


def _serve(
    served: Served, data: FraudData, kafka_bootstrap: str, log: Path, groups: list[int]
) -> tuple[float, Metrics, str]:
    """Start a worker, produce the requests in groups of ``groups`` sizes (a pause after
    each, so batches close at those sizes), read every result, and give the largest
    difference of its scores from ONNX Runtime's own, the worker's metrics and its log."""
    topics = served.topics
    worker = WorkerProcess(served.config, log).start()
    try:
        wait_for_assignment([worker], 2, timeout=90)
        ids = [f"gpu-{i}" for i in range(len(data.requests))]
        start = 0
        for size in groups:
            chunk = range(start, min(start + size, len(ids)))
            produce_requests(
                kafka_bootstrap,
                topics.requests,
                [
                    (ids[i], f"k{i}".encode(), orjson.dumps(request_doc(ids[i], data.requests[i])))
                    for i in chunk
                ],
            )
            start = chunk.stop
            time.sleep(0.15)
        assert start == len(ids)
        out = collect_outcomes(
            kafka_bootstrap,
            topics.results,
            topics.dead_letters,
            set(ids),
            timeout=60,
            keep_docs=True,
        )
        assert out.lost(ids) == [] and out.duplicates() == 0
        assert out.dead_letter_docs == []
        metrics = scrape_metrics(served.port)
    finally:
        assert worker.terminate() == 0, worker.log_text()[-3000:]
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)
    scores = {d["id"]: d["outputs"]["scores"] for d in out.result_docs}
    got = np.array([scores[rid] for rid in ids], dtype=np.float64)
    diff = float(np.abs(got - _runtimes_own(served.recipe, data)).max())
    return diff, metrics, worker.log_text()


def test_cuda_requested_first_falls_back_to_the_cpu_and_says_why(
    data: FraudData,
    kafka_bootstrap: str,
    serve_mlp: Callable[[str], Served],
    tmp_path: Path,
) -> None:
    served = serve_mlp('providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]')
    check = streamfer("check", "--config", str(served.config), "--skip-kafka", timeout=180)
    assert check.returncode == 0, check.stderr[-3000:]
    assert (
        "provider CPUExecutionProvider (requested CUDAExecutionProvider, CPUExecutionProvider)"
        in check.stdout
    ), check.stdout

    diff, metrics, log = _serve(served, data, kafka_bootstrap, tmp_path / "w.log", [N_REQUESTS])
    assert diff < 1e-5, f"scores differ from onnxruntime's own by up to {diff}"
    warnings = [line for line in log.splitlines() if "does not serve" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "WARNING" in warnings[0]
    assert (
        "CUDAExecutionProvider does not serve: this is the CPU build of ONNX Runtime"
        in (warnings[0])
    )
    assert f"onnxruntime {ort.__version__} installed" in warnings[0]
    assert warnings[0].endswith("CPUExecutionProvider serves instead")
    provider = {
        dict(labels)["provider"]: (dict(labels)["requested"], value)
        for (name, labels), value in metrics.items()
        if name == "streamfer_inference_provider"
    }
    assert provider == {"CPUExecutionProvider": ("CUDAExecutionProvider", 1.0)}
    assert metrics[("streamfer_device_oom_retries_total", (("pipeline", "fraud"),))] == 0


def test_buckets_and_iobinding_forced_on_the_cpu_give_the_same_scores(
    data: FraudData,
    kafka_bootstrap: str,
    serve_mlp: Callable[[str], Served],
    tmp_path: Path,
) -> None:
    served = serve_mlp("pad_to_buckets = true\nio_binding = true")
    groups = [1, 3, 7, 2, 13, 5, 29, 50, 64, 66]  # ragged: each closes its own batches
    diff, metrics, log = _serve(served, data, kafka_bootstrap, tmp_path / "w.log", groups)
    assert diff < 1e-5, f"scores differ from onnxruntime's own by up to {diff}"
    assert "batches padded to sizes [1, 2, 4, 8, 16, 32, 64]" in log, log[-3000:]
    assert "IOBinding with plain host buffers" in log
    # batches of several sizes reached the engine, not just full ones
    buckets = {
        float(dict(labels)["le"]): value
        for (name, labels), value in metrics.items()
        if name == "streamfer_batch_size_bucket"
    }
    per_bucket = np.diff([0.0, *(buckets[le] for le in sorted(buckets))])
    assert (per_bucket > 0).sum() >= 3, buckets
