"""What adaptive batching hands to the processing threads, and when: a record goes the
moment the model is idle, and records gather into one batch only while it is busy."""

from __future__ import annotations

from typing import Any

import pytest

from streamfer_dev.modelgen import DemoModel
from tests.fakes import worker as fakes
from tests.fakes.worker import TOPIC, build_worker, turn_until
from worker.config import BatchPolicy
from worker.core import Job


def adaptive(**kw: Any) -> BatchPolicy:
    """A window far longer than the test: only the model's being idle closes a batch."""
    return BatchPolicy(**{**kw, "mode": "adaptive", "max_wait_ms": 60_000})


def test_adaptive_batches_follow_the_model_not_the_window(
    classifier: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fakes, "BatchPolicy", adaptive)
    worker, consumer, sink, store = build_worker(classifier, batch=256, in_flight=4)
    handed: list[int] = []
    enqueue = worker.group._delivery.enqueue

    def record(job: Job) -> None:
        handed.append(job.records)
        enqueue(job)

    worker.group._delivery.enqueue = record  # type: ignore[method-assign]
    consumer.assign((TOPIC, 0))
    turn_until(worker, lambda: bool(consumer.owned))

    consumer.produce(0, 1)
    turn_until(worker, lambda: handed == [1])
    assert len(worker.group._batchers["p"]) == 0, "a lone record goes to an idle model at once"
    turn_until(worker, lambda: len(sink.delivered_to("res")) == 1)

    store.gate.clear()  # the next batch stays in its stage: the model is busy
    consumer.produce(0, 1)
    turn_until(worker, lambda: handed == [1, 1])
    consumer.produce(0, 3)
    for _ in range(30):
        worker.run_once()
    assert handed == [1, 1], "while the model is busy, records wait for it"
    assert len(worker.group._batchers["p"]) == 3

    store.gate.set()
    turn_until(worker, lambda: handed == [1, 1, 3])
    turn_until(worker, lambda: len(sink.delivered_to("res")) == 5)
    assert [r["id"] for r in sink.delivered_to("res")] == [f"r0-{i}" for i in range(5)]


def test_records_waiting_for_a_busy_model_are_looked_at_every_millisecond(
    classifier: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing wakes the loop's fetch when the model finishes, so how long the fetch waits
    while records wait is how late they may go to the idle model: the p99 of the latency
    setting was the median plus about 5 ms while that wait was 5 ms."""
    monkeypatch.setattr(fakes, "BatchPolicy", adaptive)
    worker, consumer, _sink, store = build_worker(classifier, batch=256, in_flight=4)
    consumer.assign((TOPIC, 0))
    turn_until(worker, lambda: bool(consumer.owned))
    store.gate.clear()  # the model is busy with the first record
    consumer.produce(0, 1)
    turn_until(worker, lambda: worker.group._threads.pending() == 1)
    consumer.produce(0, 2)
    turn_until(worker, lambda: len(worker.group._batchers["p"]) == 2)
    consumer.timeouts.clear()
    for _ in range(10):
        worker.run_once()
    assert consumer.timeouts and max(consumer.timeouts) <= 0.001, consumer.timeouts
    store.gate.set()
    turn_until(worker, lambda: len(worker.group._batchers["p"]) == 0)


def test_in_flight_counts_what_is_not_delivered_yet(
    classifier: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the bound counts is what is really unfinished: a delivered batch stops
    counting at once, before its offsets are committed or the commit answered."""
    monkeypatch.setattr(fakes, "BatchPolicy", adaptive)
    worker, consumer, sink, store = build_worker(classifier, batch=256, in_flight=4)
    consumer.assign((TOPIC, 0))
    turn_until(worker, lambda: bool(consumer.owned))
    store.gate.clear()
    consumer.produce(0, 2)
    turn_until(worker, lambda: worker.group._delivery.records_in_flight() == 2)
    store.gate.set()
    turn_until(worker, lambda: len(sink.delivered_to("res")) == 2)
    turn_until(worker, lambda: worker.group._delivery.records_in_flight() == 0)
    assert consumer.group_offsets == {}, "no commit answered yet: the count did not wait"
