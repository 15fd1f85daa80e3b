"""A canary and a shadow of a model on a real Triton server, against real Kafka and Redis.

The server serves the pipeline's model as ``fraud`` and a candidate with other weights
as ``fraud_b`` (A/B by model name, as Triton users do beside versions; PyTriton serves
one version of a model name). The canary's keys come from the documented rule, computed
here; every score is compared exactly with ONNX Runtime's in this process on the same
row, so each one also says which model computed it. The server, models and data are
``test_triton``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamfer_dev.harness import WorkerProcess, collect_outcomes, produce_requests
from streamfer_dev.triton import TritonServer
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, scrape_metrics
from tests.integration.recipes import FraudData
from tests.integration.served_mlp import PARTITIONS, produced_requests
from tests.integration.test_canary_shadow import _canary_keys
from tests.integration.test_triton import (  # noqa: F401 (fixtures)
    ON_TRITON,
    data,
    expected,
    models,
    outcomes,
    triton,
)
from worker.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

PERCENT = 30


def test_a_canary_and_a_shadow_on_the_server_score_as_the_local_models(
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    triton: Callable[..., TritonServer],  # noqa: F811
    models: dict[str, Path],  # noqa: F811
    data: FraudData,  # noqa: F811
    expected: dict[str, np.ndarray[Any, Any]],  # noqa: F811
    kafka_bootstrap: str,
) -> None:
    server = triton([f"fraud:1:{models['1']}", f"fraud_b:1:{models['2']}"])
    topics = fresh_topics(PARTITIONS)
    shadow_topic = f"{topics.results}-shadow"
    ensure_topics(kafka_bootstrap, [(shadow_topic, PARTITIONS)])
    tables = f"""
[pipelines.model.triton]
url = "{server.url}"
model = "fraud"
version = "1"
timeout_s = 5

[pipelines.canary]
server_model = "fraud_b"
version = "1"
percent = {PERCENT}

[pipelines.shadow]
server_model = "fraud_b"
version = "1"
topic = "{shadow_topic}"
queue_batches = 64
"""
    worker, port = mlp_worker(topics, data, None, model_lines=ON_TRITON, pipeline_extra=tables)
    requests = produced_requests(data, 600)
    produce_requests(kafka_bootstrap, topics.requests, requests)
    ids = {rid for rid, _k, _v in requests}
    out = outcomes(kafka_bootstrap, topics, ids)
    assert set(out.results) == ids and out.duplicates() == 0 and not out.dead_letter_ids
    shadows = collect_outcomes(
        kafka_bootstrap, shadow_topic, topics.dead_letters, ids, timeout=120, keep_docs=True
    )
    assert set(shadows.results) == ids and shadows.duplicates() == 0

    chosen = _canary_keys([key for _rid, key, _v in requests], PERCENT)
    assert 0.2 < len(chosen) / len(requests) < 0.4
    primary = None
    for doc in out.result_docs:
        row, canary = int(doc["id"][1:]), doc["key"].encode() in chosen
        if canary:
            assert doc["model"]["name"] == "fraud_b" and doc["model"]["version"] == "1", doc
        else:
            primary = primary or doc["model"]["name"]
            assert doc["model"]["name"] == primary != "fraud_b", doc
        want = expected["2" if canary else "1"][row]
        got = np.asarray(doc["outputs"]["scores"], dtype=np.float32)
        assert np.array_equal(got, want), (doc["id"], got, want)
    for doc in shadows.result_docs:
        assert doc["model"]["name"] == "fraud_b" and doc["shadows"]["name"] == primary, doc
        got = np.asarray(doc["outputs"]["scores"], dtype=np.float32)
        assert np.array_equal(got, expected["2"][int(doc["id"][1:])]), doc["id"]
    metrics = scrape_metrics(port)
    assert metrics.get(("streamfer_canary_records_total", (("pipeline", "fraud"),))) == len(chosen)
    done = ("streamfer_shadow_batches_total", (("pipeline", "fraud"), ("result", "done")))
    assert metrics.get(done) == metrics.get(("streamfer_batches_total", (("pipeline", "fraud"),)))
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)
