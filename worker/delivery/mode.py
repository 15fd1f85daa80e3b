"""Delivery modes: how a batch's results become durable and its offsets committed.

The worker's loop drives a ``Delivery`` and never asks which mode it runs: the strategy
owns enqueueing a closed batch, serving delivery reports, committing, and (exactly-once)
abort, rewind and seek. ``AtLeastOnce`` here commits a batch's offsets once every
result and dead letter of it and of every earlier batch is acknowledged, and
dead-letters the records the broker refuses for themselves on the way;
``worker.delivery.exactly_once.Transactional`` puts results, dead letters and offsets in one
Kafka transaction. Every method of a ``Delivery`` runs on the loop thread; what the
processing threads ask of the mode is its ``BatchGate``, made before the threads and the
mode, which both are given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from worker.core import Deadline, DeliveryTracker, Job, PartitionKey
from worker.delivery.committer import Committer
from worker.delivery.metrics import DeliveryFamilies
from worker.delivery.refused import RefusedRecords, RefusingPipeline
from worker.errors import CommitError
from worker.kafka import Sink
from worker.pipeline import PipelineMetrics

__all__ = [
    "AtLeastOnce",
    "BatchGate",
    "BatchThreads",
    "DeliveringPipeline",
    "Delivery",
    "ReportPolling",
    "Stages",
    "commit_before_leaving",
]

log = logging.getLogger(__name__)


class BatchThreads(Protocol):
    """The processing threads, as a delivery mode drives them (``StageThreads``)."""

    def submit(self, job: Job) -> None:
        """Hand a closed batch to the first stage."""
        ...

    def pending(self) -> int:
        """Batches queued or running."""
        ...

    def unfinished(self) -> list[Job]:
        """Batches handed over and not finished yet, in order."""
        ...

    def discard_queued(self) -> list[Job]:
        """Take back the batches no stage has started."""
        ...

    def check(self) -> None:
        """Raise what a processing thread stopped with."""
        ...


class BatchGate(Protocol):
    """What the processing threads ask of the delivery mode as a batch goes through them."""

    def stale(self, job: Job) -> bool:
        """Whether ``job`` must not be produced (a rewind came after it)."""
        ...

    def acknowledge(self) -> None:
        """Serve delivery reports from a processing thread, when the mode allows it."""
        ...


class ReportPolling:
    """At-least-once's gate: no batch is ever stale, and the publish thread serves the
    reports of earlier batches (they only count; refused records wait for the loop)."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def stale(self, job: Job) -> bool:
        return False

    def acknowledge(self) -> None:
        self._sink.poll(0)


class DeliveringPipeline(RefusingPipeline, Protocol):
    """What a delivery mode needs of a pipeline (``Pipeline``): its metrics, and the
    dead letter of a record the broker refused for itself (``RefusingPipeline``)."""

    metrics: PipelineMetrics


@dataclass(frozen=True, slots=True)
class Stages:
    """What a delivery mode shares with the worker that drives it."""

    sink: Sink
    threads: BatchThreads
    committer: Committer
    pipelines: Mapping[str, DeliveringPipeline]
    metrics: DeliveryFamilies


class Delivery(Protocol):
    """The delivery mode the worker's loop drives (loop thread)."""

    def tracker(self, pipeline: str, oldest_ts_ms: int) -> DeliveryTracker:
        """The tracker of a new batch."""
        ...

    def enqueue(self, job: Job) -> None:
        """Take a closed batch: it is tracked for commit and handed to the stages."""
        ...

    def records_in_flight(self) -> int:
        """What a crash now would make the group consume again: the worker's bound."""
        ...

    def records_of(self, pipeline: str) -> int:
        """``records_in_flight`` of one pipeline's batches: its share of the bound."""
        ...

    def serve(self, timeout: float) -> None:
        """Serve delivery reports, waiting up to ``timeout`` (loop thread)."""
        ...

    def commit(self, *, asynchronous: bool = True) -> None:
        """Commit what is delivered; synchronously (before partitions leave) also every
        offset not confirmed yet. Raises SinkError when a delivery failed for good."""
        ...

    def settled(self) -> bool:
        """Whether every commit made so far is confirmed by the broker."""
        ...

    def finish(self, deadline: Deadline, *, at_least_s: float) -> None:
        """Make everything produced so far durable (a revoke, a drain), by ``deadline``."""
        ...

    def revoked(self, partitions: set[PartitionKey]) -> None:
        """Partitions revoked after ``finish`` and a synchronous ``commit``."""
        ...

    def lost(self, partitions: set[PartitionKey]) -> None:
        """Partitions lost without a chance to commit."""
        ...

    def close(self, timeout: float) -> None:
        """The worker is stopping: wait up to ``timeout`` for what is still outstanding."""
        ...


def commit_delivered(stages: Stages, *, asynchronous: bool, count: bool) -> None:
    """``Committer.commit_ready`` with its metrics; ``count`` counts the commits sent to
    the broker as consumer commits (a transaction counts its own)."""
    committer, metrics = stages.committer, stages.metrics
    started = time.perf_counter()
    before = committer.commits_sent
    try:
        if asynchronous:
            done = committer.commit_ready(asynchronous=True)
        else:
            done = committer.commit_unconfirmed()
            if not committer.confirmed_all():  # the broker refused some partitions
                metrics.commit_failures.inc()
    except CommitError:
        metrics.commit_failures.inc()
        raise
    if done:
        metrics.in_flight_batches.set(len(committer))
    sent = committer.commits_sent - before
    if sent and count:
        metrics.commits.inc(sent)
        elapsed = time.perf_counter() - started
        for p in stages.pipelines.values():
            p.metrics.commit_seconds.observe(elapsed)


class AtLeastOnce:
    """Commits each batch's offsets after its deliveries; a crash repeats what was in
    flight, never skips. Records the broker refuses for themselves are dead-lettered by
    the loop thread before their batch can commit (``RefusedRecords``)."""

    def __init__(self, stages: Stages) -> None:
        self._stages = stages
        self._sink = stages.sink
        self.committer = stages.committer
        self._refused = RefusedRecords(stages.sink, stages.pipelines)

    def tracker(self, pipeline: str, oldest_ts_ms: int) -> DeliveryTracker:
        return self._refused.tracker(pipeline, oldest_ts_ms)

    def enqueue(self, job: Job) -> None:
        self.committer.track(job)
        self._stages.threads.submit(job)
        self._stages.metrics.in_flight_batches.set(len(self.committer))

    def records_in_flight(self) -> int:
        return self.committer.records

    def records_of(self, pipeline: str) -> int:
        return self.committer.records_of(pipeline)

    def serve(self, timeout: float) -> None:
        self._refused.serve(timeout)

    def commit(self, *, asynchronous: bool = True) -> None:
        commit_delivered(self._stages, asynchronous=asynchronous, count=True)

    def settled(self) -> bool:
        return self.committer.confirmed_all()

    def finish(self, deadline: Deadline, *, at_least_s: float) -> None:
        """Wait for every outstanding delivery, dead-lettering what the broker refuses on
        the way (those dead letters are deliveries too)."""
        self._refused.finish(deadline, at_least_s=at_least_s)

    def revoked(self, partitions: set[PartitionKey]) -> None:
        self.committer.forget(partitions)

    def lost(self, partitions: set[PartitionKey]) -> None:
        self.committer.forget(partitions)

    def close(self, timeout: float) -> None:
        self._sink.flush(timeout)


def commit_before_leaving(
    delivery: Delivery, deadline: Deadline, serve_rebalance: Callable[[], None]
) -> None:
    """The last commit of a clean stop. The broker refuses it while the group
    rebalances (another member joins or leaves at the same moment, as when two are
    scaled in together); then ``serve_rebalance`` (every partition paused so nothing new
    is fetched) and commit again until the shutdown ``deadline``: a clean
    stop repeats nothing."""
    while True:
        try:
            delivery.commit(asynchronous=False)
            if delivery.settled():
                return
            refusal = "the broker refused some partitions"
        except CommitError as exc:
            refusal = str(exc)
        if deadline.passed():
            raise CommitError(
                f"the last commit was refused until the shutdown deadline ({refusal}); "
                "the next owners repeat what it covered"
            )
        log.info("last commit refused (%s); serving the rebalance, then again", refusal)
        serve_rebalance()
