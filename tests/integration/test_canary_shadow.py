"""Canary and shadow models beside a pipeline's own, against real Kafka and Redis.

The pipeline serves version 1 of the MLP of ``tests.integration.served_mlp``; the
candidate is version 2 (other weights), so each published score says which model
computed it. The canary's keys are computed here from the documented rule (BLAKE2b of
the key, modulo 10,000, below percent x 100), not taken from the worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from benchmarks.fault_models import make_slow_model
from streamfer_dev.harness import WorkerProcess, percentile, produce_requests
from tests.conftest import Topics
from tests.fakes.onnx_models import random_mlp
from tests.integration.helpers import (
    assert_committed_to_end,
    assert_valid,
    scrape_metrics,
    streamfer,
    validator,
)
from tests.integration.recipes import NUMERIC, FraudData, fraud_data
from tests.integration.served_mlp import (
    Result,
    check_scores,
    in_background,
    mlp_versions,
    produced_requests,
    read_results,
    scores_by_version,
    sha,
)
from worker.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

N_REQUESTS = 4000


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(N_REQUESTS, seed=23)


@pytest.fixture(scope="module")
def models(data: FraudData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return mlp_versions(data, tmp_path_factory.mktemp("mlps"))


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _shadow_topic(bootstrap: str, topics: Topics) -> str:
    topic = f"{topics.results}-shadow"
    ensure_topics(bootstrap, [(topic, 4)])
    return topic


def _sample(port: int, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"pipeline": "fraud", **labels}.items())))
    return scrape_metrics(port).get(key, 0.0)


def _results_and_shadows(
    bootstrap: str, topics: Topics, shadow_topic: str, produced: list[tuple[str, bytes, bytes]]
) -> tuple[list[Result], list[Result]]:
    """Stream ``produced`` at 1,000/s; every request has one result and one shadow."""
    produce_requests(bootstrap, topics.requests, produced, rate=1000)
    ids = {rid for rid, _, _ in produced}
    results = read_results(bootstrap, topics.results, ids, timeout=120)
    shadows = read_results(bootstrap, shadow_topic, ids, timeout=120)
    assert sorted(r.doc["id"] for r in results) == sorted(ids)  # none lost, none twice
    assert sorted(r.doc["id"] for r in shadows) == sorted(ids)  # every batch, every row
    return results, shadows


def _assert_agreement(
    port: int, published: np.ndarray[Any, Any], shadow: np.ndarray[Any, Any]
) -> None:
    """The worker's agreement metrics say what the two score tables (row-aligned) do."""
    share = float((published.argmax(axis=1) == shadow.argmax(axis=1)).mean())
    diff = float(np.abs(published.astype(np.float64) - shadow).mean())
    assert _sample(port, "streamfer_shadow_label_agreement") == pytest.approx(share, abs=1e-12)
    assert _sample(port, "streamfer_shadow_score_abs_diff") == pytest.approx(diff, rel=1e-5)


def _canary_keys(keys: list[bytes], percent: float) -> set[bytes]:
    below = percent * 100
    return {
        k
        for k in keys
        if int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "big") % 10_000 < below
    }


def test_a_canary_scores_exactly_its_keys_and_names_its_version(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    topics = fresh_topics(4)
    primary = _write(tmp_path / "fraud.onnx", models["1"])
    candidate = _write(tmp_path / "fraud-next.onnx", models["2"])
    canary = f'[pipelines.canary]\nmodel = "{candidate}"\nversion = "2"\npercent = 10\n'
    worker, port = mlp_worker(topics, data, primary, pipeline_extra=canary)
    check = streamfer("check", "--config", str(worker.config_path), "--skip-kafka", timeout=120)
    assert check.returncode == 0, check.stderr[-2000:]
    assert f"canary fraud-mlp:2 ({sha(models['2'])[:12]}) fits; scores 10% of keys" in check.stdout

    produced = produced_requests(data, N_REQUESTS)
    produce_requests(kafka_bootstrap, topics.requests, produced)
    ids = {rid for rid, _, _ in produced}
    results = read_results(kafka_bootstrap, topics.results, ids, timeout=120)
    assert sorted(r.doc["id"] for r in results) == sorted(ids)  # none lost, none twice

    chosen = _canary_keys([key for _, key, _ in produced], 10)
    assert 0.08 < len(chosen) / N_REQUESTS < 0.12
    for r in results:
        version = "2" if r.doc["key"].encode() in chosen else "1"
        assert r.version == version, (r.doc["key"], r.doc["model"])
        assert r.doc["model"] == {
            "name": "fraud-mlp",
            "version": version,
            "sha256": sha(models[version]),
        }
    check_scores(results, scores_by_version(models, data), {"1", "2"})
    assert _sample(port, "streamfer_canary_records_total") == len(chosen)
    schema = validator("result")
    for r in results[:200]:
        assert_valid(schema, r.doc)
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_a_shadow_that_keeps_up_scores_every_batch_and_measures_agreement(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    topics = fresh_topics(4)
    shadow_topic = _shadow_topic(kafka_bootstrap, topics)
    primary = _write(tmp_path / "fraud.onnx", models["1"])
    candidate = _write(tmp_path / "fraud-next.onnx", models["2"])
    shadow = (
        f'[pipelines.shadow]\nmodel = "{candidate}"\nversion = "2"\ntopic = "{shadow_topic}"\n'
        "queue_batches = 64\n"
    )
    worker, port = mlp_worker(topics, data, primary, pipeline_extra=shadow)

    produced = produced_requests(data, N_REQUESTS)
    results, shadows = _results_and_shadows(kafka_bootstrap, topics, shadow_topic, produced)

    expected = scores_by_version(models, data)
    check_scores(results, expected, {"1"})
    check_scores(shadows, expected, {"2"})
    schema = validator("result")
    for r in shadows:
        assert r.doc["shadows"] == {"name": "fraud-mlp", "version": "1", "sha256": sha(models["1"])}
        assert r.doc["model"]["sha256"] == sha(models["2"])
        assert r.doc["pipeline"] == "fraud"
    for r in shadows[:200]:
        assert_valid(schema, r.doc)
    # the same rows through both models: what the worker's agreement metrics must say
    _assert_agreement(port, expected["1"][:N_REQUESTS], expected["2"][:N_REQUESTS])
    batches = _sample(port, "streamfer_batches_total")
    assert _sample(port, "streamfer_shadow_batches_total", result="done") == batches
    assert _sample(port, "streamfer_shadow_batches_total", result="dropped") == 0
    assert _sample(port, "streamfer_shadow_batches_total", result="failed") == 0
    assert _sample(port, "streamfer_shadow_seconds_count") == batches
    assert worker.terminate() == 0


def test_a_canary_and_a_shadow_together_each_do_their_part(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """Version 1 serves, version 2 is the canary for a fifth of the keys, version 4 the
    shadow of every row: results split by the key rule, shadows for every id, and the
    agreement measured against what was published (the canary's scores on its rows)."""
    topics = fresh_topics(4)
    shadow_topic = _shadow_topic(kafka_bootstrap, topics)
    primary = _write(tmp_path / "fraud.onnx", models["1"])
    canary = _write(tmp_path / "fraud-canary.onnx", models["2"])
    shadow = _write(tmp_path / "fraud-shadow.onnx", models["4"])
    extra = (
        f'[pipelines.canary]\nmodel = "{canary}"\nversion = "2"\npercent = 20\n'
        f'[pipelines.shadow]\nmodel = "{shadow}"\nversion = "4"\ntopic = "{shadow_topic}"\n'
        "queue_batches = 64\n"
    )
    worker, port = mlp_worker(topics, data, primary, pipeline_extra=extra)

    produced = produced_requests(data, N_REQUESTS)
    results, shadows = _results_and_shadows(kafka_bootstrap, topics, shadow_topic, produced)

    chosen = _canary_keys([key for _, key, _ in produced], 20)
    assert 0.17 < len(chosen) / N_REQUESTS < 0.23
    for r in results:
        assert r.version == ("2" if r.doc["key"].encode() in chosen else "1"), r.doc["key"]
    expected = scores_by_version(models, data)
    check_scores(results, expected, {"1", "2"})
    check_scores(shadows, expected, {"4"})
    assert _sample(port, "streamfer_canary_records_total") == len(chosen)

    served = np.stack(
        [
            expected["2" if key in chosen else "1"][int(rid[1:])]
            for rid, key, _ in sorted(produced, key=lambda p: int(p[0][1:]))
        ]
    )
    _assert_agreement(port, served, expected["4"][: len(served)])
    batches = _sample(port, "streamfer_batches_total")
    assert _sample(port, "streamfer_shadow_batches_total", result="done") == batches
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def _slow_like_the_pipeline(path: Path, seconds_per_batch: float) -> Path:
    """``make_slow_model`` with the pipeline's input and output names (``input``, five
    columns; ``output``), so that it is fed like the pipeline's model."""
    make_slow_model(path, seconds_per_batch=seconds_per_batch, batch_size=16, n_features=5)
    return _renamed(path, {"x": "input", "score": "output"})


def _renamed(path: Path, renames: dict[str, str]) -> Path:
    """Rename a model's inputs and outputs in place."""
    model = onnx.load(path)
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in (*model.graph.input, *model.graph.output):
        value.name = renames.get(value.name, value.name)
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def test_a_slow_shadow_is_dropped_and_counted_and_never_slows_the_pipeline(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """The shadow takes a quarter of a second or more per batch (a deep MLP sized for it
    here) while batches come every window (50 ms): it keeps up with one batch in five at
    best, and it keeps one of the two cores busy. The pipeline's publish waits at most
    ``max_delay_ms`` (20) for room in the shadow's queue, then drops the batch for the
    shadow. Had it waited for the shadow instead, each of the ~170 batches would take
    the shadow's time and the backlog, and every request's latency, would grow by tens
    of seconds; the bounds (p50 250 ms, p99 2 s) leave room for a loaded machine and
    still tell the two apart."""
    topics = fresh_topics(4)
    shadow_topic = _shadow_topic(kafka_bootstrap, topics)
    primary = _write(tmp_path / "fraud.onnx", models["1"])
    slow = _slow_like_the_pipeline(tmp_path / "slow.onnx", seconds_per_batch=0.15)
    shadow = (
        f'[pipelines.shadow]\nmodel = "{slow}"\nversion = "slow"\ntopic = "{shadow_topic}"\n'
        "queue_batches = 2\nmax_delay_ms = 20\n"
    )
    worker, port = mlp_worker(topics, data, primary, pipeline_extra=shadow)

    produced = produced_requests(data, 3000)
    join = in_background(
        lambda: produce_requests(kafka_bootstrap, topics.requests, produced, rate=300)
    )
    join()
    ids = {rid for rid, _, _ in produced}
    results = read_results(kafka_bootstrap, topics.results, ids, timeout=120)
    assert sorted(r.doc["id"] for r in results) == sorted(ids)
    check_scores(results, scores_by_version(models, data), {"1"})
    latency = [r.ts_ms - int(r.doc["request_ts_ms"]) for r in results]
    p50, p99 = percentile(latency, 50), percentile(latency, 99)
    batches = _sample(port, "streamfer_batches_total")
    dropped = _sample(port, "streamfer_shadow_batches_total", result="dropped")
    done = _sample(port, "streamfer_shadow_batches_total", result="done")
    print(
        f"pipeline latency p50 {p50:.0f} ms p99 {p99:.0f} ms; {batches:.0f} batches, "
        f"shadow done {done:.0f}, dropped {dropped:.0f}"
    )
    assert dropped >= batches / 2, (batches, dropped, done)
    assert done >= 1
    assert p50 <= 250 and p99 <= 2000, (p50, p99)
    assert _sample(port, "streamfer_shadow_batches_total", result="failed") == 0
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


@pytest.mark.parametrize("role", ["canary", "shadow"])
def test_a_candidate_that_does_not_fit_the_pipeline_exits_2(
    fresh_topics: Callable[..., Topics],
    mlp_config: Callable[..., tuple[Path, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
    role: str,
) -> None:
    """Four inputs where the pipeline feeds five: refused before the group is joined,
    by ``check`` and by ``run``."""
    topics = fresh_topics(1)
    primary = _write(tmp_path / "fraud.onnx", models["1"])
    narrow = random_mlp(tmp_path / "candidates" / "7" / "model.onnx", n_in=len(NUMERIC) - 1)
    _renamed(narrow, {"probabilities": "output"})
    extra = f'[pipelines.{role}]\nmodel = "{narrow.parent.parent}"\n' + (
        "percent = 5\n" if role == "canary" else f'topic = "{topics.results}-shadow"\n'
    )
    config, _port = mlp_config(topics, data, primary, pipeline_extra=extra)
    for command in (["check", "--skip-kafka"], ["run"]):
        done = streamfer(command[0], "--config", str(config), *command[1:], timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"pipelines.fraud.{role}: model {narrow}" in done.stderr, done.stderr[-2000:]
        assert "takes 4 columns but 5 features feed it" in done.stderr, done.stderr[-2000:]
