"""``streamfer replay`` of a pipeline whose model a real Triton server runs, against real
Kafka and Redis: the plan records the server, the model's name and the version served;
a resume re-checks it and refuses another version unless ``--current-model`` asks for
it; results carry the version that scored them, exactly as ONNX Runtime scores it here.
The server, models and data are ``test_triton``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from streamfer_dev.harness import Outcomes, collect_outcomes, produce_requests
from streamfer_dev.triton import TritonServer
from tests.conftest import Topics
from tests.integration.conftest import MlpConfig
from tests.integration.helpers import streamfer
from tests.integration.recipes import FraudData
from tests.integration.served_mlp import PARTITIONS, produced_requests
from tests.integration.test_triton import (  # noqa: F401 (fixtures)
    ON_TRITON,
    check_exact,
    data,
    expected,
    models,
    triton,
    triton_table,
)

pytestmark = pytest.mark.integration


def _summary(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def replayed(bootstrap: str, summary: dict[str, Any], ids: set[str]) -> Outcomes:
    """What a replay published, by the topics its summary names."""
    return collect_outcomes(
        bootstrap,
        summary["output_topic"],
        summary["dead_letter_topic"],
        ids,
        timeout=60,
        keep_docs=True,
    )


def test_replay_runs_on_the_server_and_a_resume_checks_its_version(
    fresh_topics: Callable[..., Topics],
    mlp_config: MlpConfig,
    triton: Callable[..., TritonServer],  # noqa: F811
    models: dict[str, Path],  # noqa: F811
    data: FraudData,  # noqa: F811
    expected: dict[str, np.ndarray[Any, Any]],  # noqa: F811
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    server = triton([f"fraud:1:{models['1']}"])
    topics = fresh_topics(PARTITIONS)
    config, _port = mlp_config(
        topics, data, None, model_lines=ON_TRITON, pipeline_extra=triton_table(server.url)
    )
    requests = produced_requests(data, 300)
    produce_requests(kafka_bootstrap, topics.requests, requests)
    ids = {rid for rid, _k, _v in requests}
    replay = ["replay", "--config", str(config), "--state-dir", str(tmp_path / "state")]

    first = _summary(streamfer(*replay, "--replay-id", "t1", "--json"))
    assert first["records"] == 300 and first["results"] == 300 and first["complete"]
    assert first["model"]["version"] == "1" and first["model"]["server"] == server.url
    assert first["output_topic"] == f"{topics.results}.replay.1"
    plan = orjson.loads((tmp_path / "state" / "t1.json").read_bytes())
    assert (plan["server"], plan["server_model"], plan["model_version"]) == (
        server.url,
        "fraud",
        "1",
    )
    assert plan["model_path"] is None and plan["model_signature"]
    out = replayed(kafka_bootstrap, first, ids)
    assert set(out.results) == ids and out.duplicates() == 0
    check_exact(out, expected, {"1"})

    # the server moves to version 2: the replay's plan no longer fits it
    server.stop()
    server = triton([f"fraud:2:{models['2']}"], grpc_port=server.grpc_port)
    refused = streamfer(*replay, "--resume", "t1", "--json")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "version 1" in refused.stderr and "serves version 2 now" in refused.stderr
    assert "--current-model" in refused.stderr
    taken = _summary(streamfer(*replay, "--resume", "t1", "--current-model", "--json"))
    assert taken["model"]["version"] == "2" and taken["records"] == 0
    plan = orjson.loads((tmp_path / "state" / "t1.json").read_bytes())
    assert plan["model_version"] == "2"

    # a new replay takes the version the server serves, and its results name it
    second = _summary(streamfer(*replay, "--replay-id", "t2", "--json"))
    assert second["model"]["version"] == "2" and second["results"] == 300
    assert second["output_topic"] == f"{topics.results}.replay.2"
    out = replayed(kafka_bootstrap, second, ids)
    assert set(out.results) == ids and out.duplicates() == 0
    check_exact(out, expected, {"2"})

    # a file given instead runs in the worker, as the local engine: the same scores
    local = _summary(
        streamfer(*replay, "--model", str(models["1"]), "--model-version", "11", "--json")
    )
    assert local["model"]["version"] == "11" and local["model"]["path"] == str(models["1"])
    out = replayed(kafka_bootstrap, local, ids)
    assert set(out.results) == ids
    for doc in out.result_docs:
        got = np.asarray(doc["outputs"]["scores"], dtype=np.float32)
        assert np.array_equal(got, expected["1"][int(doc["id"][1:])]), doc["id"]
