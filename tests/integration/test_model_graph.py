"""A model graph against real Kafka, Redis and ONNX Runtime: two MLPs of the fraud
features (request fields and both stored lookups) averaged by a third model, each
result's scores those of the three models run by hand; then a new version of one step
that fails on every real row holds the pipeline, ``/readyz`` naming the step, until a
good version of that step is reloaded, with nothing dead-lettered or lost. ``check``
passes the graph and refuses (exit 2) one whose step reads an output that does not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import make_mean
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import (
    assert_committed_to_end,
    eventually,
    http_get,
    services_toml,
    streamfer,
)
from tests.integration.recipes import NUMERIC, FraudData, fraud_data, fraud_lookup_tables
from tests.integration.served_mlp import PARTITIONS, mlp_versions, produced_requests
from tests.integration.test_bring_your_own_model import store_features
from tests.integration.test_hot_reload import publish_version, reloads
from tests.integration.test_model_faults import failing_on_real_rows

pytestmark = pytest.mark.integration

FIRST = 200
HELD = 100


def graph_config(services: str, topics: Topics, tag: str, one: Path, two: str, mean: Path) -> str:
    """Steps one and two (MLPs of the numeric features; ``two`` the inline table of the
    second's model, its scores also published as ``second``), averaged by step avg."""
    return f"""{services}
[[pipelines]]
name = "fraud"
request_topics = ["{topics.requests}"]
result_topic = "{topics.results}"
dead_letter_topic = "{topics.dead_letters}"

[pipelines.batch]
max_batch_size = 64
max_wait_ms = 50

[pipelines.request]
id = "meta.request_id"
{fraud_lookup_tables(tag)}
[[pipelines.steps]]
name = "one"
model = {{ path = "{one}", name = "mlp-one" }}
inputs = {{ input = {orjson.dumps(NUMERIC).decode()} }}

[[pipelines.steps]]
name = "two"
model = {{ {two} }}
inputs = {{ input = {orjson.dumps(NUMERIC).decode()} }}
publish = {{ second = "output" }}

[[pipelines.steps]]
name = "avg"
model = {{ path = "{mean}", name = "mean" }}
inputs = {{ x = "one.output", y = "two.output" }}
"""


def by_hand(models: dict[str, bytes], mean: Path, data: FraudData) -> dict[str, Any]:
    """Step two's and the mean's scores for every request row, from ONNX Runtime."""
    rows = np.array([[float(r[c]) for c in NUMERIC] for r in data.rows()], dtype=np.float32)

    def run(model: bytes | str, feeds: dict[str, Any]) -> Any:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)[0]

    one, two = (run(models[v], {"input": rows}) for v in ("1", "2"))
    return {"second": two, "mean": run(str(mean), {"x": one, "y": two})}


def check_exact(out: Outcomes, expected: dict[str, Any], version: str) -> None:
    """Every result carries the mean and step two's scores as computed by hand, and
    names the graph's ``version``."""
    for doc in out.result_docs:
        row = int(doc["id"][1:])
        assert doc["model"]["name"] == "mlp-one+mlp-two+mean"
        assert doc["model"]["version"] == version
        for field in ("output", "second"):
            got = np.asarray(doc["outputs"][field], dtype=np.float32)
            want = expected["mean" if field == "output" else "second"][row]
            np.testing.assert_array_equal(got, want, err_msg=f"{field} of {doc['id']}")


def test_a_two_model_ensemble_scores_as_its_models_and_a_step_at_fault_is_named(
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    data = fraud_data(FIRST + HELD, seed=29)
    models = mlp_versions(data, tmp_path / "exports")
    one = tmp_path / "one.onnx"
    one.write_bytes(models["1"])
    two = tmp_path / "two"
    two.mkdir()
    publish_version(two, "1", models["2"])
    mean = make_mean(tmp_path / "mean.onnx", ["x", "y"], 2, output="output")
    topics = fresh_topics(PARTITIONS)
    tag = f"graph-{uuid.uuid4().hex[:8]}"
    store_features(redis_url, tag, data)
    port = free_port()
    config = tmp_path / "worker.toml"
    services = services_toml(
        bootstrap=kafka_bootstrap, group=topics.group, redis_url=redis_url, metrics_port=port
    )
    polled = f'path = "{two}", name = "mlp-two", reload_poll_s = 0.5'  # versions, polled
    config.write_text(graph_config(services, topics, tag, one, polled, mean))
    check = streamfer("check", "--config", str(config), "--skip-kafka", timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok: pipeline fraud" in check.stdout, check.stdout
    misfit = tmp_path / "misfit.toml"
    misfit.write_text(config.read_text().replace('y = "two.output"', 'y = "two.outputs"'))
    refused = streamfer("check", "--config", str(misfit), "--skip-kafka", timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "steps.avg.inputs.y: step two has no output 'outputs'" in refused.stdout + refused.stderr
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], PARTITIONS, timeout=90)
        requests = produced_requests(data, FIRST + HELD)
        first, held = requests[:FIRST], requests[FIRST:]
        produce_requests(kafka_bootstrap, topics.requests, first)
        outcomes = collect_outcomes(
            kafka_bootstrap,
            topics.results,
            topics.dead_letters,
            {r for r, _, _ in first},
            timeout=90,
            keep_docs=True,
        )
        assert not outcomes.dead_letter_ids, outcomes.dead_letters[:3]
        check_exact(outcomes, by_hand(models, mean, data), "1+1+1")

        publish_version(two, "2", failing_on_real_rows(models["2"]))
        assert eventually(lambda: reloads(port, "loaded") == 1, 30), worker.log_text()[-3000:]
        produce_requests(kafka_bootstrap, topics.requests, held)
        assert eventually(lambda: http_get(port, "/readyz")[0] == 503, 30), worker.log_text()[
            -3000:
        ]
        why = http_get(port, "/readyz")[1]
        assert "pipeline fraud: the model refused a whole batch and a row it answered" in why
        assert "step two:" in why, why

        publish_version(two, "3", models["2"])
        ids = {r for r, _, _ in requests}
        outcomes = collect_outcomes(
            kafka_bootstrap, topics.results, topics.dead_letters, ids, timeout=90, keep_docs=True
        )
        assert not outcomes.dead_letter_ids and not outcomes.dead_letters
        assert set(outcomes.results) == ids, f"{len(ids - set(outcomes.results))} unanswered"
        versions = {d["id"]: d["model"]["version"] for d in outcomes.result_docs}
        assert {versions[r] for r, _, _ in held} == {"1+3+1"}
        assert eventually(lambda: http_get(port, "/readyz")[0] == 200, 30)
        assert worker.terminate() == 0
        assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)
    finally:
        worker.terminate()
