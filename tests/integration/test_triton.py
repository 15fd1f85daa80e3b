"""A model on a real Triton Inference Server, against real Kafka and Redis.

The server is ``tritonserver`` from the ``nvidia-pytriton`` wheel
(``streamfer_dev.triton``), serving the torch-style MLP of ``tests.integration.recipes``
through ONNX Runtime with dynamic batching on the CPU. Every score a worker publishes is
compared with ONNX Runtime's own on the same row, exactly: the server runs the same
Runtime version. Each version of the MLP has other weights, so a score also says which
version computed it. The tests skip, saying why, only where the server cannot run at all
(no Debian python3 with its shared libpython); here and in CI they run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    end_offsets,
    produce_requests,
)
from streamfer_dev.stack import free_port
from streamfer_dev.triton import TritonServer, server_python, start_triton
from tests.conftest import Topics
from tests.integration.conftest import MlpConfig
from tests.integration.helpers import assert_committed_to_end, scrape_metrics
from tests.integration.recipes import NUMERIC, FraudData, fraud_data
from tests.integration.served_mlp import (
    PARTITIONS,
    in_background,
    mlp_versions,
    post,
    produced_requests,
    scores_by_version,
    wait_for,
)
from tests.integration.test_bring_your_own_model import request_doc
from worker.config import ModelSpec
from worker.inference import OnnxEngine, TritonEngine

pytestmark = pytest.mark.integration

REFUSE_ABOVE = 1e6
"""The server's model refuses a request holding a number above this."""


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(3000, seed=39)


@pytest.fixture(scope="module")
def models(data: FraudData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Version -> ONNX file of the MLP (versions 1 and 2: other weights)."""
    folder = tmp_path_factory.mktemp("triton-mlps")
    out = {}
    for version, content in mlp_versions(data, folder).items():
        if version in ("1", "2"):
            out[version] = folder / f"v{version}.onnx"
            out[version].write_bytes(content)
    return out


@pytest.fixture(scope="module")
def expected(data: FraudData, models: dict[str, Path]) -> dict[str, np.ndarray[Any, Any]]:
    """Each version's scores for every request row, from ONNX Runtime in this process."""
    return scores_by_version({v: p.read_bytes() for v, p in models.items()}, data)


@pytest.fixture
def triton() -> Iterator[Callable[..., TritonServer]]:
    """Factory: a Triton server of ``NAME:VERSION:PATH`` models; stopped after the test."""
    try:
        server_python()
    except Exception as exc:  # the reason goes to the report
        pytest.skip(f"no Triton server here: {exc}")
    started: list[TritonServer] = []

    def start(models: list[str], **options: Any) -> TritonServer:
        server = start_triton(models, refuse_above=REFUSE_ABOVE, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


ON_TRITON = 'engine = "triton"'


def triton_table(url: str) -> str:
    return f"""
[pipelines.model.triton]
url = "{url}"
model = "fraud"
timeout_s = 5
"""


Served = Callable[..., tuple[TritonServer, Topics, WorkerProcess, int]]


@pytest.fixture
def served(
    triton: Callable[..., TritonServer],
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    models: dict[str, Path],
    data: FraudData,
) -> Served:
    """Factory: a server of version 1, and a worker on it (``model_lines`` added to its
    model table) that owns every partition of fresh topics."""

    def start(model_lines: str = "") -> tuple[TritonServer, Topics, WorkerProcess, int]:
        server = triton([f"fraud:1:{models['1']}"])
        topics = fresh_topics(4)
        worker, port = mlp_worker(
            topics,
            data,
            None,
            model_lines=f"{ON_TRITON}\n{model_lines}",
            pipeline_extra=triton_table(server.url),
        )
        return server, topics, worker, port

    return start


def outcomes(bootstrap: str, topics: Topics, ids: set[str], timeout: float = 120) -> Outcomes:
    return collect_outcomes(
        bootstrap, topics.results, topics.dead_letters, ids, timeout=timeout, keep_docs=True
    )


def check_exact(
    out: Outcomes, expected: dict[str, np.ndarray[Any, Any]], versions: set[str]
) -> None:
    """Every result names one of ``versions`` and carries exactly that version's scores
    as ONNX Runtime computes them here."""
    for doc in out.result_docs:
        version = str(doc["model"]["version"])
        assert version in versions, doc["model"]
        row = int(doc["id"][1:])
        got = np.asarray(doc["outputs"]["scores"], dtype=np.float32)
        assert np.array_equal(got, expected[version][row]), (doc["id"], got, expected[version][row])


def readyz(port: int) -> tuple[int, str]:
    try:
        return post(port, "/readyz", "GET")
    except OSError as exc:
        return 0, str(exc)


def streamfer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args], capture_output=True, text=True, timeout=180
    )


def test_scores_equal_the_local_model_and_a_model_error_is_one_row(
    served: Served,
    kafka_bootstrap: str,
    data: FraudData,
    expected: dict[str, np.ndarray[Any, Any]],
) -> None:
    server, topics, worker, port = served()
    good = produced_requests(data, 1500)
    refused = {f"x{i}": i for i in (5, 700, 1400)}  # an amount the model refuses
    bad = [
        (rid, f"k{i}".encode(), orjson.dumps(request_doc(rid, {**data.requests[i], "amount": 1e9})))
        for rid, i in refused.items()
    ]
    produce_requests(kafka_bootstrap, topics.requests, good[:700] + bad + good[700:])
    ids = {rid for rid, _k, _v in good} | set(refused)
    out = outcomes(kafka_bootstrap, topics, ids)
    assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
    assert out.duplicates() == 0
    assert set(out.results) == {rid for rid, _k, _v in good}
    check_exact(out, expected, {"1"})
    # the model's refusal takes the per-row path: those rows alone, with the server's words
    assert out.dead_letter_ids == set(refused)
    for doc in out.dead_letter_docs:
        assert "holds a value above" in doc["reason"], doc["reason"]
        assert server.url in doc["reason"], doc["reason"]
    metrics = scrape_metrics(port)
    model_errors = ("streamfer_triton_errors_total", (("kind", "model"), ("pipeline", "fraud")))
    assert metrics.get(model_errors, 0) >= len(refused)
    calls = ("streamfer_triton_call_seconds_count", (("pipeline", "fraud"),))
    assert metrics.get(calls, 0) > 0
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_check_asks_the_server(
    fresh_topics: Callable[..., Topics],
    mlp_config: MlpConfig,
    triton: Callable[..., TritonServer],
    models: dict[str, Path],
    data: FraudData,
) -> None:
    server = triton([f"fraud:1:{models['1']}"])
    path, _port = mlp_config(
        fresh_topics(1), data, None, model_lines=ON_TRITON, pipeline_extra=triton_table(server.url)
    )
    check = streamfer("check", "--config", str(path), "--skip-kafka")
    assert check.returncode == 0, check.stderr
    assert f"triton server: {server.url} live" in check.stdout, check.stdout
    assert f"triton model: fraud:1 at {server.url} ready" in check.stdout, check.stdout
    assert "input input tensor(float)[batch, 5] <- amount" in check.stdout, check.stdout
    assert "provider triton" in check.stdout
    server.stop()
    down = streamfer("check", "--config", str(path), "--skip-kafka")
    assert down.returncode == 2
    assert f"inference server {server.url}" in down.stderr, down.stderr
    assert "UNAVAILABLE" in down.stderr, down.stderr


def steady(
    kafka_bootstrap: str, topics: Topics, requests: list[tuple[str, bytes, bytes]], rate: float
) -> Callable[[], None]:
    return in_background(
        lambda: produce_requests(kafka_bootstrap, topics.requests, requests, rate=rate)
    )


def test_server_stopped_and_started_mid_stream(
    served: Served,
    kafka_bootstrap: str,
    triton: Callable[..., TritonServer],
    models: dict[str, Path],
    data: FraudData,
    expected: dict[str, np.ndarray[Any, Any]],
) -> None:
    server, topics, worker, port = served()
    assert readyz(port)[0] == 200
    requests = produced_requests(data, 3000)
    join = steady(kafka_bootstrap, topics, requests, rate=200.0)
    ids = {rid for rid, _k, _v in requests}
    wait_for(lambda: len(outcomes(kafka_bootstrap, topics, {"r0"}, 1).results) > 0, 60, "results")
    server.stop()
    wait_for(lambda: readyz(port)[0] == 503, 60, "/readyz 503")
    _status, body = readyz(port)
    assert "inference server" in body and server.url in body, body
    time.sleep(6)  # the server stays down longer than a call's timeout (timeout_s = 5)
    assert worker.alive()
    assert readyz(port)[0] == 503
    server = triton([f"fraud:1:{models['1']}"], grpc_port=server.grpc_port)
    wait_for(lambda: readyz(port)[0] == 200, 60, "/readyz 200 again")
    join()
    out = outcomes(kafka_bootstrap, topics, ids)
    assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
    assert out.duplicates() == 0
    assert (
        not out.dead_letter_ids
        and sum(end_offsets(kafka_bootstrap, topics.dead_letters).values()) == 0
    )
    check_exact(out, expected, {"1"})
    unavailable = (
        "streamfer_triton_errors_total",
        (("kind", "unavailable"), ("pipeline", "fraud")),
    )
    assert scrape_metrics(port).get(unavailable, 0) > 0
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_a_new_version_on_the_server_is_picked_up(
    served: Served,
    kafka_bootstrap: str,
    triton: Callable[..., TritonServer],
    models: dict[str, Path],
    data: FraudData,
    expected: dict[str, np.ndarray[Any, Any]],
) -> None:
    """The server moves from version 1 to version 2 (as Triton's default version policy,
    the latest one, does; here by a restart that loads version 2 only): the worker's
    batches wait while no version answers, the reloader finds version 2, checks and
    warms it, and it scores the rest."""
    server, topics, worker, port = served("reload_poll_s = 0.5")
    first = produced_requests(data, 1000)
    produce_requests(kafka_bootstrap, topics.requests, first)
    ids = {rid for rid, _k, _v in first}
    out = outcomes(kafka_bootstrap, topics, ids)
    assert not out.lost(ids)
    check_exact(out, expected, {"1"})
    server.stop()
    server = triton([f"fraud:2:{models['2']}"], grpc_port=server.grpc_port)
    rest = produced_requests(data, 3000)[1000:]
    produce_requests(kafka_bootstrap, topics.requests, rest)
    ids |= {rid for rid, _k, _v in rest}
    out = outcomes(kafka_bootstrap, topics, ids)
    assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
    assert out.duplicates() == 0 and not out.dead_letter_ids
    check_exact(out, expected, {"1", "2"})
    versions = {doc["id"]: str(doc["model"]["version"]) for doc in out.result_docs}
    assert all(versions[rid] == "1" for rid, _k, _v in first)
    assert all(versions[rid] == "2" for rid, _k, _v in rest)
    loaded = ("streamfer_model_reloads_total", (("pipeline", "fraud"), ("result", "loaded")))
    assert scrape_metrics(port).get(loaded, 0) == 1
    assert readyz(port)[0] == 200
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


@pytest.fixture(scope="module")
def classifier(data: FraudData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scikit-learn classifier of the fraud rows as skl2onnx exports it (ZipMap off:
    a server serves tensors): ``label`` one int64 a row (``[batch]``) and
    ``probabilities`` ``[batch, 2]``."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    x = np.array([[float(r[c]) for c in NUMERIC] for r in data.rows()], dtype=np.float32)
    model = LogisticRegression(max_iter=1000).fit(x, data.labels)
    onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}}, target_opset=17)
    path = tmp_path_factory.mktemp("triton-classifier") / "classifier.onnx"
    path.write_bytes(onx.SerializeToString())
    return path


def local_beside(path: Path, served: Topics, local: Topics, model: Path) -> None:
    """Add to the worker config at ``path`` a pipeline ``local`` running ``model`` in the
    worker, like the Triton pipeline in every other way, on ``local``'s topics; both
    publish the classifier's ``label`` and ``probabilities``."""
    text = path.read_text()
    section = text[text.index("[[pipelines]]") : text.index("[pipelines.model.triton]")]
    for old, new in (
        ('name = "fraud"\n', 'name = "local"\n'),
        (served.requests, local.requests),
        (served.results, local.results),
        (served.dead_letters, local.dead_letters),
        (ON_TRITON, f'path = "{model}"'),
    ):
        section = section.replace(old, new)
    outputs = 'scores = "output"'
    both = 'label = "label"\nprobabilities = "probabilities"'
    text = (text + "\n" + section).replace("input = [", "X = [").replace(outputs, both)
    path.write_text(text)


def test_results_equal_the_local_engines_and_an_outage_holds_only_its_pipeline(
    fresh_topics: Callable[..., Topics],
    mlp_config: MlpConfig,
    triton: Callable[..., TritonServer],
    classifier: Path,
    data: FraudData,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """One worker, the same classifier on the server (``fraud``) and in the worker
    (``local``), the same requests to each: every result's outputs are the same JSON both
    ways. The server stops: ``local`` keeps publishing while ``fraud`` waits (readiness
    names the server); once it is back nothing is lost or dead-lettered."""
    server = triton([f"fraud:1:{classifier}"])
    served, local = fresh_topics(PARTITIONS), fresh_topics(PARTITIONS)
    path, port = mlp_config(
        served, data, None, model_lines=ON_TRITON, pipeline_extra=triton_table(server.url)
    )
    local_beside(path, served, local, classifier)
    worker = WorkerProcess(path, tmp_path / "worker.log").start()
    try:
        requests = produced_requests(data, 2000)
        first, rest = requests[:800], requests[800:]
        for topics in (served, local):
            produce_requests(kafka_bootstrap, topics.requests, first)
        ids = {rid for rid, _k, _v in first}
        on_server, in_worker = (
            outcomes(kafka_bootstrap, served, ids),
            outcomes(kafka_bootstrap, local, ids),
        )
        assert not on_server.lost(ids) and not in_worker.lost(ids)
        same_json(on_server, in_worker)

        server.stop()
        later = {rid for rid, _k, _v in rest}
        for topics in (served, local):
            produce_requests(kafka_bootstrap, topics.requests, rest)
        wait_for(lambda: readyz(port)[0] == 503, 60, "/readyz 503")
        _status, body = readyz(port)
        assert "pipeline fraud: inference server" in body and server.url in body, body
        assert "pipeline local" not in body, body
        # the worker's own pipeline answers everything while the other waits
        assert not outcomes(kafka_bootstrap, local, later).lost(later)
        assert worker.alive() and readyz(port)[0] == 503
        server = triton([f"fraud:1:{classifier}"], grpc_port=server.grpc_port)
        wait_for(lambda: readyz(port)[0] == 200, 60, "/readyz 200 again")
        ids |= later
        on_server, in_worker = (
            outcomes(kafka_bootstrap, served, ids),
            outcomes(kafka_bootstrap, local, ids),
        )
        for out in (on_server, in_worker):
            assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
            assert out.duplicates() == 0 and not out.dead_letter_ids
        same_json(on_server, in_worker)
        assert worker.terminate() == 0
    finally:
        worker.terminate()
    for topics in (served, local):  # one worker: one group, the served pipeline's
        assert sum(end_offsets(kafka_bootstrap, topics.dead_letters).values()) == 0
        assert_committed_to_end(kafka_bootstrap, served.group, topics.requests)


def same_json(on_server: Outcomes, in_worker: Outcomes) -> None:
    """Each request's ``outputs`` are the same JSON from the server as from the worker's
    own engine: a number where the model gives one a row, never a one-element list."""
    local = {doc["id"]: doc["outputs"] for doc in in_worker.result_docs}
    assert len(local) == len(on_server.result_docs)
    for doc in on_server.result_docs:
        assert orjson.dumps(doc["outputs"]) == orjson.dumps(local[doc["id"]]), doc["id"]
        assert isinstance(doc["outputs"]["label"], int), doc["outputs"]


def test_a_server_down_at_start_up_is_waited_for(
    fresh_topics: Callable[..., Topics],
    mlp_config: MlpConfig,
    triton: Callable[..., TritonServer],
    models: dict[str, Path],
    data: FraudData,
    expected: dict[str, np.ndarray[Any, Any]],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """No server at the configured address when the worker starts: it stays up,
    ``/readyz`` names the server and its log says what it waits for; once a server comes
    up there, every request is scored, none dead-lettered."""
    grpc_port = free_port()
    url = f"127.0.0.1:{grpc_port}"
    topics = fresh_topics(PARTITIONS)
    path, port = mlp_config(
        topics, data, None, model_lines=ON_TRITON, pipeline_extra=triton_table(url)
    )
    log = tmp_path / "worker.log"
    worker = WorkerProcess(path, log).start()
    try:
        wait_for(lambda: url in readyz(port)[1], 60, "/readyz naming the server")
        status, body = readyz(port)
        assert status == 503 and "pipeline fraud: inference server" in body, body
        wait_for(lambda: "waits for the server" in log.read_text(), 30, "the log line")
        requests = produced_requests(data, 600)
        produce_requests(kafka_bootstrap, topics.requests, requests)
        assert worker.alive() and readyz(port)[0] == 503
        triton([f"fraud:1:{models['1']}"], grpc_port=grpc_port)
        ids = {rid for rid, _k, _v in requests}
        out = outcomes(kafka_bootstrap, topics, ids)
        assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
        assert out.duplicates() == 0 and not out.dead_letter_ids
        check_exact(out, expected, {"1"})
        wait_for(lambda: readyz(port)[0] == 200, 60, "/readyz 200")
        assert worker.terminate() == 0
    finally:
        worker.terminate()
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_a_batch_split_into_calls_in_flight_scores_as_the_local_model(
    triton: Callable[..., TritonServer], classifier: Path, data: FraudData
) -> None:
    """A batch of 1,000 rows at a server's ``max_batch_size`` 16: 63 calls, four in
    flight at a time, whose answers join in row order into exactly the outputs of the
    same file run in this process (``label`` a value a row, as ONNX Runtime gives it)."""
    server = triton([f"fraud:1:{classifier}"], max_batch_size=16)
    remote = TritonEngine(
        ModelSpec.model_validate(
            {
                "name": "fraud",
                "engine": "triton",
                "triton": {"url": server.url, "max_calls_in_flight": 4},
            }
        )
    )
    local = OnnxEngine(ModelSpec.model_validate({"name": "fraud", "path": str(classifier)}))
    assert remote.max_batch_size == 16
    rows = np.array([[float(r[c]) for c in NUMERIC] for r in data.rows()[:1000]], np.float32)
    got, want = remote.infer({"X": rows}), local.infer({"X": rows})
    assert set(got) == set(want) and "label" in want
    for name, values in want.items():
        assert got[name].shape == values.shape and np.array_equal(got[name], values), name
