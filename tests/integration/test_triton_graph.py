"""A model graph with a step on a real Triton server, against real Kafka and Redis.

Step ``one`` is an ONNX file run in the worker, step ``two`` the same MLP's second
version on the server (``test_triton``'s server, models and data), step ``avg`` their
mean, in the worker. ``check`` asks the step's server; every result's scores are those
of the three models run by hand.
The server stops mid-stream: the batch waits, ``/readyz`` names the step and the server,
nothing is dead-lettered or lost, and once the server is back the rest is served.
``streamfer replay`` of the graph's topic then publishes the same outputs, its plan
recording every step's model.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    end_offsets,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import make_mean
from streamfer_dev.stack import free_port
from streamfer_dev.triton import TritonServer
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, services_toml, streamfer
from tests.integration.recipes import FraudData
from tests.integration.served_mlp import PARTITIONS, produced_requests, wait_for
from tests.integration.test_bring_your_own_model import store_features
from tests.integration.test_model_graph import by_hand, check_exact, graph_config
from tests.integration.test_triton import (  # noqa: F401 (fixtures)
    data,
    models,
    readyz,
    triton,
)

pytestmark = pytest.mark.integration

FIRST = 200
LATER = 200


def on_server(url: str) -> str:
    """Step two's model: the server's ``fraud``, whichever version it serves."""
    table = f'url = "{url}", model = "fraud", timeout_s = 5'
    return f'engine = "triton", name = "mlp-two", triton = {{ {table} }}'


def test_a_graph_step_on_the_server_waits_out_its_outage_and_replays_the_same(
    triton: Callable[..., TritonServer],  # noqa: F811
    models: dict[str, Path],  # noqa: F811
    data: FraudData,  # noqa: F811
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    server = triton([f"fraud:2:{models['2']}"])
    mean = make_mean(tmp_path / "mean.onnx", ["x", "y"], 2, output="output")
    topics = fresh_topics(PARTITIONS)
    tag = f"tgraph-{uuid.uuid4().hex[:8]}"
    store_features(redis_url, tag, data)
    port = free_port()
    services = services_toml(
        bootstrap=kafka_bootstrap, group=topics.group, redis_url=redis_url, metrics_port=port
    )
    config = tmp_path / "worker.toml"
    config.write_text(graph_config(services, topics, tag, models["1"], on_server(server.url), mean))
    expected = by_hand({v: p.read_bytes() for v, p in models.items()}, mean, data)
    check = streamfer("check", "--config", str(config), "--skip-kafka", timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"step two triton server: {server.url} live" in check.stdout, check.stdout
    assert f"step two triton model: fraud:2 at {server.url} ready" in check.stdout
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], PARTITIONS, timeout=90)
        requests = produced_requests(data, FIRST + LATER)
        first, later = requests[:FIRST], requests[FIRST:]
        produce_requests(kafka_bootstrap, topics.requests, first)
        ids = {r for r, _, _ in first}
        out = collect_outcomes(
            kafka_bootstrap, topics.results, topics.dead_letters, ids, timeout=60, keep_docs=True
        )
        assert not out.lost(ids) and not out.dead_letter_ids, worker.log_text()[-3000:]
        check_exact(out, expected, "1+2+1")

        server.stop()
        produce_requests(kafka_bootstrap, topics.requests, later)
        wait_for(lambda: readyz(port)[0] == 503, 60, "/readyz 503")
        body = readyz(port)[1]
        assert "pipeline fraud: step two: inference server" in body, body
        assert server.url in body, body
        assert worker.alive()
        assert sum(end_offsets(kafka_bootstrap, topics.dead_letters).values()) == 0
        server = triton([f"fraud:2:{models['2']}"], grpc_port=server.grpc_port)
        wait_for(lambda: readyz(port)[0] == 200, 60, "/readyz 200 again")
        ids |= {r for r, _, _ in later}
        out = collect_outcomes(
            kafka_bootstrap, topics.results, topics.dead_letters, ids, timeout=60, keep_docs=True
        )
        assert not out.lost(ids), f"lost: {out.lost(ids)[:5]}"
        assert out.duplicates() == 0 and not out.dead_letter_ids
        assert sum(end_offsets(kafka_bootstrap, topics.dead_letters).values()) == 0
        check_exact(out, expected, "1+2+1")
        assert worker.terminate() == 0
        assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)
    finally:
        worker.terminate()
    live = {doc["id"]: doc["outputs"] for doc in out.result_docs}
    replay_the_graph(config, tmp_path / "state", kafka_bootstrap, live, server.url)


def replay_the_graph(
    config: Path, state: Path, bootstrap: str, live: dict[str, Any], url: str
) -> None:
    """``streamfer replay`` of the graph's topic: the live outputs again, and a plan
    naming every step's model."""
    done = streamfer(
        "replay", "--config", str(config), "--state-dir", str(state), "--replay-id", "g1", "--json"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert summary["complete"] and summary["results"] == len(live), summary
    assert summary["model"]["version"] == "1+2+1"
    assert summary["output_topic"].endswith(".replay.1_2_1")
    again = collect_outcomes(
        bootstrap,
        summary["output_topic"],
        summary["dead_letter_topic"],
        set(live),
        timeout=60,
        keep_docs=True,
    )
    assert not again.dead_letter_ids and not again.lost(set(live))
    assert {doc["id"]: doc["outputs"] for doc in again.result_docs} == live
    steps = orjson.loads((state / "g1.json").read_bytes())["steps"]
    assert [(s["step"], s["version"]) for s in steps] == [("one", "1"), ("two", "2"), ("avg", "1")]
    one, two, avg = steps
    assert one["path"].endswith("v1.onnx") and len(one["sha256"]) == 64 and avg["sha256"]
    assert (two["server"], two["server_model"], two["path"]) == (url, "fraud", None)
    assert two["signature"] and two["sha256"]
