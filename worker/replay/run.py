"""A replay's run on the live worker's engine.

The same stage threads (``worker.loop.threads``, ``worker.loop.stages``), the same delivery mode
(``worker.delivery.mode.AtLeastOnce``: a batch commits after its deliveries, and a record the
broker refuses for itself becomes its request's dead letter) and the same committer as
``streamfer run``. What is a replay's own is the source and the checkpoint cadence: it
reads with ``assign()`` (never joining the live group, never touching its offsets), stops
each partition at its planned end, takes at most ``--max-rate`` records a second, and
commits its delivered prefix synchronously every ``checkpoint_interval_s`` to its own
group, so a killed replay resumed with ``--resume ID`` repeats at most its unconfirmed
tail and leaves no gap. Every record it publishes carries a ``streamfer.replay_id``
header so consumers can tell replayed results apart and dedupe.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from typing import Protocol, cast

from confluent_kafka import KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from worker.config import BatchPolicy
from worker.core import Clock, Deadline, DeliveryTracker, Job, PartitionKey, monotonic_clock
from worker.delivery import (
    AtLeastOnce,
    Committer,
    DeliveryFamilies,
    OffsetConsumer,
    ReportPolling,
    Stages,
)
from worker.errors import SinkError, StreamferError
from worker.kafka import Sink, end_of_partition
from worker.loop import Batcher, BatchSteps, StageThreads
from worker.pipeline import Pipeline
from worker.replay.pace import Progress, RateLimiter
from worker.replay.plan import ReplayPlan

__all__ = ["REPLAY_ID_HEADER", "Replay", "ReplayConsumer", "ReplaySink"]

log = logging.getLogger(__name__)

REPLAY_ID_HEADER = "streamfer.replay_id"


class ReplaySink(Sink):
    """The live ``Sink`` plus a ``streamfer.replay_id`` header on every record; counts
    each batch's results and dead letters (``outcomes``, by tracker) for the summary."""

    def __init__(self, producer: Producer, replay_id: str, dead_letter_topic: str) -> None:
        stamp = (REPLAY_ID_HEADER, replay_id.encode())
        super().__init__(producer, stamp=stamp, on_queued=self._count)
        self._dead_letter_topic = dead_letter_topic
        self.outcomes: dict[int, list[int]] = {}
        """id(tracker) -> [results, dead letters] of a batch not retired yet."""

    def _count(self, tracker: DeliveryTracker, topic: str) -> None:
        counts = self.outcomes.setdefault(id(tracker), [0, 0])
        if topic != self._dead_letter_topic:
            counts[0] += 1
        else:
            counts[1] += 1
            if tracker.sealed:
                # sent after its batch was published: the dead letter of a result the
                # broker refused (dead letters are cut to fit), which is no result now
                counts[0] -= 1


class ReplayConsumer(OffsetConsumer, Protocol):
    """The part of ``confluent_kafka.Consumer`` a replay uses (a fake in unit tests)."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int, timeout: float) -> list[Message]: ...


class Replay:
    """Reads the plan's ranges from ``positions`` on and runs them through ``pipeline``
    on the worker's engine. ``stop`` is safe from signal handlers. ``run`` blocks until
    every partition reached its end or ``stop``; it raises the ``StreamferError`` that
    ended it (``SinkError`` for a failed delivery, ``FeatureStoreError`` after retries,
    ``CommitError``), leaving the checkpoint at the last delivered batch."""

    def __init__(
        self,
        *,
        plan: ReplayPlan,
        positions: dict[PartitionKey, int],
        consumer: ReplayConsumer,
        sink: ReplaySink,
        pipeline: Pipeline,
        batch: BatchPolicy,
        max_in_flight_batches: int = 4,
        poll_timeout_s: float = 0.1,
        checkpoint_interval_s: float = 1.0,
        shutdown_timeout_s: float = 30.0,
        limiter: RateLimiter | None = None,
        progress: Progress | None = None,
        abort: threading.Event | None = None,
        metrics: DeliveryFamilies | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        """``abort`` is the pipeline's: set when the replay fails, so a batch waiting for
        the feature store gives up at once."""
        self.plan = plan
        self._positions = dict(positions)
        self._ends = {r.key: r.end for r in plan.ranges}
        self._consumer = consumer
        self._sink = sink
        self._pipeline = pipeline
        self._policy = batch
        self._bound = max_in_flight_batches
        self._poll_s = poll_timeout_s
        self._interval = checkpoint_interval_s
        self._shutdown_s = shutdown_timeout_s
        self._limiter = limiter
        self._progress = progress
        self._abort = abort or threading.Event()
        self._clock = clock
        self._committer = Committer(consumer, on_done=self._retired)
        steps = BatchSteps({pipeline.name: pipeline}, sink, ReportPolling(sink))
        self._threads = StageThreads(steps, name="replay")
        stages = Stages(
            sink,
            self._threads,
            self._committer,
            {pipeline.name: pipeline},
            metrics or DeliveryFamilies(CollectorRegistry()),
        )
        self._delivery = AtLeastOnce(stages)
        self._open: dict[int, int] = {}
        """id(tracker) -> records, of every batch read and not checkpointed yet."""
        self._unacknowledged: deque[DeliveryTracker] = deque()
        self._stop = threading.Event()
        self.records = 0
        self.checkpointed = 0
        self.results = 0
        self.dead_letters = 0
        self.per_partition: dict[PartitionKey, int] = dict.fromkeys(self._ends, 0)
        self.finished: set[PartitionKey] = {k for k, e in self._ends.items() if positions[k] >= e}
        self.checkpoints: dict[PartitionKey, int] = dict(positions)

    def stop(self) -> None:
        """Finish the batches already read, checkpoint them and return from ``run``."""
        self._stop.set()

    @property
    def complete(self) -> bool:
        return len(self.finished) == len(self._ends) and not self._open

    def run(self) -> None:
        active = sorted(set(self._ends) - self.finished)
        if active:
            self._consumer.assign(
                [TopicPartition(t, p, self._positions[(t, p)]) for t, p in active]
            )
        batcher: Batcher[Message] = Batcher(self._policy, self._clock)
        try:
            self._loop(set(active), batcher)
            self._drain(batcher)
        except BaseException:
            self._abort.set()
            self._salvage()
            raise
        finally:
            self._abort.set()
            self._threads.close(5.0)

    def _loop(self, active: set[PartitionKey], batcher: Batcher[Message]) -> None:
        consumer, clock, limiter = self._consumer, self._clock, self._limiter
        delivery, threads = self._delivery, self._threads
        max_messages = self._policy.max_batch_size
        next_checkpoint = clock() + self._interval
        while active and not self._stop.is_set():
            threads.check()
            fetch_started = clock()
            deadline = batcher.deadline()
            timeout = self._poll_s if deadline is None else max(0.0, deadline - fetch_started)
            timeout = min(timeout, self._poll_s)
            wanted = max_messages if limiter is None else limiter.allowance(max_messages)
            if wanted > 0:
                messages = consumer.consume(wanted, timeout)
            else:
                messages = []
                assert limiter is not None
                delivery.serve(min(timeout, limiter.wait_s()))
            keep = self._in_range(messages, active)
            if limiter is not None:
                limiter.take(len(keep))
            self.records += len(keep)
            for batch in batcher.add(keep, fetch_started):
                self._submit(batch)
            expired = batcher.expired()
            if expired is not None:
                self._submit(expired)
            delivery.serve(0)
            while self._in_flight() >= self._bound and not self._stop.is_set():
                threads.check()
                delivery.serve(0.005)
            if clock() >= next_checkpoint:
                self._checkpoint()
                next_checkpoint = clock() + self._interval
            if self._progress is not None:
                self._progress.update(self.records)

    def _in_range(self, messages: list[Message], active: set[PartitionKey]) -> list[Message]:
        """The records inside the plan; a partition is finished at its end (or EOF there)."""
        ends, counts = self._ends, self.per_partition
        keep: list[Message] = []
        for msg in messages:
            err = msg.error()
            key = (cast(str, msg.topic()), cast(int, msg.partition()))
            offset = cast(int, msg.offset())
            if err is not None:
                if end_of_partition(err, log) and key in active and offset >= ends[key]:
                    self._finish(key, active)
                continue
            if key not in active or offset >= ends[key]:
                if key in active:
                    self._finish(key, active)
                continue
            keep.append(msg)
            counts[key] += 1
            if offset + 1 >= ends[key]:
                self._finish(key, active)
        return keep

    def _finish(self, key: PartitionKey, active: set[PartitionKey]) -> None:
        active.discard(key)
        self.finished.add(key)
        self._consumer.pause([TopicPartition(key[0], key[1])])

    def _submit(self, batch: list[Message]) -> None:
        job = Job.close(self._pipeline.name, batch, self._delivery.tracker)
        self._open[id(job.tracker)] = len(batch)
        self._unacknowledged.append(job.tracker)
        self._delivery.enqueue(job)

    def _in_flight(self) -> int:
        """Batches whose deliveries are not all reported yet."""
        waiting = self._unacknowledged
        while waiting and waiting[0].done:
            waiting.popleft()
        return sum(1 for t in waiting if not t.done)

    def _retired(self, tracker: DeliveryTracker) -> None:
        """A batch delivered in full, about to be checkpointed (the committer's ``on_done``)."""
        self.checkpointed += self._open.pop(id(tracker), 0)
        results, dead_letters = self._sink.outcomes.pop(id(tracker), (0, 0))
        self.results += results
        self.dead_letters += dead_letters

    def _checkpoint(self) -> None:
        """Commit every leading batch whose deliveries all succeeded (synchronously)."""
        self._delivery.serve(0)
        self._delivery.commit(asynchronous=False)
        self.checkpoints.update(self._committer.committed())

    def _drain(self, batcher: Batcher[Message]) -> None:
        rest = batcher.flush()
        if rest:
            self._submit(rest)
        deadline = Deadline.after(self._shutdown_s)
        threads, delivery = self._threads, self._delivery

        def serve() -> None:
            threads.check()
            delivery.serve(0.01)

        deadline.wait(lambda: not threads.pending(), serve)
        threads.check()
        delivery.finish(deadline, at_least_s=1.0)
        self._checkpoint()
        if self._open:
            raise SinkError(
                f"{len(self._open)} batches unconfirmed after {self._shutdown_s:.0f}s; "
                "a resume reads them again"
            )
        if self._progress is not None:
            self._progress.finish(self.records)
        # Partitions whose range is done are checkpointed at their end, past any
        # transaction markers after their last record, so a resume knows they are done.
        final = {
            k: self._ends[k] for k in self.finished if self.checkpoints.get(k, -1) < self._ends[k]
        }
        if final:
            parts = [TopicPartition(t, p, o) for (t, p), o in sorted(final.items())]
            self._consumer.commit(offsets=parts, asynchronous=False)
            self.checkpoints.update(final)

    def _salvage(self) -> None:
        """After a failure: checkpoint what was delivered, so a resume repeats less."""
        with contextlib.suppress(StreamferError, KafkaException):
            self._sink.flush(min(5.0, self._shutdown_s))
            self._checkpoint()
