"""The MLP of ``tests.integration.recipes`` served from stored features, for the tests of
model versions, canaries and shadows: versions of it with other weights, a worker
config that serves it, and readers of what comes out.

Every score a worker publishes for a request can be recomputed with ONNX Runtime on the
same row (``scores_by_version``), so a test can tell which version scored it.
"""

from __future__ import annotations

import hashlib
import http.client
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.conftest import Topics
from tests.integration.helpers import services_toml
from tests.integration.recipes import NUMERIC, FraudData, fraud_lookup_tables, torch_style_mlp
from tests.integration.test_bring_your_own_model import request_doc

WINDOW_MS = 50
"""The batch window (``max_wait_ms``) of the config."""
PARTITIONS = 4


@dataclass(frozen=True)
class Result:
    partition: int
    offset: int
    ts_ms: int
    doc: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.doc["model"]["version"])


def mlp_versions(data: FraudData, folder: Path) -> dict[str, bytes]:
    """Version -> model bytes: three MLPs with the same signature and other weights (other
    widths, and the output layer's bias moved, so that their scores differ on nearly
    every row), and a broken file ("3")."""
    import onnx
    from onnx import numpy_helper

    out = {}
    for version, hidden, shift in (("1", 16, 0.0), ("2", 8, 0.7), ("4", 24, -0.7)):
        model = onnx.load(torch_style_mlp(folder / version, data, hidden=hidden).model_path)
        (bias,) = [t for t in model.graph.initializer if t.name == "fc2.bias"]
        moved = numpy_helper.to_array(bias) + np.array([shift, -shift], dtype=np.float32)
        bias.CopyFrom(numpy_helper.from_array(moved.astype(np.float32), "fc2.bias"))
        out[version] = model.SerializeToString()
    out["3"] = b"\x08\x07not an onnx model, a deployment gone wrong\n" * 200
    return out


def scores_by_version(
    models: dict[str, bytes], data: FraudData
) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
    """Each good version's scores for every request row, from ONNX Runtime directly."""
    rows = np.array([[float(r[c]) for c in NUMERIC] for r in data.rows()], dtype=np.float32)
    out = {}
    for version, content in models.items():
        if version != "3":
            session = ort.InferenceSession(content, providers=["CPUExecutionProvider"])
            out[version] = np.asarray(session.run(None, {"input": rows})[0])
    return out


def config_text(
    *,
    bootstrap: str,
    redis_url: str,
    topics: Topics,
    tag: str,
    model_path: Path | None,
    metrics_port: int,
    model_lines: str = "",
    pipeline_extra: str = "",
) -> str:
    """A config serving the MLP from the stored features (``store_features``), its
    results naming the model's digest (``result_details``) so models tell apart;
    ``model_lines`` go into ``[pipelines.model]``, ``pipeline_extra`` after it (tables
    such as ``[pipelines.canary]``, or ``[pipelines.model.triton]`` with no
    ``model_path``)."""
    path_line = "" if model_path is None else f'path = "{model_path}"'
    services = services_toml(
        bootstrap=bootstrap, group=topics.group, redis_url=redis_url, metrics_port=metrics_port
    )
    return f"""{services}reload_endpoint = true

[[pipelines]]
name = "fraud"
request_topics = ["{topics.requests}"]
result_topic = "{topics.results}"
dead_letter_topic = "{topics.dead_letters}"
result_details = true

[pipelines.batch]
max_batch_size = 64
max_wait_ms = {WINDOW_MS}

[pipelines.request]
id = "meta.request_id"

{fraud_lookup_tables(tag)}

[pipelines.model]
{path_line}
name = "fraud-mlp"
{model_lines}

[pipelines.model.inputs]
input = {orjson.dumps(NUMERIC).decode()}

[pipelines.model.outputs]
scores = "output"

{pipeline_extra}
"""


def produced_requests(
    data: FraudData, count: int, prefix: str = "r"
) -> list[tuple[str, bytes, bytes]]:
    """(id, key, value) of the first ``count`` request rows; ids are ``prefix`` (one
    letter) and the row number, so a run can send the same rows again under new ids."""
    return [
        (
            f"{prefix}{i}",
            f"k{i}".encode(),
            orjson.dumps(request_doc(f"{prefix}{i}", data.requests[i])),
        )
        for i in range(count)
    ]


def read_results(bootstrap: str, topic: str, ids: set[str], timeout: float) -> list[Result]:
    """Every result on ``topic`` (from the start) until each of ``ids`` has one."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reload-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    out: list[Result] = []
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        pending = set(ids)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                doc = orjson.loads(msg.value() or b"null")
                out.append(Result(msg.partition(), msg.offset(), msg.timestamp()[1], doc))
                pending.discard(doc["id"])
    finally:
        consumer.close()
    return out


def in_background(work: Callable[[], object]) -> Callable[[], None]:
    """Run ``work`` on a thread; the returned function joins it and re-raises its error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(300)
        assert not thread.is_alive(), "the producer did not finish"
        if errors:
            raise errors[0]

    return join


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def post(port: int, path: str, method: str = "POST") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def check_scores(
    results: list[Result], expected: dict[str, np.ndarray[Any, Any]], versions: set[str]
) -> None:
    """Each result names one of ``versions``, and its scores are that version's, nearer
    to them than to any other version's in ``expected`` (the versions differ by far more
    than rounding on almost every row, so the test can tell which one scored a row)."""
    names = sorted(expected)
    table = np.stack([expected[v] for v in names])  # (versions, rows, classes)
    apart = np.abs(table[:, None] - table[None, :]).max(axis=-1)  # (v, v, rows)
    distinct = apart[~np.eye(len(names), dtype=bool)].min(axis=0) > 1e-3
    assert distinct.mean() > 0.95, f"versions differ on {distinct.mean():.1%} of rows only"
    for r in results:
        assert r.version in versions, r.doc["model"]
        row = int(r.doc["id"][1:])
        got = np.asarray(r.doc["outputs"]["scores"], dtype=np.float32)
        np.testing.assert_allclose(got, expected[r.version][row], rtol=1e-5, atol=1e-6)
        if distinct[row]:
            nearest = names[int(np.abs(table[:, row] - got).max(axis=-1).argmin())]
            assert nearest == r.version, f"{r.doc['id']} names {r.version}, scored by {nearest}"


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
