"""Model versions replaced under a steady stream, against real Kafka and Redis.

The model is the torch-style MLP of ``tests.integration.recipes`` (one float input of
five features: two inline, one from the user's hash, two from the merchant's packed
vector), and each version has other weights, so every published score says which
version computed it: the test recomputes it with ONNX Runtime on the same row. Versions
are published as an operator should, into a folder named ``.N.tmp`` that is then
renamed to ``N``; a broken one is garbage bytes.

The gap bound. Requests come at a steady rate, so results come once per batch window
(``WINDOW_MS``) or faster; a reload that held the model thread up (loading or warming
on it, or a swap that waited for something) would show as a gap between two results
about as long as the load. The load and warm-up of these models take tens of ms, on
another thread. On a loaded 2-core machine the whole worker also stalls now and then
(another helper's tests, the producer in this test, a GC pause), so the bound on the
gap across each swap is one window plus ``SLACK_MS``, and the test reports the largest
gap elsewhere in the run beside it.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamfer_dev.harness import WorkerProcess, produce_requests
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, scrape_metrics
from tests.integration.recipes import FraudData, fraud_data
from tests.integration.served_mlp import (
    PARTITIONS,
    WINDOW_MS,
    Result,
    check_scores,
    in_background,
    mlp_versions,
    post,
    produced_requests,
    read_results,
    scores_by_version,
    sha,
    wait_for,
)

pytestmark = pytest.mark.integration

N_REQUESTS = 20_000
RATE = 800.0
"""Requests per second: 25 s of steady stream, two or three batches per window."""
SLACK_MS = 450


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(N_REQUESTS, seed=17)


@pytest.fixture(scope="module")
def models(data: FraudData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return mlp_versions(data, tmp_path_factory.mktemp("mlps"))


def publish_version(root: Path, version: str, content: bytes) -> None:
    """Write ``version`` beside the live ones, then make it visible with one rename."""
    staging = root / f".{version}.tmp"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(content)
    os.rename(staging, root / version)


def reloads(port: int, result: str) -> float:
    key = ("streamfer_model_reloads_total", (("pipeline", "fraud"), ("result", result)))
    return scrape_metrics(port).get(key, 0.0)


def live_models(port: int) -> set[tuple[str, str]]:
    """(version, sha256) of every streamfer_model_info series a /metrics shows."""
    return {
        (dict(labels)["version"], dict(labels)["sha256"])
        for (name, labels), value in scrape_metrics(port).items()
        if name == "streamfer_model_info" and value == 1
    }


def check_in_order(results: list[Result], order: list[str]) -> None:
    """Versions only move forward: within each partition, and across all of them (one
    pipeline publishes its batches in the order they ran)."""
    rank = {v: i for i, v in enumerate(order)}
    for p in range(PARTITIONS):
        seq = [rank[r.version] for r in sorted(results, key=lambda r: r.offset) if r.partition == p]
        assert seq == sorted(seq), f"partition {p}: a version came back after a newer one"
    for older, newer in itertools.pairwise(order):
        last_old = max(r.ts_ms for r in results if r.version == older)
        first_new = min(r.ts_ms for r in results if r.version == newer)
        assert last_old <= first_new, f"a result of {older} was published after one of {newer}"


@dataclass(frozen=True)
class Pauses:
    """How long results stopped coming, and how late they came, while each reload was
    under way (from the new file's rename until a second after it served or was
    refused), beside the same figures for the rest of the run."""

    gap_ms: list[int]
    """Per reload: the longest time between two consecutive results."""
    late_ms: list[int]
    """Per reload: the longest a request waited for its result."""
    gap_elsewhere_ms: int
    late_elsewhere_ms: int


def pauses(results: list[Result], periods: list[tuple[float, float]]) -> Pauses:
    ordered = sorted(results, key=lambda r: (r.ts_ms, r.partition, r.offset))
    spans = [(int(a * 1000), int(b * 1000)) for a, b in periods]

    def period_of(ts: int) -> int | None:
        return next((i for i, (a, b) in enumerate(spans) if a <= ts <= b), None)

    gap = [0] * len(spans)
    late = [0] * len(spans)
    gap_else = late_else = 0
    for a, b in itertools.pairwise(ordered):
        at = period_of(a.ts_ms)
        at = period_of(b.ts_ms) if at is None else at
        if at is None:
            gap_else = max(gap_else, b.ts_ms - a.ts_ms)
        else:
            gap[at] = max(gap[at], b.ts_ms - a.ts_ms)
    for r in ordered:
        wait = r.ts_ms - int(r.doc["request_ts_ms"])
        at = period_of(r.ts_ms)
        if at is None:
            late_else = max(late_else, wait)
        else:
            late[at] = max(late[at], wait)
    return Pauses(gap, late, gap_else, late_else)


def test_versions_replaced_twice_under_a_steady_stream_one_of_them_broken(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    topics = fresh_topics(PARTITIONS)
    root = tmp_path / "models" / "fraud-mlp"
    root.mkdir(parents=True)
    publish_version(root, "1", models["1"])
    worker, port = mlp_worker(topics, data, root, model_lines="reload_poll_s = 0.5")
    assert live_models(port) == {("1", sha(models["1"]))}

    produced = produced_requests(data, N_REQUESTS)
    join = in_background(
        lambda: produce_requests(kafka_bootstrap, topics.requests, produced, rate=RATE)
    )
    periods = []
    for version, result, count in (("2", "loaded", 1), ("3", "refused", 1), ("4", "loaded", 2)):
        time.sleep(4)
        started = time.time()
        publish_version(root, version, models[version])  # 3 is broken: 2 keeps serving
        wait_for(
            lambda result=result, count=count: reloads(port, result) == count,
            30,
            f"version {version}: {result}",
        )
        periods.append((started, time.time() + 1.0))
    join()

    ids = {rid for rid, _, _ in produced}
    results = read_results(kafka_bootstrap, topics.results, ids, timeout=120)
    seen = [r.doc["id"] for r in results]
    assert set(seen) == ids, f"{len(ids - set(seen))} requests have no result"
    assert len(seen) == len(ids), f"{len(seen) - len(set(seen))} duplicate results"
    order = ["1", "2", "4"]
    assert {r.version for r in results} == set(order)  # 3 never served
    for r in results:
        assert r.doc["model"]["sha256"] == sha(models[r.version])
    check_scores(results, scores_by_version(models, data), set(order))
    check_in_order(results, order)
    seen_pauses = pauses(results, periods)
    print(seen_pauses)
    assert max(seen_pauses.gap_ms) <= WINDOW_MS + SLACK_MS, seen_pauses

    assert reloads(port, "loaded") == 2 and reloads(port, "refused") == 1
    assert live_models(port) == {("4", sha(models["4"]))}
    log = worker.log_text()
    assert "model version 3 at" in log and "refused" in log and "version 2 keeps serving" in log
    assert worker.terminate() == 0
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_sighup_and_post_reload_a_file_that_is_not_watched(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """A plain model file, not watched: replacing it changes nothing until SIGHUP or
    POST /reload asks; the results then keep its version and name its new SHA-256."""
    topics = fresh_topics(PARTITIONS)
    path = tmp_path / "fraud-mlp.onnx"
    path.write_bytes(models["1"])
    worker, port = mlp_worker(topics, data, path, model_lines='version = "2026.1"')
    assert post(port, "/reload", "GET")[0] == 405

    rate = 400
    available = produced_requests(data, N_REQUESTS)
    produced: list[tuple[str, bytes, bytes]] = []
    last_loaded = threading.Event()

    def until_a_second_after_the_last_reload() -> Iterator[tuple[str, bytes, bytes]]:
        """The stream goes on until the last version has had a second of it, however
        long the reloads took on this machine."""
        tail = rate
        for item in available:
            if last_loaded.is_set():
                if tail == 0:
                    return
                tail -= 1
            produced.append(item)
            yield item

    join = in_background(
        lambda: produce_requests(
            kafka_bootstrap, topics.requests, until_a_second_after_the_last_reload(), rate=rate
        )
    )
    try:
        time.sleep(2)
        _replace(path, models["2"])
        time.sleep(3)
        assert live_models(port) == {("2026.1", sha(models["1"]))}  # not watched: not seen
        os.kill(worker.pid, signal.SIGHUP)
        wait_for(lambda: reloads(port, "loaded") == 1, 30, "SIGHUP to load the new file")
        time.sleep(2)
        _replace(path, models["4"])
        assert post(port, "/reload") == (202, "reload requested\n")
        wait_for(lambda: reloads(port, "loaded") == 2, 30, "POST /reload to load the new file")
    finally:
        last_loaded.set()
    join()

    results = read_results(kafka_bootstrap, topics.results, {r for r, _, _ in produced}, 120)
    assert sorted(r.doc["id"] for r in results) == sorted(r for r, _, _ in produced)
    assert {r.doc["model"]["version"] for r in results} == {"2026.1"}  # the config's
    by_sha = {sha(models[v]): v for v in ("1", "2", "4")}
    renamed = [  # each result named by the file it came from, to check as versions
        Result(r.partition, r.offset, r.ts_ms, {**r.doc, "model": {"version": by_sha[sha]}})
        for r in results
        for sha in [r.doc["model"]["sha256"]]
    ]
    assert {r.version for r in renamed} == {"1", "2", "4"}
    check_scores(renamed, scores_by_version(models, data), {"1", "2", "4"})
    check_in_order(renamed, ["1", "2", "4"])
    assert worker.alive()  # SIGHUP did not stop it
    assert worker.terminate() == 0


def test_a_reload_under_the_output_cache_never_serves_the_old_models_outputs(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """The same 500 rows four times (ids a, b, c, d), the file replaced and reloaded
    between b and c: a computes with the first model, b is all cached, c computes again
    with the new model (a cache key holds the model's SHA-256), d is all cached again.
    The reload drops the first model's rows from the in-process tier at once, as /metrics
    shows (entries and bytes 0), and leaves one provider series."""
    topics = fresh_topics(PARTITIONS)
    path = tmp_path / "fraud-mlp.onnx"
    path.write_bytes(models["1"])
    worker, port = mlp_worker(
        topics, data, path, pipeline_extra="[pipelines.cache]\nenabled = true\n"
    )
    expected = scores_by_version(models, data)
    by_sha = {sha(models[v]): v for v in ("1", "2", "4")}
    count = 500

    def one_round(prefix: str, version: str, cached: bool) -> None:
        produced = produced_requests(data, count, prefix)
        produce_requests(kafka_bootstrap, topics.requests, produced)
        ids = {rid for rid, _, _ in produced}
        results = [
            r for r in read_results(kafka_bootstrap, topics.results, ids, 90) if r.doc["id"] in ids
        ]
        assert sorted(r.doc["id"] for r in results) == sorted(ids)
        assert {r.doc.get("cached", False) for r in results} == {cached}, prefix
        named = [
            Result(r.partition, r.offset, r.ts_ms, {**r.doc, "model": {"version": by_sha[s]}})
            for r in results
            for s in [r.doc["model"]["sha256"]]
        ]
        check_scores(named, expected, {version})

    def held() -> tuple[float, float]:
        """The in-process tier's entries and bytes, as /metrics shows them."""
        exported = scrape_metrics(port)
        label = (("pipeline", "fraud"),)
        return (
            exported[("streamfer_cache_entries", label)],
            exported[("streamfer_cache_bytes", label)],
        )

    one_round("a", "1", cached=False)
    one_round("b", "1", cached=True)
    entries, nbytes = held()
    assert entries == count
    # a row: a 16-byte key, 176 bytes of overhead and the outputs' JSON (a score or two)
    assert count * (16 + 176 + 10) < nbytes < count * (16 + 176 + 500)
    _replace(path, models["2"])
    os.kill(worker.pid, signal.SIGHUP)
    wait_for(lambda: reloads(port, "loaded") == 1, 30, "SIGHUP to load the new file")
    assert held() == (0, 0)  # dropped at the swap, not left to be evicted
    one_round("c", "2", cached=False)
    entries, nbytes = held()  # the new model's rows only
    assert entries == count and count * (16 + 176 + 10) < nbytes < count * (16 + 176 + 500)
    one_round("d", "2", cached=True)
    metrics = scrape_metrics(port)
    providers = [labels for name, labels in metrics if name == "streamfer_inference_provider"]
    assert providers == [
        (
            ("pipeline", "fraud"),
            ("provider", "CPUExecutionProvider"),
            ("requested", "CPUExecutionProvider"),
        )
    ]
    misses = metrics[("streamfer_cache_misses_total", (("pipeline", "fraud"),))]
    hits = sum(
        v
        for (name, labels), v in metrics.items()
        if name == "streamfer_cache_hits_total" and dict(labels)["pipeline"] == "fraud"
    )
    assert (misses, hits) == (2 * count, 2 * count)
    assert worker.terminate() == 0


def test_a_supervisor_hands_sighup_and_post_reload_to_every_worker(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    mlp_worker: Callable[..., tuple[WorkerProcess, int]],
    data: FraudData,
    models: dict[str, bytes],
    tmp_path: Path,
) -> None:
    topics = fresh_topics(PARTITIONS)
    path = tmp_path / "fraud-mlp.onnx"
    path.write_bytes(models["1"])
    supervisor, port = mlp_worker(topics, data, path, args=("--processes", "2"))

    def per_process() -> dict[str, set[str]]:
        """Process -> the SHA-256 its streamfer_model_info shows (none until it serves)."""
        out: dict[str, set[str]] = {}
        try:
            samples = scrape_metrics(port)
        except OSError:  # the supervisor is not serving yet
            return out
        for (name, labels), value in samples.items():
            if name == "streamfer_model_info" and value == 1:
                out.setdefault(dict(labels)["process"], set()).add(dict(labels)["sha256"])
        return out

    wait_for(lambda: len(per_process()) == 2, 90, "both workers to serve")
    _replace(path, models["2"])
    os.kill(supervisor.pid, signal.SIGHUP)
    two = {"0": {sha(models["2"])}, "1": {sha(models["2"])}}
    wait_for(lambda: per_process() == two, 30, "both workers to load version 2")
    _replace(path, models["4"])
    status, body = post(port, "/reload")
    assert (status, body) == (202, "reload requested of 2 worker processes\n")
    four = {"0": {sha(models["4"])}, "1": {sha(models["4"])}}
    wait_for(lambda: per_process() == four, 30, "both workers to load version 4")

    produced = produced_requests(data, 500)
    produce_requests(kafka_bootstrap, topics.requests, produced)
    results = read_results(kafka_bootstrap, topics.results, {r for r, _, _ in produced}, 90)
    assert {r.doc["model"]["sha256"] for r in results} == {sha(models["4"])}
    assert "restarting" not in supervisor.log_text()
    assert supervisor.terminate() == 0


def _replace(path: Path, content: bytes) -> None:
    """Replace a model file as a deployment should: write beside it, then rename."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    staging.write_bytes(content)
    os.replace(staging, path)
