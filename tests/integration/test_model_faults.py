"""A model version that fails on every row, against real Kafka and Redis: the pipeline
turns not ready and its partitions pause, no request is dead-lettered for the model's
fault, and a good version reloaded serves every request that waited.

The failing version is what a user meets when a new export cannot take the rows the
stream sends: it loads, and its warm-up rows (zeros) pass, but every real batch fails in
ONNX Runtime. It is the served MLP (``tests.integration.served_mlp``) with one more node
in front: a Gather whose index is the batch's largest absolute input times 1,000, into
a one-element table (zero for the warm-up rows, out of bounds for any real batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamfer_dev.harness import WorkerProcess, collect_outcomes, produce_requests
from tests.conftest import Topics
from tests.integration.helpers import (
    assert_committed_to_end,
    eventually,
    http_get,
    scrape_metrics,
)
from tests.integration.recipes import FraudData, fraud_data
from tests.integration.served_mlp import (
    PARTITIONS,
    mlp_versions,
    produced_requests,
    read_results,
    sha,
)
from tests.integration.test_hot_reload import publish_version, reloads

pytestmark = pytest.mark.integration

SERVED_FIRST = 200
HELD = 2_000
"""Requests sent while the model fails: far more than the in-flight bound (4 batches of
64), so the partitions must pause."""


def failing_on_real_rows(good: bytes) -> bytes:
    """``good`` with its (first) input first gathered through an index that only zeros
    keep in bounds (see the module)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load_from_string(good)
    graph = model.graph
    first = graph.input[0].name
    guarded = f"{first}_guarded"
    for node in graph.node:
        node.input[:] = [guarded if name == first else name for name in node.input]
    graph.initializer.extend(
        [
            helper.make_tensor("guard.table", TensorProto.FLOAT, [1], [0.0]),
            helper.make_tensor("guard.scale", TensorProto.FLOAT, [], [1000.0]),
        ]
    )
    front = [
        helper.make_node("Abs", [first], ["guard.abs"]),
        helper.make_node("ReduceMax", ["guard.abs"], ["guard.max"], keepdims=0),
        helper.make_node("Mul", ["guard.max", "guard.scale"], ["guard.scaled"]),
        helper.make_node("Cast", ["guard.scaled"], ["guard.index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["guard.table", "guard.index"], ["guard.zero"]),
        helper.make_node("Add", [first, "guard.zero"], [guarded]),
    ]
    nodes = front + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(SERVED_FIRST + HELD, seed=23)


def sample(port: int, name: str) -> float:
    """The sum of every series of ``name`` on the worker's /metrics."""
    return sum(v for (n, _labels), v in scrape_metrics(port).items() if n == name)


def test_a_version_failing_on_every_row_pauses_the_pipeline_until_a_good_reload(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    tmp_path: Path,
) -> None:
    models = mlp_versions(data, tmp_path / "exports")
    broken = failing_on_real_rows(models["2"])
    topics = fresh_topics(PARTITIONS)
    root = tmp_path / "models" / "fraud-mlp"
    root.mkdir(parents=True)
    publish_version(root, "1", models["1"])
    worker, port = mlp_worker(topics, data, root, model_lines="reload_poll_s = 0.5")
    requests = produced_requests(data, SERVED_FIRST + HELD)
    first, held = requests[:SERVED_FIRST], requests[SERVED_FIRST:]

    produce_requests(kafka_bootstrap, topics.requests, first)
    served = read_results(kafka_bootstrap, topics.results, {r for r, _, _ in first}, 60)
    assert {r.version for r in served} == {"1"} and len(served) == SERVED_FIRST

    publish_version(root, "2", broken)
    assert eventually(lambda: reloads(port, "loaded") == 1, 30), worker.log_text()[-3000:]
    produce_requests(kafka_bootstrap, topics.requests, held)
    assert eventually(lambda: http_get(port, "/readyz")[0] == 503, 30), worker.log_text()[-3000:]
    _status, why = http_get(port, "/readyz")
    assert "pipeline fraud: the model refused a whole batch and a row it answered before" in why
    assert "out of bounds" in why or "Gather" in why, why
    assert eventually(lambda: sample(port, "streamfer_paused_partitions") > 0, 30)
    assert sample(port, "streamfer_model_paused") == 1
    assert sample(port, "streamfer_model_failed_batches_total") >= 1
    time.sleep(3)  # the batch has been tried again meanwhile; still nothing comes out
    assert sample(port, "streamfer_dead_letters_total") == 0
    assert http_get(port, "/readyz")[0] == 503

    publish_version(root, "4", models["4"])
    assert eventually(lambda: reloads(port, "loaded") == 2, 30), worker.log_text()[-3000:]
    ids = {r for r, _, _ in requests}
    outcomes = collect_outcomes(
        kafka_bootstrap, topics.results, topics.dead_letters, ids, timeout=120, keep_docs=True
    )
    assert not outcomes.dead_letter_ids and not outcomes.dead_letters
    assert set(outcomes.results) == ids, f"{len(ids - set(outcomes.results))} unanswered"
    versions = {d["id"]: d["model"] for d in outcomes.result_docs}
    assert {versions[r]["version"] for r, _, _ in held} == {"4"}
    assert {versions[r]["sha256"] for r, _, _ in held} == {sha(models["4"])}
    assert eventually(lambda: http_get(port, "/readyz")[0] == 200, 30)
    assert sample(port, "streamfer_model_paused") == 0
    assert sample(port, "streamfer_paused_partitions") == 0
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)
