"""A model fault in one pipeline holds that pipeline only, against real Kafka and Redis:
one worker serves two pipelines from two request topics; one's model version fails on
every real row (``test_model_faults.failing_on_real_rows``). While it is held, every
request of the healthy pipeline is answered, only the held pipeline's partitions pause,
its requests are neither answered nor dead-lettered, and ``/readyz`` names it; once a
fixed version is hot-reloaded, every held request is answered on it and both topics are
committed to their end. Nothing is lost, nothing dead-lettered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from streamfer_dev.harness import (
    WorkerProcess,
    collect_outcomes,
    pipeline_toml,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import (
    eventually,
    http_get,
    scrape_metrics,
    services_toml,
    wait_committed_to_end,
)
from tests.integration.test_hot_reload import publish_version
from tests.integration.test_model_faults import failing_on_real_rows

pytestmark = pytest.mark.integration

FIRST = 100
"""Requests the held pipeline answers before its model breaks (a row known to be good)."""
HELD = 600
"""Requests sent to the held pipeline while its model fails: more than the in-flight
bound (4 batches of 32), so its partitions must pause."""
HEALTHY = 2_000


def requests(prefix: str, entities: list[str], n: int) -> Iterator[tuple[str, bytes, bytes]]:
    for i in range(n):
        entity = entities[i % len(entities)]
        rid = f"{prefix}{i}"
        yield rid, entity.encode(), orjson.dumps({"id": rid, "entity": entity})


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of the series of ``name`` on /metrics whose labels include ``labels``."""
    return sum(
        value
        for (n, have), value in scrape_metrics(port).items()
        if n == name and set(labels.items()) <= set(have)
    )


def test_a_broken_model_holds_its_pipeline_while_the_other_is_served(
    kafka_bootstrap: str,
    redis_url: str,
    model: DemoModel,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    healthy, held = fresh_topics(2), fresh_topics(2)
    root = tmp_path / "models"
    root.mkdir()
    good = model.path.read_bytes()
    publish_version(root, "1", good)
    port = free_port()

    def pipeline(name: str, topics: Topics, path: Path) -> str:
        return pipeline_toml(
            name=name,
            request_topic=topics.requests,
            result_topic=topics.results,
            dead_letter_topic=topics.dead_letters,
            model_path=path,
            model_name="demo",
            fields=model.fields,
            batch={"max_batch_size": 32, "max_wait_ms": 5},
        )

    config = tmp_path / "worker.toml"
    config.write_text(
        "max_in_flight_batches = 4\n"
        + services_toml(
            bootstrap=kafka_bootstrap, group=healthy.group, redis_url=redis_url, metrics_port=port
        )
        + pipeline("healthy", healthy, model.path)
        + pipeline("held", held, root)
        + "reload_poll_s = 0.5\n"
    )
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 4, timeout=90)
        first = list(requests("f", entities, FIRST))
        produce_requests(kafka_bootstrap, held.requests, first)
        served = collect_outcomes(
            kafka_bootstrap, held.results, held.dead_letters, {r for r, _, _ in first}, timeout=60
        )
        assert set(served.results) == {r for r, _, _ in first}, worker.log_text()[-3000:]

        publish_version(root, "2", failing_on_real_rows(good))
        loaded = ("streamfer_model_reloads_total", {"pipeline": "held", "result": "loaded"})
        assert eventually(lambda: metric(port, loaded[0], **loaded[1]) == 1, 30)
        waiting = list(requests("w", entities, HELD))
        produce_requests(kafka_bootstrap, held.requests, waiting)
        not_ready = eventually(lambda: http_get(port, "/readyz")[0] == 503, 30)
        assert not_ready, worker.log_text()[-3000:]
        _status, why = http_get(port, "/readyz")
        assert "pipeline held: the model refused a whole batch" in why, why
        assert "pipeline healthy" not in why, why
        assert eventually(lambda: metric(port, "streamfer_paused_partitions") == 2, 30)

        # the healthy pipeline is served in full while the other is held
        answered = list(requests("h", entities, HEALTHY))
        produce_requests(kafka_bootstrap, healthy.requests, answered)
        outcomes = collect_outcomes(
            kafka_bootstrap,
            healthy.results,
            healthy.dead_letters,
            {r for r, _, _ in answered},
            timeout=120,
        )
        assert set(outcomes.results) == {r for r, _, _ in answered}, worker.log_text()[-3000:]
        assert not outcomes.dead_letters and max(outcomes.results.values()) == 1
        assert metric(port, "streamfer_model_paused", pipeline="held") == 1
        assert metric(port, "streamfer_model_paused", pipeline="healthy") == 0
        assert metric(port, "streamfer_paused_partitions") == 2
        assert http_get(port, "/readyz")[0] == 503
        wait_committed_to_end(kafka_bootstrap, healthy.group, healthy.requests)
        still = collect_outcomes(
            kafka_bootstrap,
            held.results,
            held.dead_letters,
            {r for r, _, _ in first + waiting},
            timeout=3,
        )
        assert set(still.results) == {r for r, _, _ in first} and not still.dead_letters
        assert metric(port, "streamfer_dead_letters_total") == 0

        publish_version(root, "3", good)
        ids = {r for r, _, _ in first + waiting}
        after = collect_outcomes(
            kafka_bootstrap, held.results, held.dead_letters, ids, timeout=120, keep_docs=True
        )
        assert set(after.results) == ids, f"{len(ids - set(after.results))} unanswered"
        assert not after.dead_letters and max(after.results.values()) == 1
        versions = {d["id"]: d["model"]["version"] for d in after.result_docs}
        assert {versions[r] for r, _, _ in waiting} == {"3"}
        assert eventually(lambda: http_get(port, "/readyz")[0] == 200, 30)
        assert metric(port, "streamfer_model_paused", pipeline="held") == 0
        assert eventually(lambda: metric(port, "streamfer_paused_partitions") == 0, 30)
        wait_committed_to_end(kafka_bootstrap, healthy.group, held.requests)
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_text()[-3000:]
