"""Priority lanes against real Kafka and Redis: one worker serves a bulk pipeline draining
a backlog of 20,000 requests on a heavy model and an interactive pipeline on a steady
trickle. Every request of both gets exactly one result, in its partition's order, the
commits reach the log end on both, only the bulk pipeline's partitions are paused for
its share, and interactive results keep coming while the backlog drains."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.models import make_heavy
from streamfer_dev.harness import (
    WorkerProcess,
    pipeline_toml,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import scrape_metrics, services_toml, wait_committed_to_end

pytestmark = pytest.mark.integration

BACKLOG = 20_000
LIVE_RATE = 100.0
"""Interactive requests per second."""


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    """The benchmarks' MLP (1024-1024-1024-512): tens of milliseconds per 256-row batch,
    so the bulk pipeline keeps the model busy. Trained once, then cached."""
    return make_heavy(tmp_path_factory.mktemp("heavy") / "mlp.onnx")


@dataclass(frozen=True)
class Result:
    id: str
    request_ts_ms: int
    ts_ms: int
    partition: int
    source: tuple[int, int]
    """The request's partition and offset."""

    @property
    def latency_ms(self) -> int:
        return self.ts_ms - self.request_ts_ms


def read_results(bootstrap: str, topic: str, expected: set[str], timeout: float) -> list[Result]:
    """Every result on ``topic``, from the start, until each expected id has one."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"lanes-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    out: list[Result] = []
    pending = set(expected)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                doc = orjson.loads(msg.value() or b"null")
                headers = dict(msg.headers() or [])
                source = (
                    int(headers["streamfer.source_partition"]),
                    int(headers["streamfer.source_offset"]),
                )
                out.append(
                    Result(
                        doc["id"], doc["request_ts_ms"], msg.timestamp()[1], msg.partition(), source
                    )
                )
                pending.discard(doc["id"])
    finally:
        consumer.close()
    return out


def lane(name: str, priority: str, topics: Topics, model: DemoModel, batch: dict[str, Any]) -> str:
    return pipeline_toml(
        name=name,
        priority=priority,
        request_topic=topics.requests,
        result_topic=topics.results,
        dead_letter_topic=topics.dead_letters,
        model_path=model.path,
        model_name=model.path.stem,
        fields=model.fields,
        batch={"max_wait_ms": 5, **batch},
    )


def requests(
    prefix: str, entities: list[str], n: int | None = None
) -> Iterator[tuple[str, bytes, bytes]]:
    """Requests ``<prefix>0``, ``<prefix>1`` ... (``n`` of them, or without end)."""
    i = 0
    while n is None or i < n:
        entity = entities[i % len(entities)]
        rid = f"{prefix}{i}"
        yield rid, entity.encode(), orjson.dumps({"id": rid, "entity": entity})
        i += 1


def test_an_interactive_pipeline_keeps_flowing_while_a_bulk_backlog_drains(
    kafka_bootstrap: str,
    redis_url: str,
    model: DemoModel,
    heavy: DemoModel,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    """Without lanes (one FIFO), the interactive requests wait behind the backlog the
    consumer has fetched ahead of them: their p99 latency was about the whole drain."""
    live, bulk = fresh_topics(2), fresh_topics(4)
    port = free_port()
    config = tmp_path / "lanes.toml"
    config.write_text(
        services_toml(
            bootstrap=kafka_bootstrap, group=live.group, redis_url=redis_url, metrics_port=port
        )
        + lane("live", "interactive", live, model, {"mode": "adaptive", "max_batch_size": 32})
        + lane("bulk", "bulk", bulk, heavy, {"max_batch_size": 256, "max_wait_ms": 20})
    )
    produce_requests(kafka_bootstrap, bulk.requests, requests("b", entities, BACKLOG))
    bulk_ids = {f"b{i}" for i in range(BACKLOG)}
    live_ids: list[str] = []
    stop = threading.Event()

    def trickle() -> None:
        def until_stopped() -> Iterator[tuple[str, bytes, bytes]]:
            for item in requests("l", entities):
                if stop.is_set():
                    return
                live_ids.append(item[0])
                yield item

        produce_requests(kafka_bootstrap, live.requests, until_stopped(), rate=LIVE_RATE)

    worker = WorkerProcess(config, tmp_path / "worker.log")
    producer = threading.Thread(target=trickle, daemon=True)
    try:
        # interactive requests are waiting when the worker joins, so their results can
        # flow from the drain's first second (a trickle started after the assignment
        # could miss it)
        producer.start()
        worker.start()
        wait_for_assignment([worker], 6, timeout=90)
        bulk_results = read_results(kafka_bootstrap, bulk.results, bulk_ids, timeout=240)
        time.sleep(1.0)  # interactive requests after the backlog, too
        stop.set()
        producer.join(30)
        live_results = read_results(kafka_bootstrap, live.results, set(live_ids), timeout=60)
        for topic in (bulk.requests, live.requests):
            wait_committed_to_end(kafka_bootstrap, live.group, topic, timeout=30)
        metrics = scrape_metrics(port)
    finally:
        stop.set()
        code = worker.terminate()
    assert code == 0, worker.log_text()[-3000:]

    for results, expected in ((bulk_results, bulk_ids), (live_results, set(live_ids))):
        seen = [r.id for r in results]
        assert set(seen) == expected, f"{len(expected - set(seen))} requests without a result"
        assert len(seen) == len(expected), "a request was answered twice"
        # within each result partition, one request partition's results in its order
        offsets: dict[tuple[int, int], list[int]] = {}
        for r in results:
            offsets.setdefault((r.partition, r.source[0]), []).append(r.source[1])
        assert all(seq == sorted(seq) for seq in offsets.values())

    first = min(r.ts_ms for r in bulk_results)
    last = max(r.ts_ms for r in bulk_results)
    drain_ms = last - first
    during = sorted(r.latency_ms for r in live_results if first <= r.request_ts_ms <= last)
    assert len(during) >= LIVE_RATE * drain_ms / 1000 * 0.5, "the trickle ran through the drain"
    p99 = during[int(len(during) * 0.99)]
    assert p99 < drain_ms / 3, f"interactive p99 {p99} ms over a drain of {drain_ms} ms"
    published = Counter((r.ts_ms - first) // 1000 for r in live_results if first <= r.ts_ms)
    quiet = [s for s in range(drain_ms // 1000) if not published[s]]
    assert not quiet, f"no interactive result in seconds {quiet} of the {drain_ms} ms drain"

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    assert value("streamfer_pipeline_priority", pipeline="live") == 10
    assert value("streamfer_pipeline_priority", pipeline="bulk") == -10
    for p in ("live", "bulk"):
        batches = value("streamfer_batches_total", pipeline=p)
        for stage in ("decode", "infer", "publish"):
            waits = value("streamfer_stage_wait_seconds_count", pipeline=p, stage=stage)
            assert waits == batches, (p, stage)
        assert value("streamfer_in_flight_records", pipeline=p) == 0
    assert value("streamfer_in_flight_share_held", pipeline="bulk") == 0
